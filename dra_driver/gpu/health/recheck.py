"""Re-checking unhealthy devices, so a GPU that is fine again is untainted without a restart.

Xid events only say that something happened. Every ``interval`` seconds the sources of
conditions at least that old are probed (NVML on real nodes, the injection file on simulated
ones); each one found healthy has the conditions cleared that are older than the probe (an
event that arrives while it runs stays for the next re-check). Probing is blocking and runs
in a thread; the decisions are the tracker's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from dra_driver.gpu.health.tracker import HealthEvent, HealthTracker

log = structlog.get_logger(__name__)

EventSink = Callable[[HealthEvent], None]


class Prober(Protocol):
    """Asks the hardware whether devices are healthy now."""

    def probe(self, sources: Sequence[str]) -> dict[str, str | None]:
        """Source (UUID or device name) -> None when healthy, else why not (blocking)."""
        ...


#: Called with the source found healthy and the devices cleared (device -> former reason).
RecoveredSink = Callable[[str, dict[str, str]], None]


async def recheck_once(
    tracker: HealthTracker, prober: Prober, interval: float, on_recovered: RecoveredSink
) -> None:
    """Probe the sources due for a re-check and clear those found healthy."""
    started = time.monotonic()
    due = tracker.due(started, interval)
    if not due:
        return
    results = await asyncio.to_thread(prober.probe, due)
    for source in due:
        reason = results.get(source, "not probed")
        if reason is not None:
            log.info("device still unhealthy after re-check", source=source, reason=reason)
            continue
        # Events keep coming while the probe runs; one that came since its start is newer
        # than its answer (an Xid the probe did not see), so it must not be cleared.
        cleared = tracker.recover(source, before=started)
        if cleared:
            on_recovered(source, cleared)


async def recheck_forever(
    tracker: HealthTracker, prober: Prober, interval: float, on_recovered: RecoveredSink
) -> None:
    """Re-check every ``interval`` seconds (until cancelled); 0 or less: never."""
    if interval <= 0:
        await asyncio.Event().wait()
    while True:
        # Half the interval: a condition is re-checked between one and one and a half
        # intervals after its latest event.
        await asyncio.sleep(interval / 2)
        await recheck_once(tracker, prober, interval, on_recovered)
