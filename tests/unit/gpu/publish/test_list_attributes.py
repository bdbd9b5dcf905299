"""--list-attributes: whole GPUs carry the MIG profiles they support as a list-type attribute,
until the API server refuses lists (DRAListTypeAttributes off, or a release before 1.36)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.mig.simulated import SimulatedMig
from dra_driver.gpu.publish.devices import list_attributes
from dra_driver.gpu.publish.publisher import LIST_ATTRIBUTES, WITHOUT, NodePublishing
from dra_driver.resourceslice.dropped import feature_gate_for, refused_list_attributes
from dra_driver.resourceslice.pool import pack_devices, render_pool
from tests.unit.slice_rules import check_pool

DRIVER = "gpu.dra.dev"


def _devices(publishing: NodePublishing) -> dict[str, dict[str, Any]]:
    slices = render_pool(publishing.pool("n", DRIVER))
    assert check_pool(slices) == []
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def test_only_mig_capable_gpus_list_their_profiles() -> None:
    inventory = SimulatedDiscovery("mixed", "n").discover()
    by_product = {g.product_name: g for g in inventory.gpus}
    assert list_attributes(by_product["NVIDIA L4"]) == {}
    h100 = next(g for g in inventory.gpus if g.product_name.startswith("NVIDIA H100"))
    profiles = list_attributes(h100)["migProfiles"]["strings"]
    assert profiles == sorted({p.name for p in h100.mig_profiles})
    assert {"1g.10gb", "3g.40gb", "7g.80gb"} <= set(profiles)


def test_listed_profile_names_are_cut_to_64_bytes() -> None:
    # Each list item is held to the limit of a single string: 64 bytes (Go's len), so a name
    # with replacement characters (three bytes each) is cut by bytes, between characters.
    h100 = SimulatedDiscovery("dgx-h100", "n").discover().gpus[0]
    odd = h100.mig_profiles[0].model_copy(update={"name": "1g.10gb" + "\ufffd" * 30})
    gpu = h100.model_copy(update={"mig_profiles": (odd, *h100.mig_profiles[1:])})
    names = list_attributes(gpu)["migProfiles"]["strings"]
    assert "1g.10gb" + "\ufffd" * 19 in names  # 7 + 19 * 3 = 64 bytes
    assert all(len(n.encode()) <= 64 for n in names)


async def test_published_on_whole_gpus_until_the_server_refuses_lists() -> None:
    inventory = SimulatedDiscovery("mixed", "n").discover()
    publishing = NodePublishing(None, inventory, list_attributes=True)
    devices = _devices(publishing)
    # gpu-2 is the H100 with MIG off; MIG devices and the L4 (gpu-3) carry no list.
    listed = {name for name, d in devices.items() if "migProfiles" in d["attributes"]}
    assert listed == {"gpu-2"}
    assert devices["gpu-2"]["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}

    assert await publishing.on_dropped({LIST_ATTRIBUTES}) == {
        LIST_ATTRIBUTES: WITHOUT[LIST_ATTRIBUTES]
    }
    assert not any("migProfiles" in d["attributes"] for d in _devices(publishing).values())
    assert await publishing.on_dropped({LIST_ATTRIBUTES}) == {}  # said once


def test_off_by_default_and_on_placements_never(tmp_path: Path) -> None:
    inventory = SimulatedDiscovery("dgx-h100", "n").discover()
    assert not any(
        "migProfiles" in d["attributes"] for d in _devices(NodePublishing(None, inventory)).values()
    )
    dynamic = NodePublishing(
        SimulatedMig(tmp_path / "mig.json", inventory), inventory, list_attributes=True
    )
    devices = _devices(dynamic)
    listed = sorted(n for n, d in devices.items() if "migProfiles" in d["attributes"])
    assert listed == [f"gpu-{i}" for i in range(8)]
    assert len(devices) > 8  # the placements, without lists


def test_lists_lower_the_devices_per_slice_to_64() -> None:
    plain = [{"name": f"d{i}", "attributes": {"a": {"int": i}}} for i in range(128)]
    assert [len(s) for s in pack_devices(plain)] == [128]
    listed = [{"name": f"d{i}", "attributes": {"a": {"ints": [i]}}} for i in range(128)]
    assert [len(s) for s in pack_devices(listed)] == [64, 64]


def _invalid(reason: str, field: str) -> dict[str, Any]:
    """A 422 Status as ``apierrors.NewInvalid`` writes it (message left out: not read)."""
    return {
        "kind": "Status",
        "reason": "Invalid",
        "code": 422,
        "details": {"causes": [{"reason": reason, "field": field, "message": "..."}]},
    }


# The hand-written validation of 1.34 to 1.36 (Required) and the one of 1.37 and declarative
# validation (Invalid: "exactly one value must be specified").
@pytest.mark.parametrize("reason", ["FieldValueRequired", "FieldValueInvalid"])
def test_a_refusal_of_list_values_names_the_list_fields(reason: str) -> None:
    spec = {
        "devices": [
            {"name": "gpu-0", "attributes": {"productName": {"string": "L4"}}},
            {"name": "gpu-1", "attributes": {}},
            {"name": "gpu-2", "attributes": {"migProfiles": {"strings": ["1g.10gb"]}}},
        ]
    }
    status = _invalid(reason, "spec.devices[2].attributes[migProfiles]")
    (path,) = refused_list_attributes(status, spec)
    assert path == "devices[].attributes.*.strings"
    assert feature_gate_for(path) == LIST_ATTRIBUTES
    # Another validation error, or one about an attribute that is not a list, is not ours.
    other = _invalid(reason, "spec.devices[0].attributes[productName]")
    assert refused_list_attributes(other, spec) == frozenset()
    name = _invalid("FieldValueInvalid", "spec.devices[2].name")
    assert refused_list_attributes(name, spec) == frozenset()
