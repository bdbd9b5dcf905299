"""Time-slicing: what to set at prepare and what to reset at unprepare.

The interval is a GPU-wide compute policy (``nvidia-smi compute-policy --set-timeslice``), so
it is set on whole GPUs only. A MIG device has no interval of its own: processes on one MIG
device are time-sliced by the GPU instance's scheduler with its fixed default, and changing the
parent GPU's policy would change it for every other MIG device too. A MIG device configured for
time-slicing is therefore prepared without a hardware step (the driver logs it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import structlog

from dra_driver import faults
from dra_driver.gpu.allocation import AllocatedDevice
from dra_driver.gpu.sharing.backend import SharingBackend, SharingError
from dra_driver.gpu.sharing.strategy import Strategy, sharable
from dra_driver.gpu.state.checkpoint import ClaimRecord

log = structlog.get_logger(__name__)

#: ``nvidia-smi compute-policy --set-timeslice`` values.
TIMESLICE_VALUES: Mapping[str, int] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}


def timeslice_value(interval: str) -> int:
    """The ``--set-timeslice`` argument for an interval name."""
    try:
        return TIMESLICE_VALUES[interval]
    except KeyError:
        raise ValueError(
            f"time-slice interval {interval!r} is not one of {', '.join(TIMESLICE_VALUES)}"
        ) from None


def timesliced(claims: Iterable[ClaimRecord]) -> dict[str, str]:
    """GPU UUID -> interval, for every GPU a claim among ``claims`` time-slices."""
    out: dict[str, str] = {}
    for claim in claims:
        for device in claim.devices:
            if device.timeslice is not None and device.uuid:
                out[device.uuid] = device.timeslice
    return out


def to_reset(released: Iterable[ClaimRecord], remaining: Iterable[ClaimRecord]) -> list[str]:
    """GPUs the released claims time-sliced that no remaining claim still time-slices."""
    still = timesliced(remaining)
    return sorted(uuid for uuid in timesliced(released) if uuid not in still)


class TimeSlicing(Strategy):
    """``strategy: TimeSlicing``: the GPU's time-slice interval, for whole GPUs only."""

    def annotate(
        self,
        claim_uid: str,
        devices: Sequence[AllocatedDevice],
        record: ClaimRecord,
        mps_root: Path,
    ) -> None:
        """Record the interval to set on each whole GPU configured for time-slicing (not on
        a MIG device made on demand: it has no MIG device yet, but its record names one)."""
        for device, rec in sharable(devices, record):
            whole = device.type == "gpu" and rec.mig is None
            if device.share is None and device.strategy == "TimeSlicing" and whole:
                sharing = device.config.sharing if device.config else None
                slicing = getattr(sharing, "time_slicing_config", None)
                rec.timeslice = slicing.interval if slicing else "Default"

    def apply(self, claim: str, record: ClaimRecord, backend: SharingBackend) -> None:
        """Set the recorded intervals."""
        for rec in record.devices:
            if rec.timeslice is not None:
                backend.set_timeslice(rec.uuid, rec.timeslice)
                faults.point("prepare.timeslice-set")
                log.info("time-slice applied", claim=claim, uuid=rec.uuid, interval=rec.timeslice)

    def release(
        self,
        released: Sequence[ClaimRecord],
        remaining: Sequence[ClaimRecord],
        backend: SharingBackend,
    ) -> list[str]:
        """Reset the GPUs only the released claims time-sliced."""
        errors: list[str] = []
        for uuid in to_reset(released, remaining):
            try:
                backend.reset_timeslice(uuid)
                log.info("time-slice reset", uuid=uuid)
            except SharingError as exc:
                errors.append(str(exc))
        return errors
