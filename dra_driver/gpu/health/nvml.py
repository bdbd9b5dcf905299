"""NVML's side of GPU health: its event loop (Xids, double-bit ECC errors, lost GPUs) and
the re-check of devices it reported."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from dra_driver.errors import DriverError
from dra_driver.gpu.health.recheck import EventSink
from dra_driver.gpu.health.tracker import HealthEvent
from dra_driver.gpu.inventory import Inventory

log = structlog.get_logger(__name__)

#: Xid the driver reports for an uncorrectable (double-bit) ECC error.
XID_ECC_DBE = 48
#: An event's gpuInstanceId / computeInstanceId when it is not tied to a MIG device.
NO_INSTANCE = 0xFFFFFFFF


def mig_instances(inventory: Inventory) -> dict[tuple[str, int], str]:
    """(GPU UUID, GPU instance id) -> UUID of the MIG device published for it: the MIG
    devices the health tracker knows (GPUs in MIG mode; one compute instance a GPU instance,
    since split ones are not published)."""
    return {
        (gpu.uuid, m.gpu_instance_id): m.uuid
        for gpu in inventory.gpus
        if gpu.mig_enabled
        for m in gpu.mig_devices
    }


class WatchEnded(DriverError):
    """NVML's event thread ended without being asked to: no health event is seen any more."""


@dataclass
class _Watched:
    """The event thread's state: the event set it waits on and the GPUs left out as lost."""

    events: Any = None  # nvmlEventSet_t; None before the first one exists
    by_handle: dict[int, str] = field(default_factory=dict)  # handle address -> UUID
    lost: set[str] = field(default_factory=set)
    looked: float = 0.0  # monotonic time of the last look whether a lost GPU answers again
    unnamed: float = -math.inf  # monotonic time of the last rebuild after an unnamed loss
    failed_waits: int = 0  # waits failed in a row (other than timeouts and losses)
    replaced: int = 0  # sets replaced for failing waits since a wait last worked


