"""run_blocking keeps the caller (and so the node lock) until the thread is done;
InlineRunner runs short work on the loop unless others wait on a slow disk or the work was
blocked too long."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver.kubeletplugin.lock import NodeLock
from dra_driver.kubeletplugin.threads import (
    HANDOFF_WORTH,
    LONE_LIMIT,
    OTHER_CALLS,
    PROBE_EVERY,
    InlineRunner,
    RunnableTime,
    run_blocking,
)


async def test_returns_result() -> None:
    assert await run_blocking(lambda a, b: a + b, 2, b=3) == 5


async def test_cancellation_waits_for_thread_and_lock_follows() -> None:
    lock = NodeLock(None)
    release = threading.Event()
    finished = threading.Event()

    def slow() -> None:
        release.wait(5)
        time.sleep(0.05)
        finished.set()

    async def call() -> None:
        async with lock.hold():
            await run_blocking(slow)

    task = asyncio.create_task(call())
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.05)
    # Cancelled, but the thread still runs: the lock must still be held.
    assert not task.done()
    assert lock.locked()
    task.cancel()  # a second cancellation changes nothing
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()
    assert not lock.locked()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_short_work_runs_on_the_loop_thread() -> None:
    runner = InlineRunner()
    assert await runner.run(threading.get_ident) == threading.get_ident()


def _blocking(clock: _Clock, seconds: float) -> Callable[[], int]:
    def sync() -> int:
        clock.now += seconds  # blocked in an fsync that long
        return threading.get_ident()

    return sync


async def _ran_inline(runner: InlineRunner, work: Callable[[], int]) -> bool:
    return await runner.run(work) == threading.get_ident()


async def test_with_others_in_progress_work_stays_on_the_loop_while_the_disk_is_fast() -> None:
    clock = _Clock()
    runner = InlineRunner(clock=clock, runnable=lambda: 0.0)
    others = OTHER_CALLS.set(15)
    try:
        for _ in range(3 * PROBE_EVERY):
            assert await _ran_inline(runner, _blocking(clock, HANDOFF_WORTH / 2))
    finally:
        OTHER_CALLS.reset(others)


async def test_with_others_in_progress_a_slow_disk_sends_work_to_a_thread_but_probes() -> None:
    clock = _Clock()
    runner = InlineRunner(clock=clock, runnable=lambda: 0.0)
    slow_sync = _blocking(clock, 4 * HANDOFF_WORTH)
    for _ in range(8):  # lone calls on the loop learn how long a sync blocks
        assert await _ran_inline(runner, slow_sync)
    others = OTHER_CALLS.set(15)
    try:
        where = [await _ran_inline(runner, slow_sync) for _ in range(2 * PROBE_EVERY)]
    finally:
        OTHER_CALLS.reset(others)
    # One call in PROBE_EVERY still runs on the loop, to notice a disk fast again.
    assert where == 2 * ([False] * (PROBE_EVERY - 1) + [True])
    assert await _ran_inline(runner, slow_sync)  # a lone call is never handed off


async def test_a_disk_fast_again_brings_work_back_to_the_loop() -> None:
    clock = _Clock()
    runner = InlineRunner(clock=clock, runnable=lambda: 0.0)
    for _ in range(8):
        await runner.run(_blocking(clock, 4 * HANDOFF_WORTH))
    fast_sync = _blocking(clock, HANDOFF_WORTH / 10)
    others = OTHER_CALLS.set(15)
    try:
        where = [await _ran_inline(runner, fast_sync) for _ in range(8 * PROBE_EVERY)]
    finally:
        OTHER_CALLS.reset(others)
    # Each probe on the loop moves the estimate; a few probes later no call is handed off.
    assert not where[0]
    assert all(where[-PROBE_EVERY:])


def _stall(clock: _Clock, seconds: float = 0.5) -> Callable[[], int]:
    def slow() -> int:
        clock.now += seconds  # the disk stalled
        return threading.get_ident()

    return slow


async def test_slow_work_sends_later_work_to_a_thread_for_the_cooldown() -> None:
    clock = _Clock()
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, runnable=lambda: 0.0)

    assert await runner.run(_stall(clock)) == threading.get_ident()  # still ran on the loop
    assert not runner.inline
    assert await runner.run(threading.get_ident) != threading.get_ident()
    clock.now += 0.9
    assert not runner.inline
    clock.now += 0.1  # one slow call: a second in threads
    assert runner.inline
    assert await runner.run(threading.get_ident) == threading.get_ident()


async def test_a_lone_call_stays_on_the_loop_unless_the_disk_stalls_for_long() -> None:
    # Nothing but the loop's background work waits for a lone call: a slow fsync of 0.1 s
    # is not worth a thread's CPU; a stall past LONE_LIMIT is.
    clock = _Clock()
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, runnable=lambda: 0.0)
    for _ in range(3):
        assert await _ran_inline(runner, _stall(clock, 0.1))
        assert runner.inline
    assert await _ran_inline(runner, _stall(clock, LONE_LIMIT + 0.01))
    assert not runner.inline


async def test_with_others_in_progress_a_shorter_stall_sends_work_to_a_thread() -> None:
    clock = _Clock()
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, runnable=lambda: 0.0)
    others = OTHER_CALLS.set(1)
    try:
        assert await _ran_inline(runner, _stall(clock, 0.1))
        assert not runner.inline
    finally:
        OTHER_CALLS.reset(others)


async def _times_in_threads(stalls: int, fast_for: Callable[[float], float]) -> list[float]:
    """How long work stays in threads after each of ``stalls`` slow calls, when the loop
    then runs fast calls for ``fast_for(that time)`` seconds before the next slow one."""
    clock = _Clock()
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, runnable=lambda: 0.0)
    periods: list[float] = []
    for _ in range(stalls):
        await runner.run(_stall(clock))
        ended = clock.now
        while not runner.inline:
            clock.now += 0.25
        periods.append(clock.now - ended)
        clock.now += fast_for(periods[-1])
    return periods


async def test_slow_calls_in_a_row_double_the_time_in_threads_up_to_the_cooldown() -> None:
    periods = await _times_in_threads(9, lambda _: 0.0)
    assert periods == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


async def test_a_slow_call_soon_after_the_time_in_threads_doubles_it() -> None:
    # Slow again before the loop ran as long as the last time in threads.
    assert await _times_in_threads(4, lambda last: 0.5 * last) == [1.0, 2.0, 4.0, 8.0]


async def test_stray_slow_calls_cost_a_second_of_threads_each() -> None:
    # A busy node's disk: one fsync in a while waits behind another process's journal
    # commit. Each costs a second in threads; they do not add up to a minute.
    assert await _times_in_threads(6, lambda _: 12.0) == [1.0] * 6


async def test_a_slow_call_long_after_the_last_starts_again_at_a_second() -> None:
    # 1, 2, 4, 8 and 16 s in threads; then fast calls for longer than the last of those.
    periods = await _times_in_threads(6, lambda last: 16.5 if last == 16.0 else 0.0)
    assert periods == [1.0, 2.0, 4.0, 8.0, 16.0, 1.0]


async def test_work_slow_only_from_its_cpu_time_or_waiting_for_a_cpu_stays_on_the_loop() -> None:
    clock = _Clock()
    runnable = [3.0]
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, runnable=lambda: runnable[0])

    def preempted() -> int:
        clock.now += 0.5
        # 0.2 s of its own CPU (a batch of many claims), 0.29 s waiting for a CPU (other
        # processes had it): blocked for 10 ms, within the limit.
        runnable[0] += 0.49
        return threading.get_ident()

    assert await runner.run(preempted) == threading.get_ident()
    assert runner.inline
    assert await runner.run(threading.get_ident) == threading.get_ident()


@pytest.mark.skipif(
    not Path("/proc/thread-self/schedstat").exists(), reason="no per-thread schedstat here"
)
def test_runnable_time_grows_while_the_thread_runs_or_waits_for_a_cpu() -> None:
    runnable = RunnableTime()
    first = runnable()
    spin = "import time\nend = time.monotonic() + 0.5\nwhile time.monotonic() < end: pass"
    burners = [
        subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            pass
    finally:
        for b in burners:
            b.wait()
    # The thread spun for 0.5 s of wall time, on a CPU or waiting for one throughout.
    assert runnable() - first > 0.45


@pytest.mark.skipif(
    not Path("/proc/thread-self/schedstat").exists(), reason="no per-thread schedstat here"
)
def test_runnable_time_stands_still_while_the_thread_is_blocked() -> None:
    runnable = RunnableTime()
    first = runnable()
    time.sleep(0.3)
    assert runnable() - first < 0.1


@pytest.mark.skipif(
    not Path("/proc/thread-self/schedstat").exists(), reason="no per-thread schedstat here"
)
def test_runnable_time_opens_its_file_when_made_and_closes_it_when_gone() -> None:
    # The agent's descriptors before its first prepare are the ones it has after it.
    def schedstat_files() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir() if "schedstat" in _link(fd))

    before = schedstat_files()
    runnable = RunnableTime()
    assert schedstat_files() == before + 1
    runnable()
    runnable()
    assert schedstat_files() == before + 1
    del runnable  # and closes it when it goes
    assert schedstat_files() == before


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:  # the directory's own descriptor, closed by now
        return ""


def test_without_schedstat_runnable_time_is_the_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> int:
        raise FileNotFoundError("no /proc")

    monkeypatch.setattr(os, "open", refuse)
    monkeypatch.setattr(time, "thread_time", lambda: 1.25)
    assert RunnableTime()() == 1.25


async def test_an_exception_on_the_loop_reaches_the_caller_and_counts_its_time() -> None:
    clock = _Clock()
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, runnable=lambda: 0.0)

    def fails() -> None:
        clock.now += 1.0
        raise OSError("no space left on device")

    with pytest.raises(OSError, match="no space"):
        await runner.run(fails)
    assert not runner.inline
