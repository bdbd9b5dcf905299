"""Time-slicing decisions (pure): what to set at prepare and what to reset at unprepare.

The interval is a GPU-wide compute policy (``nvidia-smi compute-policy --set-timeslice``), so
it is set on whole GPUs only. A MIG device has no interval of its own: processes on one MIG
device are time-sliced by the GPU instance's scheduler with its fixed default, and changing the
parent GPU's policy would change it for every other MIG device too. A MIG device configured for
time-slicing is therefore prepared without a hardware step (the driver logs it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dra_driver.gpu.state.checkpoint import ClaimRecord

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
