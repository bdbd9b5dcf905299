"""Shares of a shared GPU (pure): what a claim was given, and whether it still fits.

The scheduler allocates a shared GPU to several claims and records in each allocation result a
``shareID`` and the ``consumedCapacity`` it counted (``memory``, ``compute``). The driver turns
that into MPS client limits and keeps its own sum per GPU, so that a stale or hand-made
allocation cannot promise more memory than the GPU has.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.cel.errors import EvalError
from dra_driver.cel.quantity import NANOS, parse_quantity
from dra_driver.gpu.state.checkpoint import ClaimRecord

MEMORY = "memory"
COMPUTE = "compute"


class ShareError(ValueError):
    """A share cannot be prepared; the message says why."""


@dataclass(frozen=True)
class Share:
    """One claim's share of a shared GPU."""

    share_id: str
    memory_bytes: int
    compute_percent: int | None = None  # None or 0: no compute limit

    @property
    def thread_percentage(self) -> int | None:
        """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for the share's clients, if limited."""
        return self.compute_percent or None


def _whole(text: str, name: str) -> int:
    try:
        nanos = parse_quantity(str(text)).nanos
    except EvalError as exc:
        raise ShareError(f"consumed capacity {name}={text!r} is not a quantity: {exc}") from None
    if nanos < 0:
        raise ShareError(f"consumed capacity {name}={text!r} is negative")
    return math.ceil(nanos / NANOS)


def consumed(capacity: Mapping[str, Any] | None) -> dict[str, int]:
    """The consumed capacity of an allocation result, as whole numbers by unqualified name."""
    out: dict[str, int] = {}
    for name, value in (capacity or {}).items():
        out[str(name).rpartition("/")[2]] = _whole(str(value), str(name))
    return out


def share_of(share_id: str, capacity: Mapping[str, Any] | None) -> Share:
    """The share an allocation result describes; it must say how much memory it got."""
    amounts = consumed(capacity)
    if amounts.get(MEMORY, 0) <= 0:
        raise ShareError(
            f"share {share_id} has no memory in its consumed capacity "
            f"({dict(capacity or {})}); is the DRAConsumableCapacity feature on?"
        )
    compute = amounts.get(COMPUTE)
    if compute is not None and not 0 <= compute <= 100:
        raise ShareError(f"share {share_id}: compute {compute} is not a percentage")
    return Share(share_id=share_id, memory_bytes=amounts[MEMORY], compute_percent=compute)


def memory_in_use(claims: Iterable[ClaimRecord], uuid: str) -> int:
    """Memory the prepared shares on GPU ``uuid`` hold, in bytes."""
    total = 0
    for claim in claims:
        for device in claim.devices:
            if device.uuid == uuid and device.share_id and device.consumed_capacity:
                total += consumed(device.consumed_capacity).get(MEMORY, 0)
    return total


def check_fits(share: Share, in_use: int, gpu_memory: int, *, gpu: str) -> None:
    """Refuse a share that would take the GPU's prepared shares past its memory."""
    if in_use + share.memory_bytes > gpu_memory:
        gib = 2**30
        raise ShareError(
            f"share {share.share_id} asks for {share.memory_bytes / gib:.1f} GiB of GPU {gpu} "
            f"but prepared shares already hold {in_use / gib:.1f} GiB of its "
            f"{gpu_memory / gib:.1f} GiB (the allocation is stale or over-committed)"
        )
