"""Running a driver's blocking work without outliving the node lock or stalling the loop.

Cancelling ``asyncio.to_thread`` abandons the thread, which keeps running: the caller would
release the node lock while the work goes on, and the next prepare or unprepare could overlap
it. ``run_blocking`` instead lets the thread finish, then passes the cancellation on.

Work that only writes a file or two takes less time than handing it to a thread and back
(two wake-ups of a sleeping thread); ``InlineRunner`` runs such work on the loop for as long
as it stays short. Time the loop's thread spent waiting for a CPU (other processes of a busy
node) does not count against it: only a slow disk sends the work to threads.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
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


#: Longest a call run on the loop may take before such calls go to a thread again: a health
#: stream, a liveness probe and the claim reads of other calls wait while it runs.
INLINE_LIMIT = 0.02

#: How long short work runs in a thread after a call on the loop took too long (the disk was
#: slow: an fsync behind an image pull's writes); then the loop tries again. A slow call
#: within :data:`THREAD_COOLDOWN` of the end of the last such time doubles it, up to that: one slow
#: fsync (behind another process's journal commit) costs a second of threads, which take a
#: third more CPU per call, while a disk that stays slow stalls the loop at most once a minute.
FIRST_COOLDOWN = 1.0
THREAD_COOLDOWN = 60.0


#: How many other prepare or unprepare calls of the kubelet are in progress while a driver call
#: runs (the node service sets it around its driver calls). With others in progress, work goes
#: to a thread even when short: their claim reads go on meanwhile, and they join the next
#: batch instead of each paying for its own sync.
OTHER_CALLS: ContextVar[int] = ContextVar("other_calls", default=0)


class CpuWait:
    """How long the calling thread has waited for a CPU so far, in seconds: the run delay
    of Linux's ``/proc/thread-self/schedstat`` (0 where there is none). Keeps the file open
    per thread; a read costs one ``pread``."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def __call__(self) -> float:
        me = threading.get_ident()
        fd = self._fds.get(me)
        if fd is None:
            try:
                fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            self._fds[me] = fd
        if fd < 0:
            return 0.0
        try:
            return int(os.pread(fd, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0


class InlineRunner:
    """Runs short blocking calls on the loop when nothing else waits for it, and in a worker
    thread otherwise or once such a call was slow."""

    def __init__(
        self,
        limit: float = INLINE_LIMIT,
        cooldown: float = THREAD_COOLDOWN,
        clock: Callable[[], float] = time.monotonic,
        cpu_wait: Callable[[], float] | None = None,
        first_cooldown: float = FIRST_COOLDOWN,
    ) -> None:
        """``cpu_wait``: seconds the thread has waited for a CPU so far (:class:`CpuWait`).
        The time in threads after a slow call starts at ``first_cooldown`` and doubles up to
        ``cooldown`` while slow calls keep coming (see :data:`FIRST_COOLDOWN`)."""
        self._limit = limit
        self._first_cooldown = min(first_cooldown, cooldown)
        self._max_cooldown = cooldown
        self._cooldown = self._first_cooldown
        self._clock = clock
        self._cpu_wait = cpu_wait if cpu_wait is not None else CpuWait()
        self._threaded_until = float("-inf")

    @property
    def inline(self) -> bool:
        """Whether a short call now runs on the loop."""
        return OTHER_CALLS.get() == 0 and self._clock() >= self._threaded_until

    async def run(self, func: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``func(*args, **kwargs)`` on the loop when :attr:`inline`, else in a thread
        (:func:`run_blocking`)."""
        if not self.inline:
            return await run_blocking(func, *args, **kwargs)
        started, waited = self._clock(), self._cpu_wait()
        try:
            return func(*args, **kwargs)
        finally:
            took = self._clock() - started
            if took > self._limit:
                # A thread would wait for the CPU as long: only the rest is the work's own.
                cpu_wait = self._cpu_wait() - waited
                if took - cpu_wait > self._limit:
                    self._slow(started + took, took, cpu_wait)

    def _slow(self, now: float, took: float, cpu_wait: float) -> None:
        """Send short work to threads for a while after a slow call ended at ``now``."""
        if now - self._threaded_until > self._max_cooldown:
            self._cooldown = self._first_cooldown  # the last slow call is long past
        else:
            self._cooldown = min(2 * self._cooldown, self._max_cooldown)
        self._threaded_until = now + self._cooldown
        log.warning(
            "short driver work was slow: running it in a thread for a while",
            took_s=round(took, 3),
            cpu_wait_s=round(cpu_wait, 3),
            limit_s=self._limit,
            for_s=self._cooldown,
        )
