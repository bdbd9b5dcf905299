"""NVML's side of GPU health: its event loop (Xids, double-bit ECC errors, lost GPUs) and
the re-check of devices it reported."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import structlog

from dra_driver.gpu.health.recheck import EventSink
from dra_driver.gpu.health.tracker import HealthEvent

log = structlog.get_logger(__name__)

#: Xid the driver reports for an uncorrectable (double-bit) ECC error.
XID_ECC_DBE = 48


class NvmlEventWatcher:
    """NVML's event loop in a thread of its own, feeding events back to the asyncio loop."""

    WAIT_MS = 1000

    def __init__(
        self, uuids: Sequence[str], sink: EventSink, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._uuids = list(uuids)
        self._sink = sink
        self._loop = loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to finish (within one wait period)."""
        self._stop.set()

    def _emit(self, event: HealthEvent) -> None:
        try:
            self._loop.call_soon_threadsafe(self._sink, event)
        except RuntimeError:
            # The agent's loop is closed (it is shutting down): nobody is left to tell.
            self._stop.set()

    def _run(self) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.error("health monitoring disabled: NVML did not initialise", error=str(exc))
            return
        try:
            events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.error("health monitoring disabled: no NVML event set", error=str(exc))
            pynvml.nvmlShutdown()
            return
        try:
            self._loop_events(pynvml, events, self._register(pynvml, events))
        finally:
            try:
                pynvml.nvmlEventSetFree(events)
            except pynvml.NVMLError as exc:
                log.warning("NVML event set not freed", error=str(exc))
            pynvml.nvmlShutdown()

    def _register(self, pynvml: Any, events: Any) -> dict[int, str]:
        """Register every GPU for the events it supports; handle address -> UUID."""
        wanted = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
        by_handle: dict[int, str] = {}
        for uuid in self._uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except pynvml.NVMLError_GpuIsLost:
                self._emit(HealthEvent(uuid, "gpu-lost"))
                continue
            except pynvml.NVMLError as exc:
                log.warning("GPU not found for health events", uuid=uuid, error=str(exc))
                continue
            by_handle[_address(handle)] = uuid
            try:
                # One unsupported type (no ECC events without ECC) fails the whole call.
                types = wanted & pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                if not types:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
                pynvml.nvmlDeviceRegisterEvents(handle, types, events)
            except pynvml.NVMLError as exc:
                log.warning("GPU does not report health events", uuid=uuid, error=str(exc))
        return by_handle

    def _loop_events(self, pynvml: Any, events: Any, by_handle: dict[int, str]) -> None:
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(events, self.WAIT_MS)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError_GpuIsLost:
                for lost in by_handle.values():
                    self._emit(HealthEvent(lost, "gpu-lost"))
                return
            except pynvml.NVMLError as exc:
                log.error("NVML event wait failed", error=str(exc))
                self._stop.wait(5)
                continue
            uuid = by_handle.get(_address(data.device))
            if uuid is None:
                continue
            xid = (
                XID_ECC_DBE
                if data.eventType == pynvml.nvmlEventTypeDoubleBitEccError
                else int(data.eventData)
            )
            self._emit(HealthEvent(uuid, "xid", xid))


def _address(handle: Any) -> int:
    import ctypes

    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class NvmlProber:
    """Re-checks GPUs through NVML: reachable, no retired pages or row remapping waiting
    for a reset, no failed row remapping. A MIG device is as healthy as its GPU."""

    def probe(self, sources: Sequence[str]) -> dict[str, str | None]:
        """UUID -> None when healthy, else why not (blocking)."""
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return dict.fromkeys(sources, f"NVML did not initialise: {exc}")
        try:
            return {uuid: _probe_one(pynvml, uuid) for uuid in sources}
        finally:
            pynvml.nvmlShutdown()


def _probe_one(pynvml: Any, uuid: str) -> str | None:
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        if pynvml.nvmlDeviceIsMigDeviceHandle(handle):
            handle = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    except pynvml.NVMLError_GpuIsLost:
        return "GPU is lost"
    except pynvml.NVMLError as exc:
        return f"GPU not reachable: {exc}"
    try:
        if pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
            return "retired memory pages wait for a GPU reset"
    except pynvml.NVMLError_NotSupported:
        pass  # no page retirement on this GPU (it remaps rows instead)
    except pynvml.NVMLError as exc:
        return f"page retirement status unknown: {exc}"
    try:
        _, _, pending, failed = pynvml.nvmlDeviceGetRemappedRows(handle)
    except pynvml.NVMLError_NotSupported:
        return None  # no row remapping before Ampere
    except pynvml.NVMLError as exc:
        return f"row remapping status unknown: {exc}"
    if failed:
        return "row remapping failed"
    if pending:
        return "remapped rows wait for a GPU reset"
    return None
