"""Running a driver's blocking work in a thread without outliving the node lock.

Cancelling ``asyncio.to_thread`` abandons the thread, which keeps running: the caller would
release the node lock while the work goes on, and the next prepare or unprepare could overlap
it. ``run_blocking`` instead lets the thread finish, then passes the cancellation on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")


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