class NvmlEventWatcher:
    """NVML's event loop in a thread of its own, feeding events back to the asyncio loop.

    A lost GPU is reported and left out of a new event set while the others stay watched; it
    is watched again once it answers. The thread ends only when asked to (:meth:`stop`) or
    when it cannot watch at all, and :meth:`ended` tells the asyncio side either way, so the
    agent's supervised health loop ends with it instead of waiting on a dead thread.
    """

    WAIT_MS = 1000
    #: Seconds between looks whether a lost GPU answers again (after a reset).
    LOST_RETRY_S = 30.0
    #: Seconds before waiting again after a failed wait, and at least between two rebuilds
    #: of the event set after losses no GPU could be named for (a set that keeps failing).
    RETRY_S = 5.0
    #: Failed waits in a row after which the event set is replaced; when no new set can be
    #: made the thread ends, and with it the supervised loop (which fails liveness if it
    #: cannot start again): a set that only fails watches nothing.
    MAX_FAILED_WAITS = 3
    #: New sets made for failing waits, in a row with no wait working in between, after
    #: which the thread ends: NVML itself is then in trouble, not one set. The supervised
    #: health loop starts it again on a fresh NVML (counted in its crash metric), instead
    #: of it replacing sets blind for as long as the agent runs.
    MAX_REPLACEMENTS = 3

    def __init__(
        self,
        uuids: Sequence[str],
        sink: EventSink,
        loop: asyncio.AbstractEventLoop,
        migs: Mapping[tuple[str, int], str] | None = None,
    ) -> None:
        """``migs``: :func:`mig_instances`, to name the MIG device of an event NVML reports
        on its GPU's handle with its GPU instance."""
        self._uuids = list(uuids)
        self._migs = dict(migs or {})
        self._sink = sink
        self._loop = loop
        self._stop = threading.Event()
        self._ready: asyncio.Future[None] = loop.create_future()
        self._ended: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to finish (within one wait period)."""
        self._stop.set()

    async def watching(self) -> None:
        """Return once the first event set is registered (NVML reports no event from before
        that); raise as :meth:`ended` does if the thread ends first."""
        await asyncio.wait({self._ready, self._ended}, return_when=asyncio.FIRST_COMPLETED)
        if not self._ready.done():
            await self.ended()

    async def ended(self) -> None:
        """Return when the thread has ended after :meth:`stop`; raise why it ended when it
        ended on its own (:class:`WatchEnded`, or the exception that ended it)."""
        # Shielded: a cancelled caller must not cancel the future the thread settles.
        await asyncio.shield(self._ended)

    def _emit(self, event: HealthEvent) -> None:
        try:
            self._loop.call_soon_threadsafe(self._sink, event)
        except RuntimeError:
            # The agent's loop is closed (it is shutting down): nobody is left to tell.
            self._stop.set()

    def _settle(self, future: asyncio.Future[None], error: BaseException | None = None) -> None:
        """Resolve ``future`` on the asyncio loop (futures are not thread-safe)."""

        def settle() -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        # RuntimeError: the loop is closed, nobody waits any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(settle)

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._watch()
        except BaseException as exc:  # whatever ends the thread must reach the agent
            error = exc
        if self._stop.is_set():
            if error is not None:
                # Nobody awaits a stopped watcher: say it here, not as an unread exception.
                log.warning("NVML event thread failed while stopping", error=str(error))
            self._settle(self._ended)
            return
        self._settle(self._ended, error or WatchEnded("NVML event thread ended"))

    def _watch(self) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise WatchEnded(f"NVML did not initialise: {exc}") from exc
        try:
            self._watch_sets(pynvml)
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("NVML not shut down", error=str(exc))

    def _watch_sets(self, pynvml: Any) -> None:
        watched = _Watched(looked=time.monotonic())
        try:
            self._rebuild(pynvml, watched)
            self._settle(self._ready)
            while not self._stop.is_set():
                if self._wait_once(pynvml, watched):
                    self._after_loss(pynvml, watched)
                elif watched.lost and time.monotonic() - watched.looked >= self.LOST_RETRY_S:
                    self._look_at_lost(pynvml, watched)
        finally:
            if watched.events is not None:
                self._free(pynvml, watched.events)

    def _rebuild(self, pynvml: Any, watched: _Watched) -> None:
        """Replace the event set by a new one with every GPU not lost registered.

        The new set exists before the old one goes, so no event falls between them.
        """
        try:
            events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            raise WatchEnded(f"no NVML event set: {exc}") from exc
        old, watched.events = watched.events, events
        try:
            watched.by_handle = self._register(pynvml, events, watched.lost)
        finally:
            if old is not None:
                self._free(pynvml, old)

    def _free(self, pynvml: Any, events: Any) -> None:
        try:
            pynvml.nvmlEventSetFree(events)
        except pynvml.NVMLError as exc:
            log.warning("NVML event set not freed", error=str(exc))

    def _register(self, pynvml: Any, events: Any, lost: set[str]) -> dict[int, str]:
        """Register every GPU not in ``lost`` for the events it supports; handle address ->
        UUID. A GPU found lost on the way is reported and added to ``lost``."""
        wanted = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
        by_handle: dict[int, str] = {}
        for uuid in self._uuids:
            if uuid in lost:
                continue
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except pynvml.NVMLError_GpuIsLost:
                log.warning("GPU lost: not watched until it answers again", uuid=uuid)
                lost.add(uuid)
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

    def _wait_once(self, pynvml: Any, watched: _Watched) -> bool:
        """Wait for one event and report it; True when the set says a GPU is lost."""
        try:
            data = pynvml.nvmlEventSetWait_v2(watched.events, self.WAIT_MS)
        except pynvml.NVMLError_Timeout:
            watched.failed_waits = watched.replaced = 0
            return False
        except pynvml.NVMLError_GpuIsLost:
            return True
        except pynvml.NVMLError as exc:
            watched.failed_waits += 1
            log.error("NVML event wait failed", error=str(exc), failures=watched.failed_waits)
            self._stop.wait(self.RETRY_S)
            if watched.failed_waits >= self.MAX_FAILED_WAITS:
                if watched.replaced >= self.MAX_REPLACEMENTS:
                    raise WatchEnded(
                        f"NVML event waits keep failing on {watched.replaced + 1} event sets "
                        f"in a row: {exc}"
                    ) from exc
                watched.failed_waits = 0
                watched.replaced += 1
                self._rebuild(pynvml, watched)
            return False
        watched.failed_waits = watched.replaced = 0
        uuid = watched.by_handle.get(_address(data.device))
        if uuid is not None:
            xid = (
                XID_ECC_DBE
                if data.eventType == pynvml.nvmlEventTypeDoubleBitEccError
                else int(data.eventData)
            )
            # A MIG device's error comes on its GPU's handle with its GPU instance: it
            # concerns that MIG device, not the GPU's other MIG devices (other tenants').
            # An instance not published (dynamic MIG, a split one) counts for the GPU.
            gi = int(getattr(data, "gpuInstanceId", NO_INSTANCE))
            source = self._migs.get((uuid, gi), uuid) if gi != NO_INSTANCE else uuid
            self._emit(HealthEvent(source, "xid", xid))
        return False

    def _after_loss(self, pynvml: Any, watched: _Watched) -> None:
        """The set says a GPU is lost (not which): report the GPUs that answer as lost and
        watch the others on a new set (this one fails every later wait)."""
        named = [u for u in watched.by_handle.values() if _is_lost(pynvml, u)]
        if named:
            for uuid in named:
                log.warning("GPU lost: not watched until it answers again", uuid=uuid)
            watched.lost.update(named)
        else:
            # Any of them may be the lost one: report all, keep watching all.
            named = list(watched.by_handle.values())
            log.warning("a GPU is lost but none answers as lost: reporting all", uuids=named)
            # A set that fails at once again must not make this a busy loop.
            self._stop.wait(max(0.0, watched.unnamed + self.RETRY_S - time.monotonic()))
            watched.unnamed = time.monotonic()
        self._rebuild(pynvml, watched)
        # Reported once the new set is in place: whoever hears of the loss may rely on the
        # other GPUs' events being seen again.
        for uuid in named:
            self._emit(HealthEvent(uuid, "gpu-lost"))

    def _look_at_lost(self, pynvml: Any, watched: _Watched) -> None:
        """Watch lost GPUs again that answer again (after a reset)."""
        watched.looked = time.monotonic()
        back = sorted(u for u in watched.lost if not _is_lost(pynvml, u))
        if not back:
            return
        for uuid in back:
            log.info("lost GPU answers again: watching its events", uuid=uuid)
        watched.lost.difference_update(back)
        self._rebuild(pynvml, watched)


def _is_lost(pynvml: Any, uuid: str) -> bool:
    """Whether NVML answers that the GPU is lost (the event wait does not say which is)."""
    try:
        pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError_GpuIsLost:
        return True
    except pynvml.NVMLError:
        return False  # another problem: registration says so
    return False


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
            # Not fatal, as in the event thread: raising here would drop the answers.
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("NVML not shut down", error=str(exc))


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
