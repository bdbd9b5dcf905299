"""run_blocking keeps the caller (and so the node lock) until the thread is done;
InlineRunner runs short work on the loop unless others wait or the work was slow."""

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
from dra_driver.kubeletplugin.threads import OTHER_CALLS, CpuWait, InlineRunner, run_blocking


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


async def test_work_goes_to_a_thread_while_other_calls_are_in_progress() -> None:
    runner = InlineRunner()
    others = OTHER_CALLS.set(3)
    try:
        assert not runner.inline
        assert await runner.run(threading.get_ident) != threading.get_ident()
    finally:
        OTHER_CALLS.reset(others)
    assert runner.inline


def _stall(clock: _Clock, seconds: float = 0.5) -> Callable[[], int]:
    def slow() -> int:
        clock.now += seconds  # the disk stalled
        return threading.get_ident()

    return slow


async def test_slow_work_sends_later_work_to_a_thread_for_the_cooldown() -> None:
    clock = _Clock()
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, cpu_wait=lambda: 0.0)

    assert await runner.run(_stall(clock)) == threading.get_ident()  # still ran on the loop
    assert not runner.inline
    assert await runner.run(threading.get_ident) != threading.get_ident()
    clock.now += 0.9
    assert not runner.inline
    clock.now += 0.1  # one slow call: a second in threads
    assert runner.inline
    assert await runner.run(threading.get_ident) == threading.get_ident()


async def test_slow_calls_in_a_row_double_the_time_in_threads_up_to_the_cooldown() -> None:
    clock = _Clock()
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, cpu_wait=lambda: 0.0)
    periods = []
    for _ in range(9):
        await runner.run(_stall(clock))
        ended = clock.now
        while not runner.inline:
            clock.now += 0.25
        periods.append(clock.now - ended)
    assert periods == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


async def test_a_slow_call_long_after_the_last_starts_again_at_a_second() -> None:
    clock = _Clock()
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, cpu_wait=lambda: 0.0)
    for _ in range(3):  # 1, 2 and 4 s in threads
        await runner.run(_stall(clock))
        clock.now += 4.0
    assert runner.inline
    clock.now += 61.0  # fast calls for over a minute
    await runner.run(_stall(clock))
    clock.now += 1.0
    assert runner.inline


async def test_work_slow_only_from_waiting_for_a_cpu_stays_on_the_loop() -> None:
    clock = _Clock()
    waited = [3.0]
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, cpu_wait=lambda: waited[0])

    def preempted() -> int:
        clock.now += 0.5
        waited[0] += 0.49  # other processes had the CPU: the work itself took 10 ms
        return threading.get_ident()

    assert await runner.run(preempted) == threading.get_ident()
    assert runner.inline
    assert await runner.run(threading.get_ident) == threading.get_ident()


@pytest.mark.skipif(
    not Path("/proc/thread-self/schedstat").exists(), reason="no per-thread schedstat here"
)
def test_cpu_wait_grows_while_other_processes_have_the_cpus() -> None:
    wait = CpuWait()
    first = wait()
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
    assert wait() > first


def test_cpu_wait_is_zero_without_schedstat(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> int:
        raise FileNotFoundError("no /proc")

    monkeypatch.setattr(os, "open", refuse)
    assert CpuWait()() == 0.0


async def test_an_exception_on_the_loop_reaches_the_caller_and_counts_its_time() -> None:
    clock = _Clock()
    runner = InlineRunner(limit=0.02, cooldown=60.0, clock=clock, cpu_wait=lambda: 0.0)

    def fails() -> None:
        clock.now += 1.0
        raise OSError("no space left on device")

    with pytest.raises(OSError, match="no space"):
        await runner.run(fails)
    assert not runner.inline
