"""One-at-a-time execution of driver calls on a node, across tasks and processes.

During a rolling update two plugin processes serve the same node; the kubelet may talk to
either. An ``fcntl.flock`` on a shared file serialises them; an ``asyncio.Lock`` in front of it
keeps tasks of one process from each parking a thread on the file lock. Blocking code (start-up,
before the plugin serves) takes the same ``flock`` with :func:`hold_file_lock`, so recovery
never runs while another agent of the node is half-way through a prepare.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import structlog

from dra_driver.cdi.writer import hold_file_lock, open_lock_file

__all__ = ["NodeLock", "hold_file_lock"]

log = structlog.get_logger(__name__)


class NodeLock:
    """Serialises critical sections within this process and with other holders of ``path``."""

    def __init__(self, path: Path | None) -> None:
        """``path`` is the lock file (created on first use); ``None`` locks this process only."""
        self._path = path
        self._mutex = asyncio.Lock()

    @property
    def path(self) -> Path | None:
        """The lock file, if any."""
        return self._path

    def locked(self) -> bool:
        """Whether some task of this process holds (or is acquiring) the lock."""
        return self._mutex.locked()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold the lock for the body of an ``async with``.

        Cancellation while waiting never leaves the lock held: if the thread waiting on the
        file lock cannot be interrupted, it releases the file and the mutex as soon as it
        returns.
        """
        await self._mutex.acquire()
        fd: int | None = None
        owns_mutex = True
        try:
            if self._path is not None:
                fd = open_lock_file(self._path)
                # A fresh descriptor per acquisition: flock conflicts between open file
                # descriptions, so even a stray thread of this process cannot share it.
                if not _try_flock(fd):
                    # Another agent of the node holds it: wait in a thread, not on the loop.
                    waiter = asyncio.get_running_loop().run_in_executor(
                        None, fcntl.flock, fd, fcntl.LOCK_EX
                    )
                    try:
                        await asyncio.shield(waiter)
                    except asyncio.CancelledError:
                        if not waiter.done():
                            self._release_later(waiter, fd)
                            fd, owns_mutex = None, False
                        raise
            yield
        finally:
            if fd is not None:
                os.close(fd)  # closing the last descriptor drops the flock
            if owns_mutex:
                self._mutex.release()

    def _release_later(self, waiter: asyncio.Future[None], fd: int) -> None:
        """Hand ``fd`` and the mutex to a callback that frees them when ``waiter`` ends."""

        def release(done: asyncio.Future[None]) -> None:
            if not done.cancelled():
                done.exception()  # retrieved on purpose: nobody awaits this future any more
            os.close(fd)
            self._mutex.release()
            log.debug("lock released after cancelled acquisition", lock=str(self._path))

        waiter.add_done_callback(release)


def _try_flock(fd: int) -> bool:
    """Take the file lock if it is free, without waiting (the usual case: one agent)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
