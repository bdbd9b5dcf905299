"""GPU health: events in, device taints and the kubelet's health stream out.

Sources of events are the NVML event loop on real hardware (critical Xid errors, double-bit
ECC errors, a GPU that fell off the bus) and, on simulated nodes, a file that
``dra-driver inject-health`` edits. The tracker turns them into per-device taints (so the
scheduler stops placing new claims there) and health states (so the kubelet shows them in
pod status).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.publish.devices import devices_for_gpu
from dra_driver.kubeletplugin.interfaces import DeviceHealth, HealthStatus

log = structlog.get_logger(__name__)

#: Xids caused by applications (bad memory access, user-triggered resets, ...): no taint.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
#: Xid the driver reports for an uncorrectable (double-bit) ECC error.
XID_ECC_DBE = 48
INJECT_FILE = "health-inject.json"

Problem = Literal["xid", "gpu-lost"]


@dataclass(frozen=True)
class HealthEvent:
    """Something happened to a GPU (or MIG device) identified by UUID."""

    uuid: str
    problem: Problem | Literal["recovered"]
    xid: int | None = None


@dataclass(frozen=True)
class _Condition:
    problem: Problem
    xid: int | None
    since: str


def parse_xids(text: str) -> frozenset[int]:
    """``"13,31,43"`` -> {13, 31, 43}."""
    return frozenset(int(x) for x in text.split(",") if x.strip())


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class HealthTracker:
    """Current health of every published device (pure bookkeeping, no I/O)."""

    def __init__(
        self,
        inventory: Inventory,
        driver_name: str,
        ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
    ) -> None:
        self.driver_name = driver_name
        self.ignored_xids = frozenset(ignored_xids)
        # UUID -> the published device names it affects (a GPU affects its MIG devices).
        self._affects: dict[str, tuple[str, ...]] = {}
        self._devices: list[str] = []
        # Device names work too, so a simulated node can be poked by name.
        for gpu in inventory.gpus:
            names = tuple(d["name"] for d in devices_for_gpu(gpu, inventory))
            self._devices += names
            self._affects[gpu.uuid] = names
            self._affects[f"gpu-{gpu.minor}"] = names
            if gpu.mig_enabled:
                for mig, name in zip(gpu.mig_devices, names, strict=True):
                    self._affects[mig.uuid] = (name,)
                    self._affects[name] = (name,)
        self._conditions: dict[str, _Condition] = {}

    def apply(self, event: HealthEvent) -> bool:
        """Record an event; True if any device's health changed."""
        names = self._affects.get(event.uuid)
        if names is None:
            log.warning(
                "health event for an unknown device", uuid=event.uuid, problem=event.problem
            )
            return False
        if event.problem == "recovered":
            return any([self._conditions.pop(n, None) is not None for n in names])
        if event.problem == "xid" and event.xid in self.ignored_xids:
            return False
        condition = _Condition(event.problem, event.xid, _now())
        changed = False
        for name in names:
            old = self._conditions.get(name)
            if old is None or (old.problem, old.xid) != (condition.problem, condition.xid):
                self._conditions[name] = condition
                changed = True
        return changed

    def unhealthy(self) -> dict[str, str]:
        """Unhealthy device name -> a human reason."""
        return {name: self._reason(c) for name, c in self._conditions.items()}

    @staticmethod
    def _reason(condition: _Condition) -> str:
        if condition.problem == "gpu-lost":
            return "GPU is lost (fell off the bus or stopped answering)"
        return f"critical Xid {condition.xid} error"

    def taints(self) -> dict[str, list[dict[str, Any]]]:
        """Device name -> the taints to publish on it."""
        out: dict[str, list[dict[str, Any]]] = {}
        for name, c in self._conditions.items():
            taint: dict[str, Any] = {"effect": "NoSchedule", "timeAdded": c.since}
            if c.problem == "gpu-lost":
                taint["key"] = f"{self.driver_name}/gpu-lost"
            else:
                taint["key"] = f"{self.driver_name}/xid"
                taint["value"] = str(c.xid)
            out[name] = [taint]
        return out

    def device_health(self, pool_name: str) -> list[DeviceHealth]:
        """The complete device list as the kubelet's health stream carries it."""
        bad = self.unhealthy()
        return [
            DeviceHealth(
                pool_name=pool_name,
                device_name=name,
                status=HealthStatus.UNHEALTHY if name in bad else HealthStatus.HEALTHY,
                message=bad.get(name, ""),
            )
            for name in self._devices
        ]


class HealthBroadcaster:
    """A ``HealthSource`` for the kubelet plugin: every stream gets the full list on change."""

    def __init__(self, initial: Sequence[DeviceHealth]) -> None:
        self._current = list(initial)
        self._version = 0
        self._changed = asyncio.Condition()

    async def publish(self, devices: Sequence[DeviceHealth]) -> None:
        """Replace the list and wake every stream."""
        async with self._changed:
            self._current = list(devices)
            self._version += 1
            self._changed.notify_all()

    async def watch(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        """One kubelet stream: the current list now, then each new one."""
        async with self._changed:
            seen, devices = self._version, self._current
        yield devices
        while True:
            async with self._changed:
                while self._version == seen:
                    await self._changed.wait()
                seen, devices = self._version, self._current
            yield devices


# --- event sources ---------------------------------------------------------------------------

EventSink = Callable[[HealthEvent], None]


def read_injected(path: Path) -> dict[str, dict[str, Any]]:
    """Injected conditions of a simulated node: UUID or device -> {"xid": N} or {"lost": true}."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def injected_events(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> list[HealthEvent]:
    """Events that turn the ``before`` injected state into ``after``."""
    events = [HealthEvent(uuid, "recovered") for uuid in before if uuid not in after]
    for uuid, cond in after.items():
        if before.get(uuid) == cond:
            continue
        if cond.get("lost"):
            events.append(HealthEvent(uuid, "gpu-lost"))
        else:
            events.append(HealthEvent(uuid, "xid", int(cond.get("xid", 0))))
    return events


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def inject(path: Path, device: str, condition: Mapping[str, Any] | None) -> None:
    """Set (or with None clear) one device's injected condition; the agent picks it up."""
    from dra_driver.cdi.writer import write_atomic

    state = read_injected(path)
    if condition is None:
        state.pop(device, None)
    else:
        state[device] = dict(condition)
    write_atomic(path, state)


async def watch_injected(path: Path, sink: EventSink, interval: float = 0.25) -> None:
    """Poll the simulated node's injection file and emit what changed (until cancelled)."""
    state: dict[str, dict[str, Any]] = {}
    stamp: float | None = None
    while True:
        mtime = await asyncio.to_thread(_mtime, path)
        if mtime != stamp:
            stamp = mtime
            new = await asyncio.to_thread(read_injected, path)
            for event in injected_events(state, new):
                sink(event)
            state = new
        await asyncio.sleep(interval)


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
