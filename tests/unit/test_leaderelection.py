"""Who may hold a controller's Lease, and what a holder writes."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from dra_driver.leaderelection import lease_spec, may_take

NOW = datetime.datetime(2026, 11, 27, 3, 0, 0, tzinfo=datetime.UTC)


def lease(holder: str, seconds_ago: float, duration: Any = 15) -> dict[str, Any]:
    renewed = NOW - datetime.timedelta(seconds=seconds_ago)
    return {
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
    }


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (None, True),  # no lease yet
        (lease("", 1), True),  # released
        (lease("me", 1), True),  # ours: renew
        (lease("other", 1), False),  # held and fresh
        (lease("other", 14.9), False),
        (lease("other", 15.1), True),  # expired
        (lease("other", 1, duration=None), True),  # unreadable: nobody can hold it
        ({"spec": {"holderIdentity": "other", "leaseDurationSeconds": 15}}, True),
    ],
)
def test_may_take(current: dict[str, Any] | None, expected: bool) -> None:
    assert may_take(current, "me", NOW) is expected


def test_taking_counts_a_transition_and_renewing_does_not() -> None:
    taken = lease_spec(lease("other", 20), "me", 15, NOW)
    assert taken["holderIdentity"] == "me" and taken["leaseTransitions"] == 1
    assert taken["acquireTime"] == taken["renewTime"] == "2026-11-27T03:00:00.000000Z"
    later = NOW + datetime.timedelta(seconds=2)
    renewed = lease_spec({"spec": taken}, "me", 15, later)
    assert renewed["leaseTransitions"] == 1
    assert renewed["acquireTime"] == taken["acquireTime"]
    assert renewed["renewTime"] == "2026-11-27T03:00:02.000000Z"
    assert lease_spec(None, "me", 15, NOW)["leaseTransitions"] == 0
