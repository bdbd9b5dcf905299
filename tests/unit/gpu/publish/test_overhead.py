"""--node-overhead: parsing, and every published device declaring it until the server drops it."""

from __future__ import annotations

import pytest

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.publish.overhead import OverheadError, overhead_fields, parse_overhead
from dra_driver.gpu.publish.publisher import NODE_ALLOCATABLE, NodePublishing
from dra_driver.resourceslice.dropped import feature_gate_for
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
