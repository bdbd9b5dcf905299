"""Room for deep recursion where a bounded input needs it (a deep expression or document)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def recursion_limit_at_least(frames: int) -> Iterator[None]:
    """Run the block with Python's recursion limit raised to ``frames`` (never lowered)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, frames))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)
