"""Health of a simulated node: a file that ``dra-driver inject-health`` edits.

The file holds each failing device's current condition (UUID or device name -> ``{"xid": N}``
or ``{"lost": true}``). A new or changed entry is an event, as NVML would send it; a cleared
entry sends nothing, as on a real GPU: the re-check (:class:`InjectedProber`) finds the
device healthy again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_driver.gpu.health.recheck import EventSink
from dra_driver.gpu.health.tracker import HealthEvent

INJECT_FILE = "health-inject.json"


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
    """The events of entries that are new or changed in ``after``."""
    events = []
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
        # On the loop: a stat of the state directory (which prepares stat too) costs less
        # than the hop to a worker thread and back, four times a second on an idle node.
        mtime = _mtime(path)
        if mtime != stamp:
            stamp = mtime
            new = await asyncio.to_thread(read_injected, path)
            for event in injected_events(state, new):
                sink(event)
            state = new
        await asyncio.sleep(interval)


class InjectedProber:
    """Re-checks a simulated device: healthy once its entry is gone from the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def probe(self, sources: Sequence[str]) -> dict[str, str | None]:
        """Source -> None when healthy, else why not (blocking: reads the file)."""
        current = read_injected(self.path)
        return {s: f"still failing: {current[s]}" if s in current else None for s in sources}
