"""MIG devices on demand through NVML (nvidia-ml-py, module ``pynvml``).

Each call opens its own NVML session (init ... shutdown), as discovery does: handles are only
valid inside a session and a fresh one sees what other processes changed. The GPU is found
by its index; its UUID is checked so a renumbered node is not mistaken for the old one.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pynvml
import structlog

from dra_driver import faults
from dra_driver.gpu.discovery.base import DiscoveryError
from dra_driver.gpu.discovery.nvml import NvmlDiscovery
from dra_driver.gpu.discovery.nvmllib import (
    error_code,
    nvml_init,
    nvml_shutdown,
    nvml_text,
    preload_library,
)
from dra_driver.gpu.inventory import Gpu, MigDevice, MigProfile, Placement
from dra_driver.gpu.mig.backend import Instance, MigError, check_create

T = TypeVar("T")

log = structlog.get_logger(__name__)

# NVML_COMPUTE_INSTANCE_PROFILE_* index of the CI spanning a GI of this many compute slices.
_FULL_CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


def _nvml(fn: Callable[..., T], *args: Any, what: str) -> T:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise MigError(f"{what}: NVML {fn.__name__} failed: {exc}") from None


class NvmlMig:
    """:class:`dra_driver.gpu.mig.backend.MigBackend` on real GPUs."""

    def __init__(self, driver_root: Path = Path("/")) -> None:
        self._driver_root = driver_root
        self._preloaded = False

    @contextmanager
    def _session(self, gpu: Gpu) -> Iterator[Any]:
        if not self._preloaded:
            preload_library(self._driver_root)
            self._preloaded = True
        try:
            nvml_init()
        except DiscoveryError as exc:
            raise MigError(str(exc)) from None
        try:
            handle = _nvml(pynvml.nvmlDeviceGetHandleByIndex, gpu.index, what=f"GPU {gpu.index}")
            uuid = nvml_text(_nvml(pynvml.nvmlDeviceGetUUID, handle, what=f"GPU {gpu.index}"))
            if uuid != gpu.uuid:
                raise MigError(f"GPU {gpu.index} is {uuid} now, not {gpu.uuid}")
            yield handle
        finally:
            nvml_shutdown()

    def mig_enabled(self, gpu: Gpu) -> bool:
        """Whether MIG mode is on now."""
        with self._session(gpu) as handle:
            current, _ = _nvml(pynvml.nvmlDeviceGetMigMode, handle, what=gpu.uuid)
            return bool(int(current) == pynvml.NVML_DEVICE_MIG_ENABLE)

    def set_mig_mode(self, gpu: Gpu, enabled: bool) -> None:
        """Switch MIG mode; a change that is only pending (needs a GPU reset) is an error."""
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        with self._session(gpu) as handle:
            _nvml(pynvml.nvmlDeviceSetMigMode, handle, mode, what=gpu.uuid)
            current, _ = _nvml(pynvml.nvmlDeviceGetMigMode, handle, what=gpu.uuid)
            if int(current) != mode:
                raise MigError(
                    f"GPU {gpu.uuid}: MIG mode {'on' if enabled else 'off'} is pending until the "
                    "GPU is reset (nvidia-smi -r -i <index>); stop its processes and reset it"
                )

    def create(self, gpu: Gpu, profile: MigProfile, start: int) -> MigDevice:
        """Create the GI at the placement, then a CI spanning it; return the MIG device.

        Should anything fail once the GI exists, the GI is destroyed again through the handle
        its creation returned, then the error is raised: the caller has no id for it, and a
        GI found at the placement later may be another tool's (``nvidia-smi mig -cgi``).
        A crash in between leaves the GI for start-up recovery instead.
        """
        what = f"GPU {gpu.uuid}: {profile.name} at {start}"
        with self._session(gpu) as handle:
            placement = check_create(gpu, profile, start, self._list(gpu, handle))
            spot = pynvml.c_nvmlGpuInstancePlacement_t()
            spot.start, spot.size = placement.start, placement.size
            gi = _nvml(
                pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                handle,
                profile.profile_id,
                ctypes.byref(spot),
                what=what,
            )
            try:
                return self._finish_create(gpu, handle, gi, profile, what)
            except BaseException:
                # Ctrl-C or a signal turned into one (hw-check) too: only this handle knows it.
                self._discard(gi, gpu, profile, start)
                raise

    def destroy(self, gpu: Gpu, gpu_instance_id: int) -> None:
        """Destroy the GI's compute instances, then the GI."""
        what = f"GPU {gpu.uuid} GPU instance {gpu_instance_id}"
        with self._session(gpu) as handle:
            try:
                gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            except pynvml.NVMLError as exc:
                if int(getattr(exc, "value", -1)) == pynvml.NVML_ERROR_NOT_FOUND:
                    return
                raise MigError(f"{what}: {exc}") from None
            self._destroy_gpu_instance(gi, what)

    def list(self, gpu: Gpu) -> tuple[Instance, ...]:
        """Every GPU instance of every profile, with its MIG device if it has one."""
        with self._session(gpu) as handle:
            return self._list(gpu, handle)

    # -- helpers (inside a session) ------------------------------------------------------

    def _finish_create(
        self, gpu: Gpu, handle: Any, gi: Any, profile: MigProfile, what: str
    ) -> MigDevice:
        """The steps of :meth:`create` after the GI exists: its CI, then the MIG device."""
        gi_id = int(_nvml(pynvml.nvmlGpuInstanceGetInfo, gi, what=what).id)
        faults.point("mig.gi-created")
        ci_profile = self._ci_profile_id(gi, profile, what)
        ci = _nvml(pynvml.nvmlGpuInstanceCreateComputeInstance, gi, ci_profile, what=what)
        ci_id = int(_nvml(pynvml.nvmlComputeInstanceGetInfo, ci, what=what).id)
        device = self._mig_device(gpu, handle, gi_id, ci_id)
        if device is None:
            raise MigError(f"{what}: created GI {gi_id}/CI {ci_id} but NVML does not list it")
        return device

    def _discard(self, gi: Any, gpu: Gpu, profile: MigProfile, start: int) -> None:
        """Best effort: destroy the GI a failed :meth:`create` made. The create's own error is
        the one raised, so a failure here is only logged (start-up recovery sweeps the GI)."""
        fields = {"gpu": gpu.uuid, "profile": profile.name, "start": start}
        try:
            self._destroy_gpu_instance(gi, f"GPU {gpu.uuid}: {profile.name} at {start}")
        except MigError as exc:
            log.error(
                "destroying the GPU instance of a failed create failed", **fields, error=str(exc)
            )
        else:
            log.info("destroyed the GPU instance of a failed create", **fields)

    def _destroy_gpu_instance(self, gi: Any, what: str) -> None:
        """Destroy a GI's compute instances, then the GI."""
        destroyed = False
        for ci in self._compute_instances(gi, what):
            _nvml(pynvml.nvmlComputeInstanceDestroy, ci, what=what)
            destroyed = True
        if destroyed:
            faults.point("mig.ci-destroyed")
        _nvml(pynvml.nvmlGpuInstanceDestroy, gi, what=what)

    def _list(self, gpu: Gpu, handle: Any) -> tuple[Instance, ...]:
        """Every GPU instance, each with its MIG device: the compute instance spanning it.

        Discovery skips (with a warning) compute instances smaller than their GPU instance
        (:meth:`NvmlDiscovery._mig_devices`), so a GPU instance has at most one MIG device
        here; one an admin split into several compute instances is listed without a MIG
        device, so its placement counts as taken and carving never adopts it (it reuses only
        instances with a MIG device).
        """
        current, _ = _nvml(pynvml.nvmlDeviceGetMigMode, handle, what=gpu.uuid)
        if int(current) != pynvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        devices = {d.gpu_instance_id: d for d in self._mig_devices(gpu, handle)}
        out = []
        for profile_id in self._gpu_instance_profile_ids(handle, gpu.uuid):
            count = ctypes.c_uint(32)
            array = (pynvml.c_nvmlGpuInstance_t * 32)()
            _nvml(
                pynvml.nvmlDeviceGetGpuInstances,
                handle,
                profile_id,
                array,
                ctypes.byref(count),
                what=gpu.uuid,
            )
            for gi in array[: count.value]:
                info = _nvml(pynvml.nvmlGpuInstanceGetInfo, gi, what=gpu.uuid)
                placement = Placement(
                    start=int(info.placement.start), size=int(info.placement.size)
                )
                gi_id = int(info.id)
                out.append(Instance(gi_id, profile_id, placement, devices.get(gi_id)))
        return tuple(sorted(out, key=lambda i: i.gpu_instance_id))

    @staticmethod
    def _gpu_instance_profile_ids(handle: Any, what: str) -> tuple[int, ...]:
        """Every GI profile id the GPU offers, asked of NVML: ``gpu.mig_profiles`` may hold
        only the profiles --mig-profiles chose, yet GIs of the others still take slices."""
        ids: list[int] = []
        for index in range(int(getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except pynvml.NVMLError as exc:
                # As in discovery: a profile this GPU or driver does not offer.
                if error_code(exc) in (
                    pynvml.NVML_ERROR_NOT_SUPPORTED,
                    pynvml.NVML_ERROR_INVALID_ARGUMENT,
                ):
                    continue
                raise MigError(
                    f"{what}: NVML nvmlDeviceGetGpuInstanceProfileInfo failed: {exc}"
                ) from None
            if int(info.id) not in ids:
                ids.append(int(info.id))
        return tuple(ids)

    @staticmethod
    def _ci_profile_id(gi: Any, profile: MigProfile, what: str) -> int:
        index = _FULL_CI_PROFILE.get(profile.slice_count)
        if index is None:
            raise MigError(
                f"{what}: no compute-instance profile spans {profile.slice_count} slices"
            )
        info = _nvml(
            pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gi,
            index,
            pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            what=what,
        )
        return int(info.id)

    @staticmethod
    def _compute_instances(gi: Any, what: str) -> tuple[Any, ...]:
        found: tuple[Any, ...] = ()
        seen: set[int] = set()
        # Every CI profile, not only the spanning ones create uses: a CI of any profile
        # left behind (an admin's, e.g. 1_SLICE_REV1) makes the GI's destroy fail IN_USE.
        total = int(getattr(pynvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 0))
        for index in range(max(total, max(_FULL_CI_PROFILE.values()) + 1)):
            try:
                info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except pynvml.NVMLError:
                continue  # a CI profile this GI does not offer
            if int(info.id) in seen:
                continue  # listed already: destroying a CI twice fails
            seen.add(int(info.id))
            count = ctypes.c_uint(8)
            array = (pynvml.c_nvmlComputeInstance_t * 8)()
            _nvml(
                pynvml.nvmlGpuInstanceGetComputeInstances,
                gi,
                int(info.id),
                array,
                ctypes.byref(count),
                what=what,
            )
            found += tuple(array[: count.value])
        return found

    def _mig_devices(self, gpu: Gpu, handle: Any) -> tuple[MigDevice, ...]:
        # Discovery already reads MIG devices from a GPU handle; reuse it inside this session.
        try:
            return NvmlDiscovery()._mig_devices(
                handle, gpu.uuid, f"GPU {gpu.uuid}", gpu.mig_profiles
            )
        except DiscoveryError as exc:
            raise MigError(str(exc)) from None

    def _mig_device(self, gpu: Gpu, handle: Any, gi_id: int, ci_id: int) -> MigDevice | None:
        return next(
            (
                d
                for d in self._mig_devices(gpu, handle)
                if (d.gpu_instance_id, d.compute_instance_id) == (gi_id, ci_id)
            ),
            None,
        )
