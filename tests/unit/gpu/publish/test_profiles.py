"""``--mig-profiles``: dynamic MIG publishes placements of the chosen profiles only."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE, SimulatedMig
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.gpu.publish.profiles import (
    ProfileListError,
    parse_profiles,
    published_inventory,
    restrict_profiles,
)
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.gpu.state.evidence import Evidence
from dra_driver.kubeletplugin.interfaces import ClaimRef
from tests.unit.gpu.mig.test_dynamic_mig import _claim, _instances

NODE = "node-1"
DRIVER = "gpu.dra.dev"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", set()),
        (" ", set()),
        ("1g.10gb", {"1g.10gb"}),
        ("1g.10gb, 3g.40gb,7g.80gb", {"1g.10gb", "3g.40gb", "7g.80gb"}),
        ("1g.10gb+me,1g.10gb,", {"1g.10gb+me", "1g.10gb"}),
        # Newer drivers' variants of a profile: without media engines, with all, graphics.
        ("1g.24gb-me,1g.24gb+me.all,1g.24gb+gfx", {"1g.24gb-me", "1g.24gb+me.all", "1g.24gb+gfx"}),
    ],
)
def test_parse_profiles(text: str, names: set[str]) -> None:
    assert parse_profiles(text) == names


@pytest.mark.parametrize(
    "text", ["bogus", "1g", "1g.10GB", "1g.10gb;3g.40gb", "gpu-0", "1g.10gb+", "1g.10gb+me."]
)
def test_parse_profiles_rejects_what_is_no_profile_name(text: str) -> None:
    with pytest.raises(ProfileListError, match="is not a MIG profile name"):
        parse_profiles(text)


def _devices(catalog_devices: list[dict[str, object]]) -> list[str]:
    return [str(d["name"]) for d in catalog_devices]


def test_only_the_chosen_profiles_are_published() -> None:
    inventory = SimulatedDiscovery("dgx-h100", NODE).discover()
    full = build_catalog(inventory, dynamic=True).published()
    chosen = build_catalog(restrict_profiles(inventory, {"1g.10gb"}), dynamic=True).published()
    assert len(full) == 208
    # Per GPU: the whole GPU and the seven 1g.10gb placements.
    assert len(chosen) == 8 * (1 + 7)
    profiles = {
        d["attributes"]["profile"]["string"]  # type: ignore[index]
        for d in chosen
        if d["attributes"]["type"]["string"] == "mig"  # type: ignore[index]
    }
    assert profiles == {"1g.10gb"}


def test_the_whole_gpu_still_takes_every_counter_its_placements_use() -> None:
    inventory = restrict_profiles(SimulatedDiscovery("dgx-h100", NODE).discover(), {"3g.40gb"})
    catalog = build_catalog(inventory, dynamic=True)
    capacity = {
        s["name"]: {k: int(v["value"]) for k, v in s["counters"].items()}
        for s in catalog.counter_sets
    }
    for device in catalog.published():
        for use in device.get("consumesCounters") or []:  # type: ignore[attr-defined]
            have = capacity[use["counterSet"]]
            used = {k: int(v["value"]) for k, v in use["counters"].items()}
            assert all(used[k] <= have[k] for k in used)
            if device["attributes"]["type"]["string"] == "gpu":  # type: ignore[index]
                # The whole GPU excludes every placement: it takes every counter there is.
                assert used == {k: v for k, v in have.items() if v}


def test_unknown_names_are_logged_and_leave_those_gpus_without_placements() -> None:
    inventory = SimulatedDiscovery("dgx-h100", NODE).discover()
    with structlog.testing.capture_logs() as logs:
        restricted = restrict_profiles(inventory, {"1g.5gb"})  # an A100 profile
    assert all(g.mig_profiles == () for g in restricted.gpus)
    assert [e["profiles"] for e in logs] == [["1g.5gb"]]
    # Without placements the GPUs are published whole, like GPUs that cannot do MIG.
    published = build_catalog(restricted, dynamic=True).published()
    assert _devices(published) == [f"gpu-{i}" for i in range(8)]


def test_the_setting_applies_to_dynamic_mig_only() -> None:
    inventory = SimulatedDiscovery("mixed", NODE).discover()
    assert published_inventory(inventory, False, "1g.10gb") is inventory
    assert published_inventory(inventory, True, "") is inventory
    assert published_inventory(inventory, True, "1g.10gb") != inventory


def test_a_chosen_placement_is_prepared_and_unprepared(tmp_path: Path) -> None:
    # As the agent wires it: the MIG backend knows every profile, the catalogue the chosen.
    inventory = SimulatedDiscovery("dgx-h100", NODE).discover()
    published = restrict_profiles(inventory, {"3g.40gb"})
    state = DeviceState(
        inventory=published,
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id="boot-1",
        mig=SimulatedMig(tmp_path / "plugin" / SIMULATED_STATE_FILE, inventory),
        evidence=Evidence(specs={}, api={}),
    )
    device = next(
        name
        for name in _devices(build_catalog(published, dynamic=True).published())
        if "-mig-3g40gb-" in name
    )
    out = state.prepare([_claim("a", device)])
    assert isinstance(out["a"], list), out
    assert [i["profileId"] for i in _instances(tmp_path)] == [9]
    assert state.unprepare([ClaimRef("ns", "claim-a", "a")]) == {"a": None}
    assert _instances(tmp_path) == []
