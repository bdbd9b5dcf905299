"""The slice checker refuses what the API server's validation refuses (validateResourceSliceSpec,
validateCounterSet, validateDeviceCounterConsumption, validateDeviceTaint,
validateDeviceBindingParameters of resource.k8s.io/v1, 1.35+ limits)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.slice_rules import check_slice

JSON = dict[str, Any]
ONE = {"value": "1"}


def _slice(spec: JSON) -> JSON:
    base = {
        "driver": "gpu.dra.dev",
        "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "n-gpu.dra.dev-0"},
        "spec": {**base, "nodeName": "n", **spec},
    }


def _dev(**fields: Any) -> JSON:
    return {"name": "gpu-0", **fields}


def _set(name: str, n: int = 1) -> JSON:
    return {"name": name, "counters": {f"c-{i}": ONE for i in range(n)}}


REFUSED = {
    "9 counter sets in a slice": {"sharedCounters": [_set(f"s-{i}") for i in range(9)]},
    "33 counters in a set": {"sharedCounters": [_set("s", 33)]},
    "counter set without counters": {"sharedCounters": [{"name": "s", "counters": {}}]},
    "duplicate counter set names": {"sharedCounters": [_set("s"), _set("s")]},
    "counter name not a DNS label": {"sharedCounters": [{"name": "s", "counters": {"SM": ONE}}]},
    "counter set name not a DNS label": {"sharedCounters": [_set("gpu.0")]},
    "counter value not a quantity": {
        "sharedCounters": [{"name": "s", "counters": {"c": {"value": "lots"}}}]
    },
    "devices beside sharedCounters, even empty": {"sharedCounters": [_set("s")], "devices": []},
    "3 counter consumptions per device": {
        "devices": [
            _dev(
                consumesCounters=[
                    {"counterSet": f"s-{i}", "counters": {"c": ONE}} for i in range(3)
                ]
            )
        ]
    },
    "33 counters consumed from one set": {
        "devices": [
            _dev(
                consumesCounters=[
                    {"counterSet": "s", "counters": {f"c-{i}": ONE for i in range(33)}}
                ]
            )
        ]
    },
    "a consumption without counters": {
        "devices": [_dev(consumesCounters=[{"counterSet": "s", "counters": {}}])]
    },
    "17 taints": {
        "devices": [_dev(taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)])]
    },
    "taint effect unknown": {"devices": [_dev(taints=[{"key": "k", "effect": "Evict"}])]},
    "taint key not a label name": {
        "devices": [_dev(taints=[{"key": "a b", "effect": "NoSchedule"}])]
    },
    "binding conditions without failure conditions": {
        "devices": [_dev(bindingConditions=["Ready"])]
    },
    "5 binding conditions": {
        "devices": [
            _dev(bindingConditions=[f"c{i}" for i in range(5)], bindingFailureConditions=["f"])
        ]
    },
    "a condition both binding and failing": {
        "devices": [_dev(bindingConditions=["c"], bindingFailureConditions=["c"])]
    },
}


@pytest.mark.parametrize("spec", REFUSED.values(), ids=REFUSED.keys())
def test_the_checker_refuses_what_the_api_server_refuses(spec: JSON) -> None:
    assert check_slice(_slice(spec)) != []


def test_what_the_driver_publishes_still_passes() -> None:
    counters = {
        "sharedCounters": [{"name": "gpu-0-counter-set", "counters": {"memory-slice-0": ONE}}]
    }
    assert check_slice(_slice(counters)) == []
    device = _dev(
        consumesCounters=[{"counterSet": "gpu-0-counter-set", "counters": {"memory-slice-0": ONE}}],
        taints=[{"key": "gpu.dra.dev/xid", "value": "79", "effect": "NoSchedule"}],
        bindingConditions=["MIGDeviceReady"],
        bindingFailureConditions=["MIGDeviceFailed"],
    )
    assert check_slice(_slice({"devices": [device]})) == []
