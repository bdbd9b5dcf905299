"""run_blocking keeps the caller (and so the node lock) until the thread is done."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dra_driver.kubeletplugin.lock import NodeLock
from dra_driver.kubeletplugin.threads import run_blocking


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
