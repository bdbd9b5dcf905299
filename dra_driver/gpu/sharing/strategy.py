"""The interface every sharing strategy implements.

A strategy is one way several processes or claims share a GPU: time-slicing and MPS (asked for
in a claim's config) and shared GPUs (several claims on one GPU, limited by MPS). The
:class:`~dra_driver.gpu.sharing.manager.SharingManager` runs every strategy of
:data:`dra_driver.gpu.sharing.registry.STRATEGIES` at each step of a prepare or unprepare; a
strategy overrides the steps it takes part in. MPS control daemons are a resource two
strategies use, so the manager starts and stops them from what the strategies record.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dra_driver.gpu.allocation import AllocatedDevice
from dra_driver.gpu.sharing.backend import SharingBackend
from dra_driver.gpu.state.checkpoint import ClaimRecord, DeviceRecord


class Strategy:
    """One sharing strategy; every step does nothing unless overridden."""

    def check(
        self, claim: str, devices: Sequence[AllocatedDevice], prepared: Sequence[ClaimRecord]
    ) -> None:
        """Refuse a claim the strategy cannot serve (``prepared``: the other claims)."""

    def daemons(self, devices: Sequence[AllocatedDevice]) -> set[str]:
        """The MPS control daemons the claim's devices need (a container talks to one)."""
        return set()

    def annotate(
        self,
        claim_uid: str,
        devices: Sequence[AllocatedDevice],
        record: ClaimRecord,
        mps_root: Path,
    ) -> None:
        """Write into the claim's record every step :meth:`apply` will take, before it is
        taken, so that a crash leaves enough to undo it."""

    def apply(self, claim: str, record: ClaimRecord, backend: SharingBackend) -> None:
        """Take the recorded steps (idempotent)."""

    def release(
        self,
        released: Sequence[ClaimRecord],
        remaining: Sequence[ClaimRecord],
        backend: SharingBackend,
    ) -> list[str]:
        """Undo what the released claims needed and no remaining claim does; the errors."""
        return []


def sharable(
    devices: Sequence[AllocatedDevice], record: ClaimRecord
) -> list[tuple[AllocatedDevice, DeviceRecord]]:
    """The devices a strategy may act on, with their records: all but admin access."""
    pairs = zip(devices, record.devices, strict=True)
    return [(d, r) for d, r in pairs if r.sharing != "admin"]
