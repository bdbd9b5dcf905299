"""Small helpers over pynvml shared by discovery, MIG and health: sessions, calls, errors.

Every NVML error becomes a one-line :class:`DiscoveryError` that names the failing call.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from dra_driver.gpu.discovery.base import DiscoveryError
from dra_driver.gpu.driverroot import NVML, find_library

T = TypeVar("T")

SIMULATED_HINT = "To run without GPUs use --backend simulated --profile NAME"


def nvml_text(value: Any) -> str:
    # pynvml hands back str from decorated getters but raw bytes from struct fields.
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def error_code(exc: Exception) -> int:
    return int(getattr(exc, "value", -1))


class NvmlCallError(DiscoveryError):
    """An NVML call failed; ``code`` is NVML's error code (e.g. ``NVML_ERROR_GPU_IS_LOST``)."""

    def __init__(self, call: str, where: str, exc: pynvml.NVMLError) -> None:
        super().__init__(f"NVML call {call} failed for {where}: {exc}")
        self.code = error_code(exc)


def nvml_call(fn: Callable[..., T], *args: Any, where: str) -> T:
    """Run one NVML call; any NVML error becomes a one-line :class:`NvmlCallError`."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise NvmlCallError(fn.__name__, where, exc) from None


def nvml_call_unless(
    fn: Callable[..., T], *args: Any, where: str, codes: tuple[int, ...]
) -> T | None:
    """Like :func:`nvml_call`, but the NVML error ``codes`` mean "no answer": return None."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        if error_code(exc) in codes:
            return None
        raise NvmlCallError(fn.__name__, where, exc) from None


class NvmlInitError(DiscoveryError):
    """nvmlInit failed; ``code`` is NVML's error code (``NVML_ERROR_LIBRARY_NOT_FOUND`` when
    the library could not be loaded at all)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def nvml_init() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        code = error_code(exc)
        if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            raise NvmlInitError(
                "NVML library libnvidia-ml.so.1 not found: is the NVIDIA driver installed and "
                f"its libraries mounted into this container? {SIMULATED_HINT}",
                code,
            ) from None
        if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
            raise NvmlInitError(
                "NVML cannot talk to the NVIDIA kernel driver (nvmlInit: Driver Not Loaded): "
                f"is the driver loaded and are /dev/nvidia* visible? {SIMULATED_HINT}",
                code,
            ) from None
        raise NvmlInitError(f"NVML call nvmlInit failed: {exc}. {SIMULATED_HINT}", code) from None


def nvml_shutdown() -> None:
    # A failing shutdown must not hide the inventory (or the error) discovery produced.
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()


#: Where driver installations put libnvidia-ml, relative to the driver root.
LIBRARY = NVML


def preload_library(driver_root: Path) -> Path | None:
    """Load libnvidia-ml from a driver root mounted into the container, if it is there.

    pynvml opens the library by its soname; once a library with that soname is loaded, the
    dynamic loader hands out the same one, so nothing else from the host's library
    directories leaks into this process (as it would with LD_LIBRARY_PATH).
    """
    if driver_root == Path("/"):
        return None
    candidate = find_library(driver_root, LIBRARY)
    if candidate is not None:
        ctypes.CDLL(str(candidate), mode=ctypes.RTLD_GLOBAL)
    return candidate
