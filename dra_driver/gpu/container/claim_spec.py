"""What a claim's containers receive: the CDI spec built from its allocated devices (pure).

One spec per claim, kind ``k8s.gpu.dra.dev/claim``, one CDI device per allocated device named
``<claimUID>-<deviceName>`` (never reused: runtimes cache specs by name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.cdi.spec import (
    NO_EDITS,
    ContainerEdits,
    Device,
    Mount,
    Spec,
    qualified_name,
)
from dra_driver.gpu.allocation import AllocatedDevice
from dra_driver.gpu.config import mps_config
from dra_driver.gpu.container import devnodes
from dra_driver.gpu.sharing.mps import mps_limit

CDI_VENDOR = "k8s.gpu.dra.dev"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"

#: Device nodes every CUDA process needs besides its GPUs'.
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
MPS_PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
MPS_SHM_IN_CONTAINER = "/dev/shm"

# Layout of /proc/driver/nvidia-caps/mig-minors: after "config" (1) and "monitor" (2), each GPU
# has 15 GPU instances with one access minor each followed by 8 compute-instance minors.
_GIS_PER_GPU = 15
_CIS_PER_GI = 8


def cdi_device_name(claim_uid: str, device_name: str, share_id: str | None = None) -> str:
    """``<claimUID>-<deviceName>``, with ``-<shareID>`` for a share of a shared GPU."""
    name = f"{claim_uid}-{device_name}"
    return f"{name}-{share_id}" if share_id else name


def cdi_device_id(claim_uid: str, device_name: str, share_id: str | None = None) -> str:
    """The fully qualified CDI ID returned to the kubelet."""
    return qualified_name(CDI_KIND, cdi_device_name(claim_uid, device_name, share_id))


def mig_cap_minors(
    gpu_minor: int, gi: int, ci: int, table: Mapping[str, int] | None = None
) -> tuple[int, int]:
    """nvidia-caps minors granting access to a GPU instance and its compute instance.

    ``table`` is the parsed ``/proc/driver/nvidia-caps/mig-minors`` when the host has it; the
    computed layout is the one that file describes.
    """
    gi_key, ci_key = f"gpu{gpu_minor}/gi{gi}/access", f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"
    if table is not None and gi_key in table and ci_key in table:
        return table[gi_key], table[ci_key]
    gi_minor = 3 + gpu_minor * _GIS_PER_GPU * (1 + _CIS_PER_GI) + gi * (1 + _CIS_PER_GI)
    return gi_minor, gi_minor + 1 + ci


def parse_mig_minors(text: str) -> dict[str, int]:
    """Parse the ``mig-minors`` file: ``<name> <minor>`` per line."""
    table: dict[str, int] = {}
    for line in text.splitlines():
        name, _, minor = line.strip().partition(" ")
        if minor.strip().isdigit():
            table[name] = int(minor)
    return table


def _device_edits(
    device: AllocatedDevice,
    mig_minors: Mapping[str, int] | None,
    resolve: devnodes.Resolver,
    mps: ContainerEdits,
) -> ContainerEdits:
    nodes = [resolve(f"/dev/nvidia{device.gpu.minor}")]
    if device.mig is not None:
        gi_minor, ci_minor = mig_cap_minors(
            device.gpu.minor, device.mig.gpu_instance_id, device.mig.compute_instance_id, mig_minors
        )
        nodes += [
            resolve(f"/dev/nvidia-caps/nvidia-cap{gi_minor}"),
            resolve(f"/dev/nvidia-caps/nvidia-cap{ci_minor}"),
        ]
    return ContainerEdits(env=mps.env, device_nodes=tuple(nodes), mounts=mps.mounts)


def _mps_edits(
    devices: Sequence[AllocatedDevice], mps_host_dir: str, mps_shm_dir: str | None
) -> ContainerEdits:
    """MPS client settings for the claim's devices that asked for MPS or are shares of a
    shared GPU, in CUDA's units; the daemon's pipe (and shm) directories mounted."""
    env = [f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}"]
    # A client sees the GPUs its daemon serves (the daemon's CUDA_VISIBLE_DEVICES, in claim
    # order), numbered from 0: the limits are keyed by that number, not the claim index.
    served: list[str] = []
    limits: dict[int, int] = {}
    # The scheduler counted each share's compute against the GPU's 100: a claim's shares add
    # up, and one without a limit (0) leaves the claim's clients unlimited.
    shares = [d.share for d in devices if d.share is not None]
    percentage: int | None = None
    if shares and all(s.thread_percentage for s in shares):
        percentage = min(100, sum(s.compute_percent or 0 for s in shares))

    def client_ordinal(uuid: str) -> int:
        if uuid not in served:
            served.append(uuid)
        return served.index(uuid)

    for index, device in enumerate(devices):
        if device.share is not None:
            # A share's limits are what the scheduler counted for it (a claim's shares of
            # one GPU add up).
            ordinal = client_ordinal(device.uuid)
            limits[ordinal] = limits.get(ordinal, 0) + device.share.memory_bytes
            continue
        if device.strategy != "MPS":
            continue
        ordinal = client_ordinal(device.uuid)
        mps = mps_config(device.config)
        if mps is None:
            continue
        limit = mps.pinned_limit(index, device.uuid)  # config keys count the claim's devices
        if limit is not None:
            limits[ordinal] = limit
        if mps.default_active_thread_percentage is not None:
            percentage = mps.default_active_thread_percentage
    if percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percentage}")
    if limits:
        pinned = ",".join(f"{o}={mps_limit(n)}" for o, n in sorted(limits.items()))
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={pinned}")
    mounts = [
        Mount(host_path=mps_host_dir, container_path=MPS_PIPE_IN_CONTAINER, options=("rbind", "rw"))
    ]
    if mps_shm_dir is not None:
        shm = Mount(
            host_path=mps_shm_dir, container_path=MPS_SHM_IN_CONTAINER, options=("rbind", "rw")
        )
        mounts.append(shm)
    return ContainerEdits(env=tuple(env), mounts=tuple(mounts))


def _without_names(env: Sequence[str], overriding: Sequence[str]) -> tuple[str, ...]:
    """``env`` without the variables ``overriding`` sets.

    The runtime keeps the last value of a name, so a common value (nvidia-ctk's
    ``NVIDIA_VISIBLE_DEVICES=void``) listed after the claim's would replace it; dropped, the
    spec states each name once."""
    names = {entry.partition("=")[0] for entry in overriding}
    return tuple(entry for entry in env if entry.partition("=")[0] not in names)


def _mps_client(device: AllocatedDevice) -> bool:
    """Whether the device is configured for MPS or is a share of a shared GPU."""
    return device.share is not None or device.strategy == "MPS"


def uses_mps(devices: Sequence[AllocatedDevice]) -> bool:
    """Whether any device of the claim is configured for MPS or is a share of a shared GPU."""
    return any(_mps_client(d) for d in devices)


def build_claim_spec(
    claim_uid: str,
    devices: Sequence[AllocatedDevice],
    *,
    common: ContainerEdits = NO_EDITS,
    mig_minors: Mapping[str, int] | None = None,
    mps_host_dir: str | None = None,
    device_nodes: devnodes.Resolver = devnodes.plain,
    mps_shm_dir: str | None = None,
) -> Spec:
    """The claim's CDI spec.

    Claim-wide edits: the control device nodes, ``NVIDIA_VISIBLE_DEVICES`` with the UUIDs of
    all the claim's devices (a container only gets the device nodes of the requests it uses,
    so CUDA cannot open the others), and ``common`` edits (driver libraries and hooks
    generated by nvidia-ctk, when installed); the claim's own variables replace ``common``'s
    of the same name. MPS settings are edits of the devices that use the daemon: an MPS
    client sees only the daemon's GPUs, so a container given only the claim's other devices
    must not become one.
    """
    env = [f"NVIDIA_VISIBLE_DEVICES={','.join(d.uuid for d in devices)}"]
    mps = NO_EDITS
    if uses_mps(devices) and mps_host_dir is not None:
        mps = _mps_edits(devices, mps_host_dir, mps_shm_dir)
    claim_edits = ContainerEdits(
        env=(*_without_names(common.env, env), *env),
        device_nodes=tuple([device_nodes(p) for p in CONTROL_NODES] + list(common.device_nodes)),
        mounts=common.mounts,
        hooks=common.hooks,
    )
    return Spec(
        kind=CDI_KIND,
        devices=tuple(
            Device(
                name=cdi_device_name(claim_uid, d.device_name, d.share_id),
                edits=_device_edits(
                    d, mig_minors, device_nodes, mps if _mps_client(d) else NO_EDITS
                ),
            )
            for d in devices
        ),
        edits=claim_edits,
    )
