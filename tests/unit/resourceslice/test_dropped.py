"""Dropped-field detection and spec normalisation (pure functions)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from dra_driver.resourceslice.dropped import (
    UNKNOWN_GATE,
    describe_dropped,
    feature_gate_for,
    find_dropped,
)
from dra_driver.resourceslice.normalize import normalize_spec, parse_quantity, strip_paths

JSON = dict[str, Any]


def full_spec() -> JSON:
    return {
        "driver": "gpu.dra.dev",
        "nodeName": "n",
        "pool": {"name": "n", "generation": 1, "resourceSliceCount": 2},
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {"index": {"int": 0}, "migCapable": {"bool": False}},
                "capacity": {
                    "memory": {
                        "value": "80Gi",
                        "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi"}},
                    }
                },
                "consumesCounters": [{"counterSet": "gpu-0", "counters": {"sm": {"value": "7"}}}],
                "taints": [{"key": "gpu.dra.dev/unhealthy", "effect": "NoSchedule"}],
                "allowMultipleAllocations": True,
                "bindingConditions": ["ready"],
                "bindingFailureConditions": ["failed"],
            }
        ],
    }


def without(spec: JSON, *paths: str) -> JSON:
    return strip_paths(spec, paths)


@pytest.mark.parametrize(
    ("paths", "gate"),
    [
        (["devices[].consumesCounters"], "DRAPartitionableDevices"),
        (["devices[].taints"], "DRADeviceTaints"),
        (["devices[].allowMultipleAllocations"], "DRAConsumableCapacity"),
        (["devices[].capacity.*.requestPolicy"], "DRAConsumableCapacity"),
        (
            ["devices[].bindingConditions", "devices[].bindingFailureConditions"],
            "DRADeviceBindingConditions",
        ),
    ],
)
def test_dropped_device_fields_name_their_feature_gate(paths: list[str], gate: str) -> None:
    sent = full_spec()
    found = find_dropped(sent, without(sent, *paths))
    assert found == frozenset(paths)
    assert {feature_gate_for(p) for p in found} == {gate}


def test_dropped_shared_counters() -> None:
    sent = {
        "driver": "d",
        "nodeName": "n",
        "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
        "sharedCounters": [{"name": "gpu-0", "counters": {"sm": {"value": "7"}}}],
    }
    stored = without(sent, "sharedCounters")
    assert find_dropped(sent, stored) == {"sharedCounters"}
    assert describe_dropped({"sharedCounters"}) == {"DRAPartitionableDevices": ["sharedCounters"]}


def test_nothing_dropped_when_the_server_only_canonicalises() -> None:
    sent = full_spec()
    stored = full_spec()
    dev = stored["devices"][0]
    dev["capacity"]["memory"]["value"] = "81920Mi"
    dev["taints"][0]["timeAdded"] = "2025-01-01T00:00:00Z"
    assert find_dropped(sent, stored) == frozenset()


def test_empty_or_false_optional_fields_are_not_reported() -> None:
    sent = {"devices": [{"name": "a", "taints": [], "allowMultipleAllocations": False}]}
    stored = {"devices": [{"name": "a"}]}
    assert find_dropped(sent, stored) == frozenset()


def test_unknown_field_has_an_unknown_gate() -> None:
    sent = {"devices": [{"name": "a", "futureThing": {"x": 1}}]}
    assert find_dropped(sent, {"devices": [{"name": "a"}]}) == {"devices[].futureThing"}
    assert feature_gate_for("devices[].futureThing") == UNKNOWN_GATE


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", Decimal(80 * 2**30)),
        ("81920Mi", Decimal(80 * 2**30)),
        ("1.5k", Decimal(1500)),
        ("500m", Decimal("0.5")),
        ("1e3", Decimal(1000)),
        ("7", Decimal(7)),
        ("H100", None),
        ("", None),
    ],
)
def test_parse_quantity(text: str, value: Decimal | None) -> None:
    assert parse_quantity(text) == value


def test_normalize_keeps_false_attributes_and_drops_empty_fields() -> None:
    spec = {
        "devices": [
            {
                "name": "a",
                "attributes": {"x": {"bool": False}},
                "taints": [],
                "bindsToNode": False,
                "capacity": {"m": {"value": "1024Mi"}},
            }
        ]
    }
    assert normalize_spec(spec) == {
        "devices": [
            {"name": "a", "attributes": {"x": {"bool": False}}, "capacity": {"m": {"value": 2**30}}}
        ]
    }


@pytest.mark.parametrize("name", ["capacity", "counters", "nodeAllocatableResources"])
def test_an_attribute_named_like_a_quantity_map_compares_as_a_string(name: str) -> None:
    """The server keeps a string attribute as sent: a change from ``1Gi`` to ``1024Mi`` is a
    change to publish, even when the attribute's name is that of a quantity map."""

    def spec(text: str) -> dict[str, Any]:
        return {"devices": [{"name": "a", "attributes": {name: {"string": text}}}]}

    assert normalize_spec(spec("1Gi")) != normalize_spec(spec("1024Mi"))
    assert normalize_spec(spec("1Gi"))["devices"][0]["attributes"] == {name: {"string": "1Gi"}}


def test_strip_paths_leaves_the_input_alone() -> None:
    spec = full_spec()
    stripped = strip_paths(spec, ["devices[].capacity.*.requestPolicy", "nope.deeper"])
    assert "requestPolicy" not in stripped["devices"][0]["capacity"]["memory"]
    assert "requestPolicy" in spec["devices"][0]["capacity"]["memory"]


def test_a_refusal_for_a_feature_the_node_lacks_names_its_fields() -> None:
    from dra_driver.resourceslice.dropped import refused_paths

    message = (
        'resourceslices.resource.k8s.io "n-gpu.dra.dev-0" is forbidden: node "n" does not '
        "support DRANodeAllocatableResources feature"
    )
    assert refused_paths(message) == {"devices[].nodeAllocatableResources"}
    assert refused_paths("forbidden: User cannot create resource") == frozenset()


def test_an_empty_taint_value_the_server_omits_is_not_a_dropped_field() -> None:
    """A taint's ``value`` is a plain string the API server omits when empty: sent as "" it
    comes back missing. Taken for a dropped field, it was reported under an unknown feature
    gate and then left out of every comparison, so a taint whose value changed later (another
    Xid) was never published again. An empty string attribute is a value, and stays."""
    taint = {"key": "gpu.dra.dev/xid", "effect": "NoSchedule"}
    sent = {
        "devices": [
            {"name": "a", "attributes": {"s": {"string": ""}}, "taints": [taint | {"value": ""}]}
        ]
    }
    stored = {
        "devices": [
            {
                "name": "a",
                "attributes": {"s": {"string": ""}},
                "taints": [taint | {"timeAdded": "2025-01-01T00:00:00Z"}],
            }
        ]
    }
    assert find_dropped(sent, stored) == frozenset()
    assert normalize_spec(sent) == normalize_spec(stored)
    assert normalize_spec(sent)["devices"][0]["attributes"] == {"s": {"string": ""}}
