"""Running a driver's blocking work without outliving the node lock or stalling the loop.

Cancelling ``asyncio.to_thread`` abandons the thread, which keeps running: the caller would
release the node lock while the work goes on, and the next prepare or unprepare could overlap
it. ``run_blocking`` instead lets the thread finish, then passes the cancellation on.

Work that only writes a file or two takes less time than handing it to a thread and back
(two wake-ups of a sleeping thread); ``InlineRunner`` runs such work on the loop for as long
as it stays short. Only time the loop's thread spent blocked (on the disk) counts: its own
CPU time (a batch of many claims) and its wait for a CPU (other processes of a busy node)
would be the same in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

import structlog

_P = ParamSpec("_P")
_T = TypeVar("_T")

log = structlog.get_logger(__name__)


async def run_blocking(func: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run ``func`` in a worker thread; on cancellation wait for it, then re-raise."""
    work = asyncio.ensure_future(asyncio.to_thread(func, *args, **kwargs))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        while not work.done():
            try:
                await asyncio.wait([work])
            except asyncio.CancelledError:
                continue  # already on our way out; the first cancellation is re-raised below
        if not work.cancelled():
            work.exception()  # the caller is gone; the outcome is only reported by the driver
        raise


#: Longest a call run on the loop while other calls of the kubelet are in progress may be
#: blocked (on the disk) before such calls go to a thread again: the claim reads of the
#: other calls wait while it runs.
INLINE_LIMIT = 0.02

#: The same for a call with no other call in progress (the usual prepare: one pod at a
#: time). Only the loop's background work waits for it: a health stream, the liveness probe
#: (its timeout is seconds) and status reports. A thread would give these a few
#: milliseconds back at the price of about a third more CPU per call, so only a disk that
#: stalls for this long sends lone calls to threads.
LONE_LIMIT = 0.25

#: How long short work runs in a thread after a call on the loop took too long (the disk was
#: slow: an fsync behind an image pull's writes); then the loop tries again. A slow call
#: that comes before the loop has run as long as that time in threads doubles it, up to
#: :data:`THREAD_COOLDOWN`; one after a longer run of fast calls starts again at a second.
#: So a disk that stays slow stalls the loop at most once a minute, while the odd slow fsync
#: (behind another process's journal commit; seconds to tens of seconds apart on a busy VM,
#: measured) costs a second of threads each, which take a third more CPU per call, instead of
#: adding up to a minute.
FIRST_COOLDOWN = 1.0
THREAD_COOLDOWN = 60.0

#: Blocked time of a call on the loop above which, with other calls of the kubelet in
#: progress, a thread is worth its hand-off: the loop reads their claims meanwhile and they
#: join the next batch. Measured at 16 and 64 concurrent plain claims: with a 0.25 ms
#: fdatasync the loop gave 1.08-1.13x and 0.97-1.05x the claims/s of the thread (two runs of
#: 12 rounds); with 0.75 ms, 0.94x and 0.81x; with 1.75 ms, 0.72x and 0.62x.
HANDOFF_WORTH = 0.0005

#: With other calls in progress and a disk slower than :data:`HANDOFF_WORTH`, every this
#: many calls one still runs on the loop, to notice when the disk got fast again.
PROBE_EVERY = 16

#: How much each call's blocked time moves the estimate (an exponential moving average).
BLOCKED_WEIGHT = 0.25

#: How many other prepare or unprepare calls of the kubelet are in progress while a driver call
#: runs (the node service sets it around its driver calls).
OTHER_CALLS: ContextVar[int] = ContextVar("other_calls", default=0)


