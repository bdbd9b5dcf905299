"""Discovery of the node's GPUs through NVML (nvidia-ml-py, module ``pynvml``).

Every :meth:`NvmlDiscovery.discover` call initialises NVML, reads everything and shuts NVML
down again. NVML reference-counts init/shutdown, handles are only valid between the two,
and a fresh session picks up changes the driver made in between (MIG mode after a reset,
MIG devices created or destroyed by someone else), so nothing is cached across calls.

All NVML calls block; they run only inside ``discover``, which callers put on a worker thread
(:func:`dra_driver.gpu.discovery.base.discover_async`). Nothing here touches NVML at import time.

PCIe root and NUMA node are not in NVML's device API; they come from sysfs
(``<sysfs-root>/bus/pci/devices/<bus id>``), whose root defaults to ``$DRA_SYSFS_ROOT`` or
``/sys`` so that tests can point it at a fake tree.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import uuid as uuidlib
from pathlib import Path
from typing import Any, TypeVar

import pynvml
import structlog

from dra_driver.gpu.discovery.base import DiscoveryError
from dra_driver.gpu.discovery.nvmllib import (
    NvmlCallError,
    error_code,
    nvml_call,
    nvml_call_unless,
    nvml_init,
    nvml_shutdown,
    nvml_text,
    preload_library,
)
from dra_driver.gpu.inventory import (
    FABRIC_STATES,
    MIB,
    Fabric,
    Gpu,
    Inventory,
    MigDevice,
    MigProfile,
    MigState,
    Placement,
    format_clique,
)

T = TypeVar("T")

log = structlog.get_logger(__name__)

SYSFS_ROOT_ENV = "DRA_SYSFS_ROOT"

# nvmlBrandType_t -> the names the widely used NVIDIA DRA driver publishes as `brand`.
BRANDS: dict[int, str] = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}

# nvmlDeviceArchitecture_t -> architecture name.
ARCHITECTURES: dict[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
    0xFFFFFFFF: "Unknown",  # NVML_DEVICE_ARCH_UNKNOWN
}

# CUDA cores per streaming multiprocessor by compute capability (CUDA programming guide,
# "arithmetic instructions" throughput table: FP32 lanes per SM). NVML reports cores, not
# SMs; the SM count is cores / cores-per-SM. Exact (major, minor) entries win over the
# per-major default.
_CORES_PER_SM_EXACT: dict[tuple[int, int], int] = {
    (6, 0): 64,  # P100
    (8, 0): 64,  # A100, A30
}
_CORES_PER_SM_MAJOR: dict[int, int] = {
    3: 192,  # Kepler
    5: 128,  # Maxwell
    6: 128,  # Pascal other than P100
    7: 64,  # Volta, Turing
    8: 128,  # Ampere other than GA100 (8.6, 8.7), Ada (8.9)
    9: 128,  # Hopper
    10: 128,  # Blackwell data centre
    12: 128,  # Blackwell consumer / workstation
}
# Architectures after these keep 128 FP32 lanes per SM so far; a guess beats reporting 0.
_CORES_PER_SM_DEFAULT = 128

#: NVML errors that mean one GPU cannot be reached, not that discovery cannot work.
_UNREACHABLE = (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_NO_PERMISSION)

_PCI_ROOT = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_NVML_MIG_PREFIX = "MIG "


def cores_per_sm(major: int, minor: int) -> int:
    """CUDA cores per streaming multiprocessor for a compute capability."""
    exact = _CORES_PER_SM_EXACT.get((major, minor))
    if exact is not None:
        return exact
    return _CORES_PER_SM_MAJOR.get(major, _CORES_PER_SM_DEFAULT)


def normalize_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` as the usual sysfs/lspci form ``0000:07:00.0``."""
    text = nvml_bus_id.strip().lower()
    match = re.fullmatch(r"([0-9a-f]+):([0-9a-f]+):([0-9a-f]+)\.([0-7])", text)
    if match is None:
        raise DiscoveryError(f"NVML reported an unexpected PCI bus id {nvml_bus_id!r}")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def cuda_version_string(version: int) -> str:
    """NVML's CUDA driver version integer (``12060``) as ``"12.6"``."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def mig_profile_name(nvml_name: str) -> str:
    """``"MIG 1g.10gb+me"`` -> ``"1g.10gb+me"``: the names the inventory uses."""
    name = nvml_name.strip()
    return name.removeprefix(_NVML_MIG_PREFIX).strip()


def spans_gpu_instance(compute_slices: int, gpu_instance_slices: int) -> bool:
    """Whether a MIG device's compute instance spans its whole GPU instance, from NVML's
    device attributes (``computeInstanceSliceCount``, ``gpuInstanceSliceCount``)."""
    return compute_slices == gpu_instance_slices


def fabric_from_nvml(state: int, status: int, cluster_uuid: bytes, clique_id: int) -> Fabric:
    """A GPU's fabric from the fields of NVML's nvmlGpuFabricInfo: its registration state, and
    its clique only when registration completed successfully in a real cluster (NVML leaves
    the cluster UUID all zero on GPUs that have NVLink but no multi-node fabric)."""
    name = FABRIC_STATES[state] if 0 <= state < len(FABRIC_STATES) else "not-supported"
    clique = None
    if name == "completed" and status == pynvml.NVML_SUCCESS and len(cluster_uuid) == 16:
        clique = format_clique(str(uuidlib.UUID(bytes=cluster_uuid)), clique_id)
    return Fabric(state=name, clique=clique)


class NvmlDiscovery:
    """Discovery backend that asks the NVIDIA driver through NVML."""

    def __init__(self, sysfs_root: Path | None = None, driver_root: Path = Path("/")) -> None:
        """``sysfs_root`` defaults to ``$DRA_SYSFS_ROOT``, else ``/sys``."""
        if sysfs_root is None:
            sysfs_root = Path(os.environ.get(SYSFS_ROOT_ENV) or "/sys")
        self._sysfs_root = sysfs_root
        self._driver_root = driver_root
        self._preloaded = False

    def discover(self) -> Inventory:
        """Read the node's GPUs from NVML. Blocks; run it on a worker thread."""
        if not self._preloaded:
            preload_library(self._driver_root)
            self._preloaded = True
        nvml_init()
        try:
            return self._inventory()
        finally:
            nvml_shutdown()

    # -- whole node ------------------------------------------------------------------------

    def _inventory(self) -> Inventory:
        where = "the system"
        driver = nvml_text(nvml_call(pynvml.nvmlSystemGetDriverVersion, where=where))
        cuda = int(nvml_call(pynvml.nvmlSystemGetCudaDriverVersion, where=where))
        count = int(nvml_call(pynvml.nvmlDeviceGetCount, where=where))
        gpus: list[Gpu] = []
        for index in range(count):
            try:
                gpus.append(self._gpu(index))
            except NvmlCallError as exc:
                # A GPU that fell off the bus (or that this process may not open, which
                # nvmlDeviceGetCount still counts) is left out; the others are published.
                if exc.code not in _UNREACHABLE:
                    raise
                log.warning("GPU left out of the inventory: NVML cannot reach it", error=str(exc))
        return Inventory(
            driver_version=driver, cuda_driver_version=cuda_version_string(cuda), gpus=tuple(gpus)
        )

    # -- one GPU ---------------------------------------------------------------------------

    def _gpu(self, index: int) -> Gpu:
        where = f"GPU {index}"
        handle = nvml_call(pynvml.nvmlDeviceGetHandleByIndex, index, where=where)
        uuid = nvml_text(nvml_call(pynvml.nvmlDeviceGetUUID, handle, where=where))
        where = f"GPU {index} ({uuid})"
        major, minor = nvml_call(pynvml.nvmlDeviceGetCudaComputeCapability, handle, where=where)
        pci = nvml_call(pynvml.nvmlDeviceGetPciInfo, handle, where=where)
        bus_id = normalize_bus_id(nvml_text(pci.busId))
        pcie_root, numa_node = self._pci_topology(bus_id)
        brand = int(nvml_call(pynvml.nvmlDeviceGetBrand, handle, where=where))
        arch = int(nvml_call(pynvml.nvmlDeviceGetArchitecture, handle, where=where))
        mig, profiles, devices = self._mig(handle, uuid, where)
        return Gpu(
            uuid=uuid,
            minor=int(nvml_call(pynvml.nvmlDeviceGetMinorNumber, handle, where=where)),
            index=int(nvml_call(pynvml.nvmlDeviceGetIndex, handle, where=where)),
            product_name=nvml_text(nvml_call(pynvml.nvmlDeviceGetName, handle, where=where)),
            brand=BRANDS.get(brand, f"Unknown({brand})"),
            architecture=ARCHITECTURES.get(arch, f"Unknown({arch})"),
            cuda_compute_capability=f"{int(major)}.{int(minor)}",
            pci_bus_id=bus_id,
            pcie_root=pcie_root,
            numa_node=numa_node,
            memory_bytes=self._memory_bytes(handle, uuid, where),
            multiprocessors=self._multiprocessors(handle, int(major), int(minor), where),
            mig=mig,
            mig_profiles=profiles,
            mig_devices=devices,
            fabric=self._fabric(handle, where),
        )

    @staticmethod
    def _memory_bytes(handle: Any, uuid: str, where: str) -> int:
        """The GPU's framebuffer size, or 0 (unknown) on GPUs that have none of their own.

        Unified-memory GPUs (NVIDIA GB10) answer NOT_SUPPORTED, as drivers that predate the
        call answer FUNCTION_NOT_FOUND. The inventory requires a number; 0 is what it already
        holds for an unknown SM count. The whole GPU is still published, with memory capacity
        0, so a selector asking for memory passes it over instead of matching a guess (its
        memory is the host's, shared with the CPU).
        """
        memory = nvml_call_unless(
            pynvml.nvmlDeviceGetMemoryInfo,
            handle,
            where=where,
            codes=(pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
        )
        if memory is None:
            log.warning(
                "NVML reports no memory size for the GPU (unified memory?): published as 0",
                gpu=uuid,
            )
            return 0
        return int(memory.total)

    @staticmethod
    def _multiprocessors(handle: Any, major: int, minor: int, where: str) -> int:
        # Drivers before nvmlDeviceGetNumGpuCores existed (or GPUs that do not report it)
        # leave the SM count unknown (0) rather than failing the whole inventory.
        cores = nvml_call_unless(
            pynvml.nvmlDeviceGetNumGpuCores,
            handle,
            where=where,
            codes=(pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
        )
        return int(cores) // cores_per_sm(major, minor) if cores is not None else 0

    @staticmethod
    def _fabric(handle: Any, where: str) -> Fabric:
        """The GPU's fabric info: nvmlDeviceGetGpuFabricInfoV, or on drivers without it (or
        without its struct version) the older nvmlDeviceGetGpuFabricInfo. GPUs without a
        fabric answer NOT_SUPPORTED, as do drivers that predate both calls."""
        unsupported = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        versioned = getattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", None)
        if versioned is not None:
            info = pynvml.c_nvmlGpuFabricInfoV_t()
            try:
                versioned(handle, ctypes.byref(info))
            except pynvml.NVMLError as exc:
                code = error_code(exc)
                if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    return Fabric()
                if code not in (*unsupported, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                    raise NvmlCallError("nvmlDeviceGetGpuFabricInfoV", where, exc) from None
            else:
                return fabric_from_nvml(
                    int(info.state), int(info.status), bytes(info.clusterUuid), int(info.cliqueId)
                )
        legacy = pynvml.c_nvmlGpuFabricInfo_t()
        got = nvml_call_unless(
            pynvml.nvmlDeviceGetGpuFabricInfo,
            handle,
            ctypes.byref(legacy),
            where=where,
            codes=unsupported,
        )
        if got is None:
            return Fabric()
        return fabric_from_nvml(
            int(legacy.state), int(legacy.status), bytes(legacy.clusterUuid), int(legacy.cliqueId)
        )

    def _pci_topology(self, bus_id: str) -> tuple[str | None, int | None]:
        """PCIe root complex (``pci0000:00``) and NUMA node of a PCI device, from sysfs."""
        device = self._sysfs_root / "bus" / "pci" / "devices" / bus_id
        # The bus entry is a symlink into /sys/devices/pciDDDD:BB/...; its first pci* component
        # is the root complex the GPU hangs off.
        try:
            resolved = device.resolve(strict=True)
        except OSError:
            return None, None
        root = next((part for part in resolved.parts if _PCI_ROOT.match(part)), None)
        numa: int | None
        try:
            numa = int((resolved / "numa_node").read_text().strip())
        except (OSError, ValueError):
            numa = None
        # The kernel reports -1 when the platform has no NUMA affinity for the device.
        if numa is not None and numa < 0:
            numa = None
        return root, numa

    # -- MIG -------------------------------------------------------------------------------

    def _mig(
        self, handle: Any, uuid: str, where: str
    ) -> tuple[MigState, tuple[MigProfile, ...], tuple[MigDevice, ...]]:
        modes = nvml_call_unless(
            pynvml.nvmlDeviceGetMigMode,
            handle,
            where=where,
            codes=(pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
        )
        if modes is None:
            return MigState(capable=False), (), ()
        current, pending = (int(m) == pynvml.NVML_DEVICE_MIG_ENABLE for m in modes)
        state = MigState(capable=True, current_enabled=current, pending_enabled=pending)
        profiles = self._mig_profiles(handle, where)
        devices = self._mig_devices(handle, uuid, where, profiles) if current else ()
        return state, profiles, devices

    def _mig_profiles(self, handle: Any, where: str) -> tuple[MigProfile, ...]:
        count = int(getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))
        by_id: dict[int, MigProfile] = {}
        for nvml_index in range(count):
            # Profiles this GPU (or this driver) does not offer answer NOT_SUPPORTED, and
            # indices newer than the driver INVALID_ARGUMENT: both just mean "not here".
            info = nvml_call_unless(
                pynvml.nvmlDeviceGetGpuInstanceProfileInfo,
                handle,
                nvml_index,
                where=where,
                codes=(pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT),
            )
            if info is None or int(info.id) in by_id:
                continue
            profile_id = int(info.id)
            by_id[profile_id] = MigProfile(
                name=mig_profile_name(nvml_text(info.name)),
                profile_id=profile_id,
                nvml_index=nvml_index,
                slice_count=int(info.sliceCount),
                instance_count=int(info.instanceCount),
                memory_bytes=int(info.memorySizeMB) * MIB,
                multiprocessors=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                encoders=int(info.encoderCount),
                jpeg_engines=int(info.jpegCount),
                ofa_engines=int(info.ofaCount),
                placements=self._placements(handle, profile_id, where),
            )
        # NVML's index order is historical (1-slice variants were added at the end); list
        # them as `nvidia-smi mig -lgip` does: smallest first, then by memory and name.
        return tuple(sorted(by_id.values(), key=lambda p: (p.slice_count, p.memory_bytes, p.name)))

    @staticmethod
    def _placements(handle: Any, profile_id: int, where: str) -> tuple[Placement, ...]:
        # First ask for the count (NULL array), then fetch exactly that many.
        count = ctypes.c_uint(0)
        nvml_call(
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
            handle,
            profile_id,
            None,
            ctypes.byref(count),
            where=f"{where} MIG profile {profile_id}",
        )
        if count.value == 0:
            return ()
        array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        nvml_call(
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
            handle,
            profile_id,
            array,
            ctypes.byref(count),
            where=f"{where} MIG profile {profile_id}",
        )
        placements = {(int(p.start), int(p.size)) for p in array[: count.value]}
        return tuple(Placement(start=start, size=size) for start, size in sorted(placements))

    def _mig_devices(
        self, handle: Any, gpu_uuid: str, where: str, profiles: tuple[MigProfile, ...]
    ) -> tuple[MigDevice, ...]:
        """The MIG devices of GPU ``gpu_uuid`` whose compute instance spans its whole GPU
        instance.

        An admin may split a GPU instance into several compute instances (static MIG:
        ``nvidia-smi mig -gi 1 -cci 0,0``; the driver itself always makes one spanning CI).
        Each such CI is a MIG device smaller than its GPU instance's profile, yet the driver
        names and describes MIG devices by that profile (one device name per GPU instance,
        :func:`dra_driver.gpu.publish.devices.mig_device_name`), so each is skipped with a
        warning rather than published under a name it shares, as the whole GPU instance. Its
        GPU instance is still listed by the MIG backend, without a MIG device: its placement
        is taken and nothing of it is reused.
        """
        by_id = {p.profile_id: p for p in profiles}
        max_count = int(nvml_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle, where=where))
        devices: list[MigDevice] = []
        for mig_index in range(max_count):
            # MIG device indices are sparse: an index without a device answers NOT_FOUND.
            mig = nvml_call_unless(
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                handle,
                mig_index,
                where=where,
                codes=(pynvml.NVML_ERROR_NOT_FOUND,),
            )
            if mig is None:
                continue
            device = self._mig_device(
                handle, mig, gpu_uuid, f"{where} MIG device {mig_index}", by_id
            )
            if device is not None:
                devices.append(device)
        return tuple(sorted(devices, key=lambda d: (d.gpu_instance_id, d.compute_instance_id)))

    @staticmethod
    def _mig_device(
        parent: Any, mig: Any, gpu_uuid: str, where: str, profiles: dict[int, MigProfile]
    ) -> MigDevice | None:
        """One MIG device, or None for a compute instance smaller than its GPU instance
        (see :meth:`_mig_devices`)."""
        uuid = nvml_text(nvml_call(pynvml.nvmlDeviceGetUUID, mig, where=where))
        gi_id = int(nvml_call(pynvml.nvmlDeviceGetGpuInstanceId, mig, where=where))
        ci_id = int(nvml_call(pynvml.nvmlDeviceGetComputeInstanceId, mig, where=where))
        attrs = nvml_call(pynvml.nvmlDeviceGetAttributes, mig, where=where)
        ci_slices = int(attrs.computeInstanceSliceCount)
        gi_slices = int(attrs.gpuInstanceSliceCount)
        if not spans_gpu_instance(ci_slices, gi_slices):
            log.warning(
                "MIG device not published: its compute instance is smaller than its GPU instance",
                gpu=gpu_uuid,
                gpu_instance=gi_id,
                compute_instance=ci_id,
                uuid=uuid,
                compute_slices=ci_slices,
                gpu_instance_slices=gi_slices,
            )
            return None
        gpu_instance = nvml_call(pynvml.nvmlDeviceGetGpuInstanceById, parent, gi_id, where=where)
        info = nvml_call(pynvml.nvmlGpuInstanceGetInfo, gpu_instance, where=where)
        profile_id = int(info.profileId)
        profile = profiles.get(profile_id)
        memory_mib = int(attrs.memorySizeMB)
        if profile is not None:
            name = profile.name
        else:
            # A GI of a profile the GPU did not list: name it the way NVIDIA does.
            name = f"{gi_slices}g.{math.ceil(memory_mib / 1024)}gb"
        return MigDevice(
            uuid=uuid,
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            profile_id=profile_id,
            profile_name=name,
            placement=Placement(start=int(info.placement.start), size=int(info.placement.size)),
            memory_bytes=memory_mib * MIB,
            multiprocessors=int(attrs.multiprocessorCount),
            copy_engines=int(attrs.sharedCopyEngineCount),
            decoders=int(attrs.sharedDecoderCount),
            encoders=int(attrs.sharedEncoderCount),
            jpeg_engines=int(attrs.sharedJpegCount),
            ofa_engines=int(attrs.sharedOfaCount),
        )
