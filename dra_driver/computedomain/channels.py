"""What a container gets for an IMEX claim: its CDI spec (pure).

A channel claim gets the domain's IMEX channel as a device node
(``/dev/nvidia-caps-imex-channels/channel<N>``: the major of ``nvidia-caps-imex-channels`` in
``/proc/devices``, minor N), or with allocation mode All every channel of the node, and the
domain in its environment. A daemon claim gets the domain and the node's NVLink clique
(``CLIQUE_ID``, empty on a node without one) in its environment and, on a node in a clique,
the driver's ``fabric-imex-mgmt`` capability device that ``nvidia-imex`` opens
(``/dev/nvidia-caps/nvidia-cap<minor>``: the major of ``nvidia-caps`` in ``/proc/devices``,
the minor from ``/proc/driver/nvidia/capabilities/fabric-imex-mgmt``), as the NVIDIA driver
gives its daemon; the daemon finds its binaries in the driver root its pod mounts.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.cdi.spec import ContainerEdits, Device, DeviceNode, Spec, qualified_name
from dra_driver.computedomain.api import MAX_CHANNELS
from dra_driver.computedomain.claimconfig import ImexClaim
from dra_driver.computedomain.imexconfig import CLIQUE_ENV

CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
CHANNELS_DEVICE_NAME = "nvidia-caps-imex-channels"
CAPS_DIR = "/dev/nvidia-caps"
CAPS_DEVICE_NAME = "nvidia-caps"
#: The IMEX daemon's capability, below /proc/driver/nvidia/capabilities.
FABRIC_IMEX_MGMT = "driver/nvidia/capabilities/fabric-imex-mgmt"
#: The major a simulated node uses (a real one reads it from /proc/devices); beside the
#: fixed stand-ins of dra_driver.gpu.container.devnodes.
SIMULATED_MAJOR = 507


def cdi_kind(driver: str) -> str:
    """The CDI kind of the IMEX driver's claim specs."""
    return f"k8s.{driver}/claim"


def cdi_device_id(driver: str, claim_uid: str, device: str) -> str:
    """The CDI ID of one prepared IMEX device (never reused: named by the claim's UID)."""
    return qualified_name(cdi_kind(driver), f"{claim_uid}-{device}")


def capability_minor(capability: str) -> int | None:
    """The device minor in the text of a file below /proc/driver/nvidia/capabilities: its
    ``DeviceFileMinor: <N>`` line (beside ``DeviceFileMode`` and ``DeviceFileModify``)."""
    for line in capability.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None


def capability_node(major: int, minor: int) -> DeviceNode:
    """The character device of the driver capability with ``minor`` (major of nvidia-caps)."""
    return DeviceNode(
        path=f"{CAPS_DIR}/nvidia-cap{minor}", type="c", major=major, minor=minor, permissions="rw"
    )


@dataclass(frozen=True)
class DaemonEdits:
    """What the node adds to its IMEX daemon's container beyond the domain."""

    #: The node's NVLink clique ("" without one: the daemon then starts no nvidia-imex).
    clique: str = ""
    #: The fabric-imex-mgmt capability device (None: no clique, or it could not be read).
    imex_mgmt: DeviceNode | None = None


#: A node in no NVLink clique: its daemon gets an empty CLIQUE_ID and no device.
NO_CLIQUE = DaemonEdits()


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
    driver: str,
    claim_uid: str,
    claim: ImexClaim,
    domain: str,
    major: int | None,
    daemon: DaemonEdits,
) -> Spec:
    """The CDI spec of one claim. ``major`` None: the node has no IMEX channels (no NVLink
    fabric): a channel's container gets the domain's environment only, as the NVIDIA driver
    does. ``daemon``: what a daemon claim's container gets from the node."""
    env = [f"COMPUTE_DOMAIN_UID={claim.domain}", f"COMPUTE_DOMAIN={domain}"]
    nodes: tuple[DeviceNode, ...] = ()
    if claim.kind == "channel":
        channels = range(MAX_CHANNELS) if claim.all_channels else (claim.channel,)
        env.append(f"NVIDIA_IMEX_CHANNELS={'all' if claim.all_channels else claim.channel}")
        if major is not None:
            nodes = tuple(channel_node(c, major) for c in channels)
    else:
        env.append(f"{CLIQUE_ENV}={daemon.clique}")
        if daemon.imex_mgmt is not None:
            nodes = (daemon.imex_mgmt,)
    devices = tuple(
        Device(
            name=f"{claim_uid}-{device}",
            edits=ContainerEdits(env=tuple(env), device_nodes=nodes),
        )
        for device in claim.devices
    )
    return Spec(kind=cdi_kind(driver), devices=devices)
