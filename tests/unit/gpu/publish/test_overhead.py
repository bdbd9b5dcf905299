"""--node-overhead: parsing, and every published device declaring it until the server drops it."""

from __future__ import annotations

import copy

import pytest

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.publish.overhead import OverheadError, overhead_fields, parse_overhead
from dra_driver.gpu.publish.publisher import NODE_ALLOCATABLE, NodePublishing
from dra_driver.quantity import parse_quantity
from dra_driver.resourceslice.dropped import feature_gate_for
from dra_driver.resourceslice.planner import plan
from dra_driver.resourceslice.pool import render_pool
from tests.unit.slice_rules import check_pool


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("", {}),
        ("memory=512Mi", {"memory": "512Mi"}),
        (" memory = 1Gi , cpu=100m ", {"memory": "1Gi", "cpu": "100m"}),
        (
            "hugepages-2Mi=4Mi,ephemeral-storage=1G",
            {"hugepages-2Mi": "4Mi", "ephemeral-storage": "1G"},
        ),
    ],
)
def test_parse(text: str, parsed: dict[str, str]) -> None:
    assert parse_overhead(text) == parsed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memory", "must be RESOURCE=QUANTITY"),
        ("nvidia.com/gpu=1", "must be RESOURCE=QUANTITY"),
        ("memory=lots", "memory:"),
        ("memory=0", "must be more than 0"),
        ("memory=1Gi,memory=2Gi", "given twice"),
    ],
)
def test_bad_overhead_says_what_to_fix(text: str, message: str) -> None:
    with pytest.raises(OverheadError, match=message):
        parse_overhead(text)


async def test_every_device_declares_the_overhead_until_the_server_drops_it() -> None:
    inventory = SimulatedDiscovery("mixed", "n").discover()
    publishing = NodePublishing(None, inventory, overhead=parse_overhead("memory=512Mi"))
    slices = render_pool(publishing.pool("n", "gpu.dra.dev"))
    assert check_pool(slices) == []
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert devices and all(
        d["nodeAllocatableResources"] == {"memory": {"overhead": {"perPod": "512Mi"}}}
        for d in devices
    )
    assert feature_gate_for("devices[].nodeAllocatableResources") == NODE_ALLOCATABLE
    assert list(await publishing.on_dropped({NODE_ALLOCATABLE})) == [NODE_ALLOCATABLE]
    devices = [d for s in publishing.pool("n", "gpu.dra.dev").slices for d in s.devices]
    assert not any("nodeAllocatableResources" in d for d in devices)
    assert overhead_fields({}) == {}


@pytest.mark.parametrize("text", ["memory=1024Mi", "cpu=1000m", "memory=0.5Gi,cpu=0.1"])
def test_overhead_as_the_server_stores_it_needs_no_rewrite(text: str) -> None:
    """The API server stores perPod (a resource.Quantity) canonically: 1024Mi as 1Gi, 1000m
    as 1. A pool stored that way is as desired; otherwise every reconcile rewrites every slice
    at a new generation, forever."""
    inventory = SimulatedDiscovery("mixed", "n").discover()
    pool = NodePublishing(None, inventory, overhead=parse_overhead(text)).pool("n", "gpu.dra.dev")
    stored = copy.deepcopy(render_pool(pool))
    for i, obj in enumerate(stored):
        obj["metadata"] |= {"uid": f"uid-{i}", "resourceVersion": str(10 + i)}
        for dev in obj["spec"].get("devices", []):
            for res in dev.get("nodeAllocatableResources", {}).values():
                res["overhead"]["perPod"] = str(parse_quantity(res["overhead"]["perPod"]))
    assert plan(stored, pool, None).empty