class RunnableTime:
    """How long the calling thread has been runnable so far, in seconds: its CPU time, and
    its wait for a CPU (the run delay of Linux's ``/proc/thread-self/schedstat``; 0 where
    there is none). The rest of a call's wall time is time it was blocked. Keeps the file
    open per thread; a read costs one ``pread``.

    The CPU time is the thread's clock, not schedstat's first field, which for a running
    thread lags by up to a scheduler tick."""

    def __init__(self) -> None:
        """Opens the file of the creating thread (the event loop's, which asks) right away,
        so that the agent's descriptors are the same before its first call as after it."""
        self._fds: dict[int, int] = {}
        weakref.finalize(self, _close_all, self._fds)
        self._fd()

    def _fd(self) -> int:
        """The calling thread's open schedstat file, -1 where there is none."""
        me = threading.get_ident()
        fd = self._fds.get(me)
        if fd is None:
            try:
                fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            self._fds[me] = fd
        return fd

    def __call__(self) -> float:
        fd = self._fd()
        on_cpu = time.thread_time()
        if fd < 0:
            return on_cpu
        try:
            return on_cpu + int(os.pread(fd, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return on_cpu


def _close_all(fds: dict[int, int]) -> None:
    """Close the files of a :class:`RunnableTime` that is gone."""
    for fd in fds.values():
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class InlineRunner:
    """Runs short blocking calls on the loop, and in a worker thread while others wait and
    the calls block for long (see :data:`HANDOFF_WORTH`) or for a while after one was
    blocked too long (see :data:`INLINE_LIMIT` and :data:`LONE_LIMIT`)."""

    def __init__(
        self,
        limit: float = INLINE_LIMIT,
        cooldown: float = THREAD_COOLDOWN,
        clock: Callable[[], float] = time.monotonic,
        runnable: Callable[[], float] | None = None,
        first_cooldown: float = FIRST_COOLDOWN,
        lone_limit: float = LONE_LIMIT,
    ) -> None:
        """``runnable``: seconds the thread has been runnable so far (:class:`RunnableTime`).
        A call is slow when blocked longer than ``limit``, or ``lone_limit`` without other
        calls in progress. The time in threads after a slow call starts at
        ``first_cooldown`` and doubles up to ``cooldown`` while slow calls keep coming (see
        :data:`FIRST_COOLDOWN`)."""
        self._limit = limit
        self._lone_limit = max(lone_limit, limit)
        self._first_cooldown = min(first_cooldown, cooldown)
        self._max_cooldown = cooldown
        self._cooldown = self._first_cooldown
        self._clock = clock
        self._runnable = runnable if runnable is not None else RunnableTime()
        self._threaded_until = float("-inf")
        self._blocked = 0.0  # estimated blocked time of a call on the loop
        self._handed_off = 0  # calls sent to a thread since the last one on the loop

    @property
    def inline(self) -> bool:
        """Whether a short call now runs on the loop."""
        if self._clock() < self._threaded_until:
            return False
        if OTHER_CALLS.get() == 0 or self._blocked <= HANDOFF_WORTH:
            return True
        return self._handed_off >= PROBE_EVERY - 1

    async def run(self, func: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``func(*args, **kwargs)`` on the loop when :attr:`inline`, else in a thread
        (:func:`run_blocking`)."""
        if not self.inline:
            self._handed_off += 1
            return await run_blocking(func, *args, **kwargs)
        self._handed_off = 0
        limit = self._limit if OTHER_CALLS.get() else self._lone_limit
        started, runnable = self._clock(), self._runnable()
        try:
            return func(*args, **kwargs)
        finally:
            took = self._clock() - started
            # Only blocked time is what a thread would give back to the loop: the work's own
            # CPU time holds the GIL there too, and a thread waits for a CPU as long.
            ran = self._runnable() - runnable
            blocked = max(0.0, took - ran)
            self._blocked += BLOCKED_WEIGHT * (blocked - self._blocked)
            if blocked > limit:
                self._slow(started + took, took, ran, limit)

    def _slow(self, now: float, took: float, ran: float, limit: float) -> None:
        """Send short work to threads for a while after a slow call ended at ``now``."""
        if now - self._threaded_until > self._cooldown:
            # The loop ran fast for longer than the last time in threads: a stray slow call.
            self._cooldown = self._first_cooldown
        else:
            self._cooldown = min(2 * self._cooldown, self._max_cooldown)
        self._threaded_until = now + self._cooldown
        log.warning(
            "short driver work was slow: running it in a thread for a while",
            took_s=round(took, 3),
            runnable_s=round(ran, 3),
            limit_s=limit,
            for_s=self._cooldown,
        )
