"""Dynamic MIG on the node: the simulated backend, prepare/unprepare and crash recovery."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver import faults
from dra_driver.gpu.config import OWN_API, ConfigError, ConfigKinds
from dra_driver.gpu.discovery.simulated import build_inventory, load_profile
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.mig.backend import MigError
from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE, SimulatedMig
from dra_driver.gpu.nvidia_config import config_apis
from dra_driver.gpu.publish.publisher import NodePublishing
from dra_driver.gpu.sharing.backend import SharingBackend
from dra_driver.gpu.sharing.simulated import SimulatedSharing
from dra_driver.gpu.state.checkpoint import ClaimState, stored_claims
from dra_driver.gpu.state.device_state import ClaimError, DeviceState
from dra_driver.gpu.state.evidence import Evidence
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare

NODE = "node-1"
DRIVER = "gpu.dra.dev"
SINGLE_H100 = str(Path(__file__).parents[3] / "data" / "single-h100.yaml")
MIG_3G = "gpu-0-mig-3g40gb-9-4"
MIG_4G = "gpu-0-mig-4g40gb-5-0"


def _inventory(profile: str = SINGLE_H100) -> Inventory:
    return build_inventory(load_profile(profile), NODE)


def _backend(tmp_path: Path, profile: str = SINGLE_H100) -> SimulatedMig:
    return SimulatedMig(tmp_path / "plugin" / SIMULATED_STATE_FILE, _inventory(profile))


# The API server answered and no claim holds a device of the node: start-up may take apart
# what no record names.
NOTHING_IN_USE = Evidence(specs={}, api={})


def _state(
    tmp_path: Path,
    profile: str = SINGLE_H100,
    evidence: Evidence = NOTHING_IN_USE,
    *,
    driver: str = DRIVER,
    sharing: SharingBackend | None = None,
    config_kinds: ConfigKinds = OWN_API,
) -> DeviceState:
    return DeviceState(
        inventory=_inventory(profile),
        driver_name=driver,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id="boot-1",
        mig=_backend(tmp_path, profile),
        evidence=evidence,
        sharing=sharing,
        config_apis=config_kinds,
    )


def _claim(uid: str, *devices: str, config: list[dict[str, Any]] | None = None) -> ClaimToPrepare:
    results = tuple(
        {"request": f"req{i}", "driver": DRIVER, "pool": NODE, "device": d}
        for i, d in enumerate(devices)
    )
    return ClaimToPrepare(
        ref=ClaimRef("ns", f"claim-{uid}", uid),
        claim={},
        results=results,
        config=tuple(config or ()),
    )


def _instances(tmp_path: Path) -> list[dict[str, Any]]:
    state = json.loads((tmp_path / "plugin" / SIMULATED_STATE_FILE).read_text())
    return [i for g in state["gpus"].values() for i in g["instances"]]


# -- the simulated backend -----------------------------------------------------------------


def test_simulated_backend_follows_the_placement_rules(tmp_path: Path) -> None:
    gpu = _inventory().gpus[0]
    profiles = {p.name: p for p in gpu.mig_profiles}
    mig = _backend(tmp_path)
    with pytest.raises(MigError, match="MIG mode is off"):
        mig.create(gpu, profiles["1g.10gb"], 0)
    mig.set_mig_mode(gpu, True)
    with pytest.raises(MigError, match="cannot start at memory slice 1"):
        mig.create(gpu, profiles["3g.40gb"], 1)
    created = mig.create(gpu, profiles["3g.40gb"], 4)
    assert created.uuid.startswith("MIG-") and created.placement.start == 4
    with pytest.raises(MigError, match="overlaps"):
        mig.create(gpu, profiles["1g.10gb"], 5)
    mig.create(gpu, profiles["1g.10gb+me"], 0)
    with pytest.raises(MigError, match="allows 1 instance"):
        mig.create(gpu, profiles["1g.10gb+me"], 1)
    with pytest.raises(MigError, match="GPU instances exist"):
        mig.set_mig_mode(gpu, False)
    # A new process sees the same instances.
    again = _backend(tmp_path)
    assert [(i.profile_id, i.placement.start) for i in again.list(gpu)] == [(9, 4), (20, 0)]
    assert again.list(gpu)[0].device == created
    for inst in again.list(gpu):
        again.destroy(gpu, inst.gpu_instance_id)
    again.destroy(gpu, 99)  # unknown: no error
    assert _backend(tmp_path).list(gpu) == ()
    again.set_mig_mode(gpu, False)


def test_simulated_backend_starts_from_the_profile(tmp_path: Path) -> None:
    inventory = _inventory("mixed")
    mig = _backend(tmp_path, "mixed")
    a100 = inventory.gpus[0]
    assert mig.mig_enabled(a100)
    assert [i.device for i in mig.list(a100)] == list(a100.mig_devices)


# -- prepare and unprepare -----------------------------------------------------------------


def test_prepare_creates_and_unprepare_destroys(tmp_path: Path) -> None:
    state = _state(tmp_path)
    out = state.prepare([_claim("a", MIG_3G), _claim("b", MIG_4G)])
    assert all(isinstance(v, list) for v in out.values()), out
    instances = _instances(tmp_path)
    assert sorted((i["profileId"], i["start"]) for i in instances) == [(5, 0), (9, 4)]
    record = state.record("a")
    assert record is not None and record.devices[0].mig is not None
    mig_uuid = record.devices[0].uuid
    assert mig_uuid.startswith("MIG-") and mig_uuid in {i["uuid"] for i in instances}
    spec = json.loads(state.spec_path("a").read_text())
    assert f"NVIDIA_VISIBLE_DEVICES={mig_uuid}" in spec["containerEdits"]["env"]
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert (
        nodes[0] == "/dev/nvidia0"
        and all("nvidia-caps" in n for n in nodes[1:])
        and len(nodes) == 3
    )

    assert state.unprepare([ClaimRef("ns", "claim-a", "a")]) == {"a": None}
    assert [(i["profileId"], i["start"]) for i in _instances(tmp_path)] == [(5, 0)]
    state.unprepare([ClaimRef("ns", "claim-b", "b")])
    assert _instances(tmp_path) == []
    assert not state.spec_path("a").exists() and state.prepared_claims() == {}


def test_whole_gpu_and_its_mig_devices_exclude_each_other(tmp_path: Path) -> None:
    state = _state(tmp_path)
    assert isinstance(state.prepare([_claim("a", MIG_3G)])["a"], list)
    refused = state.prepare([_claim("b", "gpu-0")])["b"]
    assert isinstance(refused, ClaimError) and "same GPU" in str(refused)
    overlapping = state.prepare([_claim("c", "gpu-0-mig-1g10gb-19-5")])["c"]
    assert isinstance(overlapping, ClaimError)
    state.unprepare([ClaimRef("ns", "claim-a", "a")])
    # Idle again: the whole GPU can be prepared, which turns MIG mode off.
    assert isinstance(state.prepare([_claim("b", "gpu-0")])["b"], list)
    gpu = _inventory().gpus[0]
    assert not _backend(tmp_path).mig_enabled(gpu)
    # And while the whole GPU is held, MIG mode cannot be turned on for a MIG claim.
    busy = state.prepare([_claim("d", MIG_4G)])["d"]
    assert isinstance(busy, ClaimError) and "MIG mode can only change on an idle GPU" in str(busy)
    assert _instances(tmp_path) == []


def test_mig_device_config_applies_to_dynamic_devices(tmp_path: Path) -> None:
    config = [
        {
            "source": "FromClaim",
            "requests": ["req0"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.dra.dev/v1alpha1",
                    "kind": "MigDeviceConfig",
                    "sharing": {"strategy": "TimeSlicing"},
                },
            },
        }
    ]
    state = _state(tmp_path)
    out = state.prepare([_claim("a", MIG_3G, config=config)])
    assert isinstance(out["a"], list), out
    record = state.record("a")
    assert record is not None and record.devices[0].sharing == "TimeSlicing"


def test_time_slicing_of_a_dynamic_mig_device_sets_no_interval(tmp_path: Path) -> None:
    # The NVIDIA driver's dynamic-MIG test claims a MIG device with a MigDeviceConfig of its
    # config API whose strategy is TimeSlicing (and no interval, which MIG has not): accepted,
    # no hardware step. A MIG device made on demand is prepared as an existing one is: no
    # time-slice is set on its UUID at prepare, nor reset at unprepare.
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _state(
        tmp_path, driver="gpu.nvidia.com", sharing=sim, config_kinds=config_apis("nvidia")
    )
    parameters = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing"},
    }
    config = [
        {
            "source": "FromClaim",
            "requests": ["mig1gts"],
            "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters},
        }
    ]
    result = {"request": "mig1gts", "driver": "gpu.nvidia.com", "pool": NODE, "device": MIG_3G}
    claim = ClaimToPrepare(ClaimRef("ns", "mig-ts", "a"), {}, (result,), tuple(config))
    out = state.prepare([claim])
    assert isinstance(out["a"], list), out
    record = state.record("a")
    assert record is not None and record.devices[0].sharing == "TimeSlicing"
    assert record.devices[0].timeslice is None
    assert state.unprepare([claim.ref]) == {"a": None}
    assert not [e for e in sim.read().log if "timeslice" in e["op"]]


def test_failed_create_is_a_claim_error_and_leaves_nothing(tmp_path: Path) -> None:
    state = _state(tmp_path)
    gpu = _inventory().gpus[0]
    outside = _backend(tmp_path)  # someone else carves the GPU behind the driver's back
    outside.set_mig_mode(gpu, True)
    outside.create(gpu, {p.name: p for p in gpu.mig_profiles}["1g.10gb"], 5)
    state = _state(tmp_path)  # restart: the stranger's instance is destroyed as an orphan
    assert _instances(tmp_path) == []
    outside = _backend(tmp_path)
    outside.create(gpu, {p.name: p for p in gpu.mig_profiles}["1g.10gb"], 5)
    out = state.prepare([_claim("a", MIG_3G), _claim("b", MIG_4G)])
    assert isinstance(out["a"], ClaimError) and "overlaps" in str(out["a"])
    assert isinstance(out["b"], list)
    assert state.record("a") is None and not state.spec_path("a").exists()


def test_failed_create_never_destroys_a_gpu_instance_someone_else_made(tmp_path: Path) -> None:
    state = _state(tmp_path)
    # After the scheduler allocated MIG_3G (3g.40gb at 4), an admin (nvidia-smi mig -cgi 14)
    # takes part of its placement with a 2g.20gb: the create fails, and its undo must leave
    # that instance alone.
    mig_file = tmp_path / "plugin" / SIMULATED_STATE_FILE
    sim = json.loads(mig_file.read_text())
    for gpu in sim["gpus"].values():
        gpu["migEnabled"] = True
        gpu["instances"] = [{"giId": 7, "profileId": 14, "start": 4, "size": 2}]
    mig_file.write_text(json.dumps(sim))
    out = state.prepare([_claim("a", MIG_3G)])
    assert isinstance(out["a"], ClaimError) and "overlaps" in str(out["a"])
    assert [i["giId"] for i in _instances(tmp_path)] == [7]


def test_a_half_made_gpu_instance_at_the_placement_goes_with_the_failed_create(
    tmp_path: Path,
) -> None:
    # What an agent killed between creating a GPU instance and recording its id leaves: the
    # GPU instance without its compute instance, at the claim's own placement. It runs
    # nothing; the kubelet's retry fails on it once, its undo removes it, the next succeeds.
    state = _state(tmp_path)
    mig_file = tmp_path / "plugin" / SIMULATED_STATE_FILE
    sim = json.loads(mig_file.read_text())
    for gpu in sim["gpus"].values():
        gpu["migEnabled"] = True
        gpu["instances"] = [{"giId": 7, "profileId": 9, "start": 4, "size": 4}]
    mig_file.write_text(json.dumps(sim))
    assert isinstance(state.prepare([_claim("a", MIG_3G)])["a"], ClaimError)
    assert _instances(tmp_path) == []
    assert isinstance(state.prepare([_claim("a", MIG_3G)])["a"], list)


def _stranger_at_mig_3g(tmp_path: Path) -> str:
    """A complete MIG device no claim made (``nvidia-smi mig -cgi 9 -C``) at MIG_3G's
    placement, 3g.40gb at 4; its UUID."""
    mig_file = tmp_path / "plugin" / SIMULATED_STATE_FILE
    sim = json.loads(mig_file.read_text())
    uuid = "MIG-5a1e0000-0000-4000-8000-000000000007"
    for gpu in sim["gpus"].values():
        gpu["migEnabled"] = True
        gpu["instances"] = [
            {"giId": 7, "profileId": 9, "start": 4, "size": 4, "ciId": 0, "uuid": uuid}
        ]
    mig_file.write_text(json.dumps(sim))
    return uuid


def test_a_mig_device_made_by_hand_is_never_handed_to_a_claim(tmp_path: Path) -> None:
    # Made while the agent runs, with no record: not the driver's. A claim allocated its
    # placement must not take it: two workloads would share it, and the claim's unprepare
    # would destroy it under the other.
    state = _state(tmp_path)
    uuid = _stranger_at_mig_3g(tmp_path)
    out = state.prepare([_claim("a", MIG_3G)])["a"]
    assert isinstance(out, ClaimError)
    assert uuid in str(out) and "no claim of this driver made" in str(out)
    assert "nvidia-smi mig" in str(out)
    assert [i["uuid"] for i in _instances(tmp_path)] == [uuid]
    assert state.record("a") is None and not state.spec_path("a").exists()
    assert state.unprepare([ClaimRef("ns", "claim-a", "a")])["a"] is None
    assert [i["uuid"] for i in _instances(tmp_path)] == [uuid]


def test_records_without_mig_keep_the_old_format(tmp_path: Path) -> None:
    _state(tmp_path).prepare([_claim("a", "gpu-0")])
    claims = stored_claims(tmp_path / "plugin" / "checkpoint.json")
    # No "mig" key: a checkpoint written before dynamic MIG checksums the same way.
    assert "mig" not in claims["a"]["devices"][0]
    restarted = _state(tmp_path)
    assert restarted.corrupt is None and restarted.record("a") is not None


# -- crashes -------------------------------------------------------------------------------


class Crash(BaseException):
    """Stands in for the process dying at a fault point (os._exit would end pytest)."""


PREPARE_POINTS = [
    "prepare.started-recorded",
    "prepare.mig-enabled",
    "mig.gi-created",
    "prepare.mig-created",
    "cdi.before-rename",
    "prepare.cdi-written",
    "prepare.completed-recorded",
]
UNPREPARE_POINTS = [
    "unprepare.started-recorded",
    "unprepare.cdi-removed",
    "mig.ci-destroyed",
    "unprepare.mig-destroyed",
    "unprepare.recorded",
]


def _crash_at(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    def point(reached: str) -> None:
        if reached == name:
            raise Crash(name)

    monkeypatch.setattr(faults, "point", point)


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_crash_during_prepare_is_rolled_back_or_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    state = _state(tmp_path)
    _crash_at(monkeypatch, point)
    with pytest.raises(Crash):
        state.prepare([_claim("a", MIG_3G)])
    monkeypatch.undo()
    restarted = _state(tmp_path)
    record = restarted.record("a")
    if record is None:  # rolled back: nothing left behind
        assert _instances(tmp_path) == []
        assert not restarted.spec_path("a").exists()
    else:  # the crash came after the claim was complete: it stays, with its device
        assert record.state is ClaimState.PREPARE_COMPLETED
        assert [i["uuid"] for i in _instances(tmp_path)] == [record.devices[0].uuid]
        assert restarted.spec_path("a").exists()
    # The kubelet retries; the retry succeeds and leaves exactly one MIG device.
    assert isinstance(restarted.prepare([_claim("a", MIG_3G)])["a"], list)
    assert len(_instances(tmp_path)) == 1 and _instances(tmp_path)[0]["ciId"] == 0


@pytest.mark.parametrize("point", UNPREPARE_POINTS)
def test_crash_during_unprepare_is_finished_at_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("a", MIG_3G)])
    _crash_at(monkeypatch, point)
    with pytest.raises(Crash):
        state.unprepare([ClaimRef("ns", "claim-a", "a")])
    monkeypatch.undo()
    restarted = _state(tmp_path)
    assert restarted.prepared_claims() == {}
    assert _instances(tmp_path) == []
    assert not restarted.spec_path("a").exists()
    assert restarted.unprepare([ClaimRef("ns", "claim-a", "a")]) == {"a": None}


# -- publishing fallback -------------------------------------------------------------------


async def test_dropped_counters_fall_back_to_static_devices(tmp_path: Path) -> None:
    inventory = _inventory()
    backend = _backend(tmp_path)
    gpu = inventory.gpus[0]
    backend.set_mig_mode(gpu, True)  # left in MIG mode without instances
    publishing = NodePublishing(backend, inventory)
    dynamic = publishing.pool(NODE, DRIVER)
    assert dynamic.slices[0].shared_counters
    # Without device taints the placements stay: only health publishing changes.
    assert list(await publishing.on_dropped(frozenset({"DRADeviceTaints"}))) == ["DRADeviceTaints"]
    assert publishing.pool(NODE, DRIVER).slices[0].shared_counters
    assert list(await publishing.on_dropped(frozenset({"DRAPartitionableDevices"}))) == [
        "DRAPartitionableDevices"
    ]
    static = publishing.pool(NODE, DRIVER)
    devices = [d for s in static.slices for d in s.devices]
    assert [d["name"] for d in devices] == ["gpu-0"]
    assert not any(s.shared_counters for s in static.slices)
    assert not await publishing.on_dropped(frozenset({"DRAPartitionableDevices"}))  # once


def test_a_claim_twice_in_one_batch_is_prepared_once(tmp_path: Path) -> None:
    state = _state(tmp_path)
    # Creating its MIG device fails, which undoes the claim's first entry of the batch.
    mig_file = tmp_path / "plugin" / SIMULATED_STATE_FILE
    sim = json.loads(mig_file.read_text())
    for gpu in sim["gpus"].values():
        gpu["failCreate"] = "GPU in a bad state"
    mig_file.write_text(json.dumps(sim))
    a = "0a0a0a0a-0000-4000-8000-00000000000a"
    b = "0b0b0b0b-0000-4000-8000-00000000000b"
    out = state.prepare([_claim(a, MIG_3G), _claim(a, MIG_3G), _claim(b, "gpu-0")])
    assert sorted(out) == [a, b]
    assert isinstance(out[a], ClaimError) and "bad state" in str(out[a])
    assert isinstance(out[b], ClaimError)  # the GPU cannot leave MIG mode for it either
    assert state.prepared_claims() == {}


def test_dynamic_mig_batches_are_never_quick(tmp_path: Path) -> None:
    """A MIG device is created and destroyed through the driver (seconds on a real GPU):
    such batches run in a worker thread, never on the event loop."""
    state = _state(tmp_path)
    claim = _claim("a", MIG_3G)
    assert not state.quick_prepare([claim])
    assert isinstance(state.prepare([claim])["a"], list)
    assert not state.quick_unprepare([claim.ref])


def test_a_per_device_limit_keyed_by_the_parent_gpu_of_a_mig_device_made_on_demand_is_refused(
    tmp_path: Path,
) -> None:
    """A MIG device made on demand has no UUID before it exists; its GPU's UUID does not name
    it: such a key was accepted, then matched nothing, and the device ran without a limit."""
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _state(tmp_path, sharing=sim)
    gpu = _inventory().gpus[0].uuid
    mps = {"defaultPerDevicePinnedMemoryLimit": {gpu: "1Gi"}}
    parameters = {
        "apiVersion": "gpu.dra.dev/v1alpha1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": mps},
    }
    config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}]
    out = state.prepare([_claim("a", MIG_3G, config=config)])
    assert isinstance(out["a"], ConfigError), out
    assert "names no device of the claim" in str(out["a"])
    assert sim.read().mps == {} and _instances(tmp_path) == []
