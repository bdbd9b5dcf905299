"""What a container gets for an IMEX claim: its CDI spec (pure).

A channel claim gets the domain's IMEX channel as a device node
(``/dev/nvidia-caps-imex-channels/channel<N>``: the major of ``nvidia-caps-imex-channels`` in
``/proc/devices``, minor N), or with allocation mode All every channel of the node, and the
domain in its environment. A daemon claim gets the domain in its environment; the daemon
finds its binaries in the driver root its pod mounts.
"""

from __future__ import annotations

from dra_driver.cdi.spec import ContainerEdits, Device, DeviceNode, Spec, qualified_name
from dra_driver.computedomain.api import MAX_CHANNELS
from dra_driver.computedomain.claimconfig import ImexClaim

CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
CHANNELS_DEVICE_NAME = "nvidia-caps-imex-channels"
#: The major a simulated node uses (a real one reads it from /proc/devices); beside the
#: fixed stand-ins of dra_driver.gpu.container.devnodes.
SIMULATED_MAJOR = 507


def cdi_kind(driver: str) -> str:
    """The CDI kind of the IMEX driver's claim specs."""
    return f"k8s.{driver}/claim"


def cdi_device_id(driver: str, claim_uid: str, device: str) -> str:
    """The CDI ID of one prepared IMEX device (never reused: named by the claim's UID)."""
    return qualified_name(cdi_kind(driver), f"{claim_uid}-{device}")


def imex_major(proc_devices: str) -> int | None:
    """The character device major of IMEX channels in a ``/proc/devices`` text."""
    in_chars = False
    for line in proc_devices.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_chars = stripped == "Character devices:"
            continue
        number, _, name = stripped.partition(" ")
        if in_chars and name.strip() == CHANNELS_DEVICE_NAME and number.isdigit():
            return int(number)
    return None


def channel_node(channel: int, major: int) -> DeviceNode:
    """One IMEX channel's device node, readable and writable by the container."""
    return DeviceNode(
        path=f"{CHANNEL_DIR}/channel{channel}",
        type="c",
        major=major,
        minor=channel,
        permissions="rw",
    )


def claim_spec(
    driver: str, claim_uid: str, claim: ImexClaim, domain: str, major: int | None
) -> Spec:
    """The CDI spec of one claim. ``major`` None: the node has no IMEX channels (no NVLink
    fabric): the container gets the domain's environment only, as the NVIDIA driver does."""
    env = [f"COMPUTE_DOMAIN_UID={claim.domain}", f"COMPUTE_DOMAIN={domain}"]
    nodes: tuple[DeviceNode, ...] = ()
    if claim.kind == "channel":
        channels = range(MAX_CHANNELS) if claim.all_channels else (claim.channel,)
        env.append(f"NVIDIA_IMEX_CHANNELS={'all' if claim.all_channels else claim.channel}")
        if major is not None:
            nodes = tuple(channel_node(c, major) for c in channels)
    devices = tuple(
        Device(
            name=f"{claim_uid}-{device}",
            edits=ContainerEdits(env=tuple(env), device_nodes=nodes),
        )
        for device in claim.devices
    )
    return Spec(kind=cdi_kind(driver), devices=devices)
