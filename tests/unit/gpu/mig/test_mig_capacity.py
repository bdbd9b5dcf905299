"""Dynamic MIG by capacity: one device per GPU, shares of its MIG slices carved on prepare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.discovery.simulated import build_inventory, load_profile
from dra_driver.gpu.inventory import Gpu, Inventory, Placement
from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE, SimulatedMig
from dra_driver.gpu.publish.catalog import CAPACITY, PLACEMENTS, build_catalog
from dra_driver.gpu.publish.mig_capacity import (
    Slices,
    SlicesError,
    choose_placement,
    is_whole,
    offered,
    profile_for,
    slices_of,
)
from dra_driver.gpu.publish.profiles import published_inventory
from dra_driver.gpu.state.checkpoint import ClaimState
from dra_driver.gpu.state.device_state import ClaimError, DeviceState
from dra_driver.gpu.state.evidence import Allocated, ClaimInUse, Evidence
from dra_driver.gpu.state.planner import CarveError, NoPlacementError
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare

NODE = "node-1"
DRIVER = "gpu.dra.dev"
SINGLE_H100 = str(Path(__file__).parents[3] / "data" / "single-h100.yaml")


def _inventory(profile: str = SINGLE_H100) -> Inventory:
    return build_inventory(load_profile(profile), NODE)


def _h100() -> Gpu:
    return _inventory().gpus[0]


def _state(
    tmp_path: Path,
    profile: str = SINGLE_H100,
    mig_profiles: str = "",
    evidence: Evidence | None = None,
) -> DeviceState:
    # As the agent wires it: the MIG backend knows every profile, the catalogue the chosen.
    inventory = _inventory(profile)
    return DeviceState(
        inventory=published_inventory(inventory, True, mig_profiles),
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id="boot-1",
        mig=SimulatedMig(tmp_path / "plugin" / SIMULATED_STATE_FILE, inventory),
        evidence=Evidence(specs={}, api={}) if evidence is None else evidence,
        mig_layout=CAPACITY,
    )


def _share(uid: str, compute: int, memory: int, device: str = "gpu-0") -> dict[str, Any]:
    return {
        "request": "mig",
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "shareID": f"share-{uid}",
        "consumedCapacity": {"computeSlices": str(compute), "memorySlices": str(memory)},
    }


def _claim(uid: str, *results: dict[str, Any]) -> ClaimToPrepare:
    return ClaimToPrepare(ref=ClaimRef("ns", f"claim-{uid}", uid), claim={}, results=results, config=())


def _instances(tmp_path: Path) -> list[tuple[int, int]]:
    state = json.loads((tmp_path / "plugin" / SIMULATED_STATE_FILE).read_text())
    return sorted(
        (i["start"], i["size"])
        for g in state["gpus"].values()
        for i in g["instances"]
    )


# -- publishing ----------------------------------------------------------------------------


def test_each_gpu_is_one_device_shared_by_its_mig_slices() -> None:
    inventory = _inventory("dgx-h100")
    pool = build_catalog(inventory, dynamic=True, layout=CAPACITY).pool(NODE)
    devices = [d for s in pool.slices for d in s.devices]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert not any(s.shared_counters for s in pool.slices)
    capacity = devices[0]["capacity"]
    assert devices[0]["allowMultipleAllocations"] is True
    # A claim without a capacity request takes every slice: the whole GPU.
    assert capacity["computeSlices"]["requestPolicy"]["default"] == "7"
    assert capacity["memorySlices"]["requestPolicy"]["default"] == "8"
    assert capacity["computeSlices"]["requestPolicy"]["validValues"] == ["1", "2", "3", "4", "7"]
    assert capacity["memorySlices"]["requestPolicy"]["validValues"] == ["1", "2", "4", "8"]
    # Memory and SMs stay readable for selectors but are never consumed.
    assert capacity["memory"]["requestPolicy"] == {"default": "0", "validValues": ["0"]}
    assert devices[0]["attributes"]["type"] == {"string": "gpu"}


def test_mig_profiles_narrow_the_sizes_not_the_gpus_slices() -> None:
    """--mig-profiles=1g.10gb: the profile left spans 1 compute and 7 memory slices of an
    H100. The GPU must still be published with all 7 and 8, else the scheduler (which only
    counts) fits one 1g.10gb share per GPU where seven fit, as the placement layout with the
    same setting publishes seven placements."""
    inventory = published_inventory(_inventory("dgx-h100"), True, "1g.10gb")
    gpu0 = build_catalog(inventory, dynamic=True, layout=CAPACITY).published()[0]
    compute, memory = gpu0["capacity"]["computeSlices"], gpu0["capacity"]["memorySlices"]
    assert (compute["value"], memory["value"]) == ("7", "8")
    assert compute["requestPolicy"] == {"default": "7", "validValues": ["1", "7"]}
    assert memory["requestPolicy"] == {"default": "8", "validValues": ["1", "8"]}
    placed = build_catalog(inventory, dynamic=True, layout=PLACEMENTS).groups[0]
    assert len([n for n in placed if "-mig-1g10gb-" in n]) == 7
    # Prepare counts with the same totals: all slices are the whole GPU, one is a 1g.10gb.
    gpu = inventory.gpus[0]
    assert is_whole(gpu, Slices(7, 8)) and not is_whole(gpu, Slices(1, 7))
    assert profile_for(gpu, Slices(1, 1)).name == "1g.10gb"


def test_binding_conditions_go_on_every_gpu_device() -> None:
    catalog = build_catalog(_inventory(), dynamic=True, layout=CAPACITY)
    device = catalog.pool(NODE, bind_placements=True).slices[0].devices[0]
    assert device["bindingConditions"] == ["MIGDeviceReady"]


@pytest.mark.parametrize(
    ("compute", "memory", "profile"),
    [(1, 1, "1g.10gb"), (1, 2, "1g.20gb"), (2, 2, "2g.20gb"), (3, 4, "3g.40gb"), (4, 4, "4g.40gb")],
)
def test_slices_name_the_plain_profile(compute: int, memory: int, profile: str) -> None:
    assert profile_for(_h100(), Slices(compute, memory)).name == profile


def test_slices_without_a_profile_are_refused_with_the_sizes_there_are() -> None:
    with pytest.raises(SlicesError, match=r"computeSlices 1, memorySlices 4 match no MIG .*"):
        profile_for(_h100(), Slices(1, 4))
    assert (7, 8) not in offered(_h100())  # all slices: the whole GPU, not 7g.80gb


@pytest.mark.parametrize(
    ("counted", "asked"),
    [
        ((1, 8), "computeSlices 1 alone: memory defaults to all 8"),
        ((7, 1), "memorySlices 1 alone: compute defaults to all 7"),
        ((1, 4), "1 and 3: memory rounded up to 4"),
        ((2, 1), "2 and 1: a pair no profile has"),
    ],
)
def test_a_share_matching_no_profile_says_what_to_request(
    tmp_path: Path, counted: tuple[int, int], asked: str
) -> None:
    """The scheduler rounds each capacity up to its own validValues and cannot refuse a pair
    no profile has (resource.k8s.io/v1 has no constraint across capacities), so the claim
    fails on the node before binding, again at every allocation. The message is all the user
    sees (the scheduler quotes the failure condition's first 1000 characters on the pod): it
    must name the pairs to ask for and why the counted pair is not what was written."""
    state = _state(tmp_path)
    out = state.prepare([_claim("a", _share("a", *counted))])
    error = out["a"]
    assert isinstance(error, ClaimError) and not isinstance(error, NoPlacementError), asked
    message = str(error)
    assert "request computeSlices and memorySlices together as one of: " in message
    assert "1g.10gb (1 and 1), 1g.20gb (1 and 2), 2g.20gb (2 and 2)" in message
    assert "3g.40gb (3 and 4), 4g.40gb (4 and 4)" in message
    assert "a capacity not requested counts as all of its slices" in message
    assert "computeSlices 1, 2, 3, 4, 7; memorySlices 1, 2, 4, 8" in message
    assert len(message) < 1000
    assert _instances(tmp_path) == []


@pytest.mark.parametrize(
    "capacity",
    [None, {}, {"computeSlices": "1"}, {"computeSlices": "x", "memorySlices": "1"}],
)
def test_consumed_capacity_must_say_both_slices(capacity: dict[str, str] | None) -> None:
    with pytest.raises(SlicesError):
        slices_of(capacity)


def test_qualified_capacity_names_are_read_too() -> None:
    counted = {"gpu.dra.dev/computeSlices": "2", "gpu.dra.dev/memorySlices": "2"}
    assert slices_of(counted) == Slices(2, 2)


def test_placement_is_the_highest_free_one() -> None:
    gpu = _h100()
    small = profile_for(gpu, Slices(1, 1))
    assert choose_placement(gpu, small, []).placement == Placement(start=6, size=1)
    taken = [Placement(start=6, size=1), Placement(start=4, size=2)]
    assert choose_placement(gpu, small, taken).placement == Placement(start=3, size=1)
    three = profile_for(gpu, Slices(3, 4))
    assert choose_placement(gpu, three, [Placement(start=6, size=1)]).placement.start == 0
    with pytest.raises(SlicesError, match="fit by count but not by position"):
        choose_placement(gpu, three, [Placement(start=2, size=2), Placement(start=4, size=2)])
    with pytest.raises(SlicesError, match="held whole"):
        choose_placement(gpu, small, [None])


# -- prepare and unprepare -----------------------------------------------------------------


def test_shares_become_mig_devices_and_go_away_again(tmp_path: Path) -> None:
    state = _state(tmp_path)
    out = state.prepare([_claim("a", _share("a", 1, 1)), _claim("b", _share("b", 3, 4))])
    assert all(isinstance(v, list) for v in out.values()), out
    assert _instances(tmp_path) == [(0, 4), (6, 1)]
    for uid in ("a", "b"):
        record = state.record(uid)
        assert record is not None and record.state is ClaimState.PREPARE_COMPLETED
        (device,) = record.devices
        assert device.device_name == "gpu-0" and device.uuid.startswith("MIG-")
        assert device.share_id == f"share-{uid}"
        spec = json.loads(state.spec_path(uid).read_text())
        env = spec["containerEdits"]["env"]
        assert f"NVIDIA_VISIBLE_DEVICES={device.uuid}" in env
    # The same device twice in one claim: two shares, two MIG devices.
    out = state.prepare([_claim("c", _share("c1", 1, 1), _share("c2", 1, 1))])
    assert isinstance(out["c"], list) and len(out["c"]) == 2
    assert out["c"][0].cdi_device_ids != out["c"][1].cdi_device_ids
    assert _instances(tmp_path) == [(0, 4), (4, 1), (5, 1), (6, 1)]
    state.unprepare([ClaimRef("ns", "claim-a", "a"), ClaimRef("ns", "claim-c", "c")])
    assert _instances(tmp_path) == [(0, 4)]
    state.unprepare([ClaimRef("ns", "claim-b", "b")])
    assert _instances(tmp_path) == []


def test_a_whole_gpu_share_excludes_mig_devices(tmp_path: Path) -> None:
    state = _state(tmp_path)
    out = state.prepare([_claim("a", _share("a", 1, 1))])
    assert isinstance(out["a"], list)
    # A stale allocation promising the whole GPU beside a MIG device is refused.
    out = state.prepare([_claim("w", _share("w", 7, 8))])
    assert isinstance(out["w"], ClaimError) and "exclude each other" in str(out["w"])
    state.unprepare([ClaimRef("ns", "claim-a", "a")])
    out = state.prepare([_claim("w", _share("w", 7, 8))])
    assert isinstance(out["w"], list)
    record = state.record("w")
    assert record is not None and record.devices[0].mig is None
    out = state.prepare([_claim("b", _share("b", 1, 1))])
    assert isinstance(out["b"], ClaimError) and "held whole" in str(out["b"])


def test_a_share_that_fits_by_count_but_not_by_position_fails_that_claim(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)
    out = state.prepare(
        [_claim("a", _share("a", 2, 2)), _claim("b", _share("b", 2, 2))]
    )  # placed at 4 and 2: slices 2-5 taken
    assert _instances(tmp_path) == [(2, 2), (4, 2)]
    out = state.prepare([_claim("c", _share("c", 3, 4))])
    # The agent keeps new claims off the GPU for a while (the scheduler would choose it
    # again): the error names it.
    assert isinstance(out["c"], NoPlacementError) and out["c"].gpus == (_h100().uuid,)
    assert "no placement of 3g.40gb is free" in str(out["c"])
    assert state.record("c") is None and _instances(tmp_path) == [(2, 2), (4, 2)]


def test_a_share_without_a_share_id_or_slices_is_refused(tmp_path: Path) -> None:
    state = _state(tmp_path)
    bare = {"request": "mig", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    out = state.prepare([_claim("a", bare), _claim("b", _share("b", 1, 3))])
    assert "has no shareID" in str(out["a"])
    assert "match no MIG profile" in str(out["b"])
    assert _instances(tmp_path) == []


def test_with_mig_profiles_the_published_shares_fit_on_the_gpu(tmp_path: Path) -> None:
    # Seven 1g.10gb shares fit by count (computeSlices 7) and by position; an eighth does
    # not by position, and all slices are still the whole GPU.
    state = _state(tmp_path, mig_profiles="1g.10gb")
    out = state.prepare([_claim(str(i), _share(str(i), 1, 1)) for i in range(7)])
    assert all(isinstance(v, list) for v in out.values()), out
    assert _instances(tmp_path) == [(i, 1) for i in range(7)]
    out = state.prepare([_claim("8", _share("8", 1, 1))])
    assert isinstance(out["8"], NoPlacementError)
    state.unprepare([ClaimRef("ns", f"claim-{i}", str(i)) for i in range(7)])
    out = state.prepare([_claim("w", _share("w", 7, 8))])
    assert isinstance(out["w"], list) and _instances(tmp_path) == []


def test_a_restart_keeps_the_shares_and_their_mig_devices(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("a", _share("a", 1, 1))])
    again = _state(tmp_path)
    assert _instances(tmp_path) == [(6, 1)]
    out = again.prepare([_claim("b", _share("b", 1, 1))])
    assert isinstance(out["b"], list)
    assert _instances(tmp_path) == [(5, 1), (6, 1)]


def test_a_claim_prepared_again_keeps_its_mig_device(tmp_path: Path) -> None:
    """A claim prepared again (its CDI spec gone: an unprepare cut short, or a restart after
    a crash mid-prepare) must reuse the MIG device its record names, not carve a second one
    and leave the first to nobody."""
    state = _state(tmp_path)
    state.prepare([_claim("x", _share("x", 1, 1))])  # at 6
    state.prepare([_claim("a", _share("a", 1, 1))])  # at 5
    assert _instances(tmp_path) == [(5, 1), (6, 1)]
    state.unprepare([ClaimRef("ns", "claim-x", "x")])
    assert _instances(tmp_path) == [(5, 1)]
    state.spec_path("a").unlink()  # an unprepare of a cut short after removing its spec
    out = state.prepare([_claim("a", _share("a", 1, 1))])
    assert isinstance(out["a"], list), out
    assert _instances(tmp_path) == [(5, 1)]
    state.unprepare([ClaimRef("ns", "claim-a", "a")])
    assert _instances(tmp_path) == []


def test_a_profile_at_its_instance_limit_is_no_placement_not_a_failed_gpu(
    tmp_path: Path,
) -> None:
    """--mig-profiles=1g.10gb+me: the GPU is published with 7 compute slices and (1, 1) is a
    1g.10gb+me, of which an H100 holds one. The scheduler (which counts) fits a second share;
    the node must refuse it as not placeable (mig-fragmented, the pod goes elsewhere), not try
    to create it and report the GPU's MIG creation as failed (mig-failed taint, MIGCreateFailed)."""
    state = _state(tmp_path, mig_profiles="1g.10gb+me")
    out = state.prepare([_claim("a", _share("a", 1, 1))])
    assert isinstance(out["a"], list), out
    out = state.prepare([_claim("b", _share("b", 1, 1))])
    assert not isinstance(out["b"], CarveError), out
    assert isinstance(out["b"], NoPlacementError), out
    # Two such shares in one claim: the same.
    out = state.prepare([_claim("c", _share("c1", 1, 1), _share("c2", 1, 1))])
    assert isinstance(out["c"], NoPlacementError), out
    assert _instances(tmp_path) == [(6, 1)]


@pytest.mark.parametrize("api", ["up", "down"])
def test_a_lost_checkpoint_rebuilds_shares_as_their_mig_devices(tmp_path: Path, api: str) -> None:
    """A checkpoint lost under running pods is rebuilt from the CDI specs. A share's spec
    names the capacity device (gpu-0) and the MIG device's UUID: the rebuilt record must be
    that MIG device, a share of the GPU, not the whole GPU. Else every other share of the
    GPU is refused ("held whole") while the pod runs, and its unprepare leaves the MIG
    device behind, its slices lost to the scheduler's later allocations."""
    state = _state(tmp_path)
    state.prepare([_claim("a", _share("a", 1, 1)), _claim("b", _share("b", 3, 4))])
    assert _instances(tmp_path) == [(0, 4), (6, 1)]
    (tmp_path / "plugin" / "checkpoint.json").unlink()
    evidence = Evidence(specs={}, api=None)
    if api == "up":
        evidence = Evidence(
            specs={},
            api={
                uid: ClaimInUse(
                    uid, "ns", f"claim-{uid}", (Allocated("mig", "gpu-0", f"share-{uid}"),), True
                )
                for uid in ("a", "b")
            },
        )
    again = _state(tmp_path, evidence=evidence)
    assert _instances(tmp_path) == [(0, 4), (6, 1)]
    out = again.prepare([_claim("c", _share("c", 1, 1))])
    assert isinstance(out["c"], list), out
    assert _instances(tmp_path) == [(0, 4), (5, 1), (6, 1)]
    refs = [ClaimRef("ns", f"claim-{uid}", uid) for uid in ("a", "b", "c")]
    assert again.unprepare(refs) == {"a": None, "b": None, "c": None}
    assert _instances(tmp_path) == []
