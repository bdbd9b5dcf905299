"""Background loops that cannot die unseen.

Each of the agent's loops (slice publisher, claim reporter, health watcher) runs under
:func:`supervise`: an unexpected exception is logged with the loop's name, counted in
``dra_driver_loop_crashes_total`` and the loop is started again after a backoff. A loop that
has run for a while beats its heartbeat; :class:`Heartbeats` tells the liveness probe which
loops have been silent longer than allowed, so a loop that keeps crashing (or never gets
going again) fails the probe and the kubelet restarts the pod.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from dra_driver import metrics
from dra_driver.resourceslice.backoff import Backoff

log = structlog.get_logger(__name__)

#: A loop beats once per pulse while it runs; the first beat comes one pulse after its start.
PULSE = 5.0
#: How long a loop may go without a beat before liveness fails (several pulses plus the
#: longest restart backoff, so one crash and restart does not fail the probe).
ALLOWED_SILENCE = 90.0
#: Restart delays grow to this ceiling while a loop keeps crashing.
RESTART_CAP = 30.0


@dataclass
class Heartbeats:
    """When each supervised loop last beat; read by the liveness probe."""

    allowed: float = ALLOWED_SILENCE
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, float] = field(default_factory=dict)

    def beat(self, name: str) -> None:
        """Record that ``name`` is alive now (registering it on the first call)."""
        self._last[name] = self.clock()

    def stale(self) -> list[str]:
        """Loops that have not beaten within the allowed silence."""
        now = self.clock()
        return sorted(n for n, at in self._last.items() if now - at > self.allowed)

    def problem(self) -> str | None:
        """None while every loop beats, else which do not (one line, for the probe)."""
        stale = self.stale()
        return f"background loops not alive: {', '.join(stale)}" if stale else None


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    heartbeats: Heartbeats,
    *,
    pulse: float = PULSE,
    restart_cap: float = RESTART_CAP,
) -> None:
    """Run ``run()`` until cancelled, restarting it after a crash (or an unexpected return).

    Cancellation is the only way out: it is how the agent stops its loops.
    """
    heartbeats.beat(name)  # counts as alive while it starts
    backoff = Backoff(cap=restart_cap)
    while True:
        task = asyncio.create_task(_run(run), name=name)
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=pulse)
                if not done:
                    heartbeats.beat(name)
                    backoff.reset()  # it ran a whole pulse: the next crash starts afresh
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        error: BaseException | None
        if task.cancelled():
            # Nobody cancelled the supervisor (that raised above): the loop let a
            # CancelledError of a call beneath it escape. A crash like any other, or the
            # loop would end unseen and only liveness would notice.
            error = asyncio.CancelledError("cancelled from within the loop")
        else:
            error = task.exception()
        metrics.LOOP_CRASHES.labels(loop=name).inc()
        delay = backoff.next_delay()
        if error is None:
            log.error("background loop ended unexpectedly", loop=name, restart_in_s=delay)
        else:
            log.error(
                "background loop crashed",
                loop=name,
                error=describe(error),
                restart_in_s=round(delay, 2),
                exc_info=error,
            )
        await asyncio.sleep(delay)


def describe(error: BaseException) -> str:
    """``Type: message`` of an exception; of each leaf for an exception group (a loop built
    on a TaskGroup raises one), so the log names the error that happened."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(describe(e) for e in error.exceptions)
    return f"{type(error).__name__}: {error}"


async def _run(run: Callable[[], Awaitable[None]]) -> None:
    await run()
