"""Exponential backoff with jitter, for retrying against an API server that is struggling."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

#: Delays stay near this ceiling: long enough not to add load, short enough to recover quickly.
DEFAULT_CAP = 30.0


def backoff_delay(
    attempt: int,
    *,
    base: float = 0.5,
    cap: float = DEFAULT_CAP,
    jitter: float = 0.5,
    rand: Callable[[], float] = random.random,
) -> float:
    """Delay before retry number ``attempt`` (0-based): ``base * 2**attempt``, capped at ``cap``.

    The delay is then scaled by a random factor in ``[1 - jitter, 1]`` so that many node agents
    that lost the API server at the same moment do not all come back at the same moment.
    """
    if attempt < 0:
        raise ValueError("attempt must be >= 0")
    # Cap the exponent first: 2**attempt overflows floats for very long outages.
    raw = min(cap, base * 2.0 ** min(attempt, 64))
    return raw * (1.0 - jitter * rand())


@dataclass
class Backoff:
    """Stateful backoff: each failure lengthens the next delay, a success resets it."""

    base: float = 0.5
    cap: float = DEFAULT_CAP
    jitter: float = 0.5
    rand: Callable[[], float] = field(default=random.random, repr=False)
    attempt: int = 0

    def next_delay(self, at_least: float = 0.0) -> float:
        """Return the delay for this failure and count it; ``at_least`` honours Retry-After."""
        delay = backoff_delay(
            self.attempt, base=self.base, cap=self.cap, jitter=self.jitter, rand=self.rand
        )
        self.attempt += 1
        return max(delay, min(at_least, self.cap))

    def reset(self) -> None:
        """Forget past failures after a success."""
        self.attempt = 0


async def pause(delay: float, other_got_through: asyncio.Event) -> None:
    """Back off for ``delay``, but stop early once the other task reached the server.

    The watcher and the reconciler back off independently during an outage; whichever gets
    through first must not leave the other asleep for up to half a minute (a watcher still
    asleep would leave deleted slices unrepaired).
    """
    other_got_through.clear()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay):
            await other_got_through.wait()
