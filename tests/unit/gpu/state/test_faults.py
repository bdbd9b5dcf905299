"""Fault paths of the node state: nothing a pod may use is lost or destroyed.

Two agents on one node (a surge update), lost and corrupt checkpoints with dynamic MIG,
admin-access and regular claims on one MIG placement, and claims the API server accepts but
the GPU cannot serve.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver import faults
from dra_driver.gpu.config import ConfigError
from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE, SimulatedMig
from dra_driver.gpu.state.checkpoint import stored_claims
from dra_driver.gpu.state.device_state import ClaimError, DeviceState
from dra_driver.gpu.state.evidence import Allocated, ClaimInUse, Evidence
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from tests.unit.faultfs import FaultFS
from tests.unit.gpu.mig.test_dynamic_mig import (
    DRIVER,
    MIG_3G,
    NODE,
    NOTHING_IN_USE,
    _instances,
    _inventory,
)
from tests.unit.gpu.mig.test_dynamic_mig import _state as _dynamic_state

API_DOWN = Evidence(specs={}, api=None)


def _state(tmp_path: Path, evidence: Evidence = NOTHING_IN_USE) -> DeviceState:
    return _dynamic_state(tmp_path, evidence=evidence)


def _static(
    tmp_path: Path, evidence: Evidence = API_DOWN, boot_id: str = "boot-1"
) -> DeviceState:
    """A node without dynamic MIG (the mixed profile: GPUs and MIG devices)."""
    return DeviceState(
        inventory=_inventory("mixed"),
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id=boot_id,
        evidence=evidence,
    )


def _claim(
    uid: str, *devices: str, admin: bool = False, config: list[dict[str, Any]] | None = None
) -> ClaimToPrepare:
    results = tuple(
        {"request": f"req{i}", "driver": DRIVER, "pool": NODE, "device": d}
        | ({"adminAccess": True} if admin else {})
        for i, d in enumerate(devices)
    )
    return ClaimToPrepare(
        ref=ClaimRef("ns", f"claim-{uid}", uid),
        claim={},
        results=results,
        config=tuple(config or ()),
    )


def _ref(uid: str) -> ClaimRef:
    return ClaimRef("ns", f"claim-{uid}", uid)


def _in_use(*claims: tuple[str, str]) -> Evidence:
    """The API server's answer: these (uid, device) claims are allocated and reserved."""
    return Evidence(
        specs={},
        api={
            uid: ClaimInUse(
                uid=uid,
                namespace="ns",
                name=f"claim-{uid}",
                results=(Allocated(request="req0", device=device),),
                reserved=True,
            )
            for uid, device in claims
        },
    )


class Crash(BaseException):
    """The agent dying at a fault point (nothing in the driver catches it)."""


def _crash_at(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """Make every pass through the fault point ``point`` raise :class:`Crash`."""

    def crash(name: str) -> None:
        if name == point:
            raise Crash

    monkeypatch.setattr(faults, "point", crash)


def _checkpoint(tmp_path: Path) -> Path:
    return tmp_path / "plugin" / "checkpoint.json"


# -- two agents on one node ----------------------------------------------------------------


def test_two_agents_interleaved_lose_no_claim(tmp_path: Path) -> None:
    old = _state(tmp_path)
    assert isinstance(old.prepare([_claim("a", MIG_3G)])["a"], list)
    new = _state(tmp_path)  # the surge update's second agent starts beside the first
    assert isinstance(new.prepare([_claim("b", "gpu-0-mig-1g10gb-19-0")])["b"], list)
    assert isinstance(old.prepare([_claim("c", "gpu-0-mig-1g10gb-19-1")])["c"], list)
    # Each agent sees the other's claims: an overlapping placement is refused by both.
    for agent, uid in ((new, "d"), (old, "e")):
        refused = agent.prepare([_claim(uid, "gpu-0-mig-2g20gb-14-0")])[uid]
        assert isinstance(refused, ClaimError) and "is prepared for claim" not in str(refused)
        assert "holds gpu-0-mig-1g10gb-19-" in str(refused)
    assert sorted(old.prepared_claims()) == sorted(new.prepared_claims()) == ["a", "b", "c"]
    # Unprepares cross over too: what one agent prepared, the other takes apart.
    assert old.unprepare([_ref("b")]) == {"b": None}
    assert new.unprepare([_ref("a"), _ref("c")]) == {"a": None, "c": None}
    assert _state(tmp_path).prepared_claims() == {}
    assert _instances(tmp_path) == []


def test_second_agent_keeps_the_first_agents_claims_at_start(tmp_path: Path) -> None:
    old = _state(tmp_path)
    old.prepare([_claim("a", MIG_3G), _claim("b", "gpu-0-mig-1g10gb-19-0")])
    uuids = sorted(i["uuid"] for i in _instances(tmp_path))
    new = _state(tmp_path)
    assert sorted(new.prepared_claims()) == ["a", "b"]
    assert sorted(i["uuid"] for i in _instances(tmp_path)) == uuids
    # The old agent stops; the new one serves the unprepare of the old one's claims.
    assert new.unprepare([_ref("a"), _ref("b")]) == {"a": None, "b": None}
    assert _instances(tmp_path) == []


# -- admin access and a regular claim on one placement --------------------------------------


@pytest.mark.parametrize("admin_first", [True, False])
def test_admin_and_regular_claims_share_one_mig_device(tmp_path: Path, admin_first: bool) -> None:
    state = _state(tmp_path)
    order = [("adm", True), ("reg", False)] if admin_first else [("reg", False), ("adm", True)]
    for uid, admin in order:
        assert isinstance(state.prepare([_claim(uid, MIG_3G, admin=admin)])[uid], list)
    assert len(_instances(tmp_path)) == 1
    reg, adm = state.record("reg"), state.record("adm")
    assert reg is not None and adm is not None
    assert reg.devices[0].uuid == adm.devices[0].uuid == _instances(tmp_path)[0]["uuid"]
    # Whichever goes first, the MIG device stays while the other claim holds it.
    first, second = order[0][0], order[1][0]
    assert state.unprepare([_ref(first)]) == {first: None}
    assert len(_instances(tmp_path)) == 1
    assert state.unprepare([_ref(second)]) == {second: None}
    assert _instances(tmp_path) == []


def test_failed_regular_prepare_keeps_the_admin_claims_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("adm", MIG_3G, admin=True)])

    def fail(name: str) -> None:
        if name == "cdi.before-rename":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(faults, "point", fail)
    out = state.prepare([_claim("reg", MIG_3G)])
    monkeypatch.undo()
    assert isinstance(out["reg"], ClaimError) and "No space left" in str(out["reg"])
    assert state.record("reg") is None
    adm = state.record("adm")
    assert adm is not None and [i["uuid"] for i in _instances(tmp_path)] == [adm.devices[0].uuid]


def _mig_modes(tmp_path: Path) -> dict[str, bool]:
    state = json.loads((tmp_path / "plugin" / SIMULATED_STATE_FILE).read_text())
    return {uuid: bool(g["migEnabled"]) for uuid, g in state["gpus"].items()}


def test_admin_access_to_a_whole_gpu_leaves_its_mig_devices_and_mode(tmp_path: Path) -> None:
    """Admin access (monitoring) to a GPU whose MIG devices pods use: prepared as it is,
    MIG mode and devices untouched; and a GPU in MIG mode with no devices stays in it."""
    state = _state(tmp_path)
    assert isinstance(state.prepare([_claim("reg", MIG_3G)])["reg"], list)
    instances, modes = _instances(tmp_path), _mig_modes(tmp_path)
    assert len(instances) == 1 and sum(modes.values()) == 1
    assert isinstance(state.prepare([_claim("adm", "gpu-0", admin=True)])["adm"], list)
    assert _instances(tmp_path) == instances and _mig_modes(tmp_path) == modes
    # The regular claim goes: its MIG device with it, MIG mode stays on under the admin claim.
    assert state.unprepare([_ref("reg")]) == {"reg": None}
    assert _instances(tmp_path) == [] and _mig_modes(tmp_path) == modes
    assert isinstance(state.prepare([_claim("adm2", "gpu-0", admin=True)])["adm2"], list)
    assert _mig_modes(tmp_path) == modes
    assert state.unprepare([_ref("adm"), _ref("adm2")]) == {"adm": None, "adm2": None}


def test_destroy_goes_by_the_recorded_instance_not_the_placement(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("a", MIG_3G)])
    gpu = _inventory().gpus[0]
    backend = SimulatedMig(tmp_path / "plugin" / SIMULATED_STATE_FILE, _inventory())
    # Someone replaces the claim's instance by another one at the same placement.
    (inst,) = backend.list(gpu)
    backend.destroy(gpu, inst.gpu_instance_id)
    backend.create(gpu, {p.name: p for p in gpu.mig_profiles}["1g.10gb"], 0)
    other = backend.create(gpu, {p.name: p for p in gpu.mig_profiles}["3g.40gb"], 4)
    assert other.gpu_instance_id != inst.gpu_instance_id
    assert state.unprepare([_ref("a")]) == {"a": None}
    # Not the claim's instance: neither is destroyed.
    assert len(_instances(tmp_path)) == 2


# -- lost and corrupt checkpoints with dynamic MIG -----------------------------------------


def _corrupt(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    else:
        path.write_bytes(b"\x00garbage\xff" * 40)


@pytest.mark.parametrize("how", ["deleted", "truncated", "garbage"])
@pytest.mark.parametrize("api", ["down", "up"])
def test_lost_checkpoint_destroys_nothing_in_use(tmp_path: Path, how: str, api: str) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("a", MIG_3G), _claim("b", "gpu-0-mig-1g10gb-19-0")])
    before = sorted(i["uuid"] for i in _instances(tmp_path))
    _corrupt(_checkpoint(tmp_path), how)
    evidence = API_DOWN if api == "down" else _in_use(("a", MIG_3G), ("b", "gpu-0-mig-1g10gb-19-0"))
    restarted = _state(tmp_path, evidence)
    assert sorted(i["uuid"] for i in _instances(tmp_path)) == before
    records = restarted.prepared_claims()
    assert sorted(records) == ["a", "b"]
    assert records["a"].devices[0].mig is not None
    assert records["a"].devices[0].uuid in before
    # The pods end: their claims unprepare cleanly and their devices go.
    assert restarted.unprepare([_ref("a"), _ref("b")]) == {"a": None, "b": None}
    assert _instances(tmp_path) == []
    assert not list((tmp_path / "cdi").iterdir())


def test_claim_the_api_proves_gone_is_cleaned_up(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("a", MIG_3G), _claim("b", "gpu-0-mig-1g10gb-19-0")])
    _checkpoint(tmp_path).unlink()
    restarted = _state(tmp_path, _in_use(("a", MIG_3G)))
    assert list(restarted.prepared_claims()) == ["a"]
    assert not restarted.spec_path("b").exists()
    a = restarted.record("a")
    assert a is not None and [i["uuid"] for i in _instances(tmp_path)] == [a.devices[0].uuid]


def test_unproven_orphan_is_kept_and_reported(tmp_path: Path) -> None:
    gpu = _inventory().gpus[0]
    backend = SimulatedMig(tmp_path / "plugin" / SIMULATED_STATE_FILE, _inventory())
    backend.set_mig_mode(gpu, True)
    backend.create(gpu, {p.name: p for p in gpu.mig_profiles}["3g.40gb"], 4)
    state = _state(tmp_path, API_DOWN)
    assert len(_instances(tmp_path)) == 1
    assert state.kept and MIG_3G in state.kept[0]
    # A claim the API server says holds the placement keeps it too, even with no record.
    state = _state(tmp_path, _in_use(("x", MIG_3G)))
    assert len(_instances(tmp_path)) == 1
    # Only when the API server answers that nothing holds it does it go.
    _state(tmp_path, NOTHING_IN_USE)
    assert _instances(tmp_path) == []


@pytest.mark.parametrize("api", ["allocated", "down"])
def test_interrupted_prepare_of_a_live_claim_keeps_its_device_and_retry_uses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    # The API server says the claim holds the placement, or cannot be asked: the device no
    # record names (the crash came before its id was recorded) is kept, and the scheduler's
    # allocation of its placement to the claim lets the kubelet's retry use it.
    state = _state(tmp_path)
    _crash_at(monkeypatch, "prepare.mig-created")
    with pytest.raises(Crash):
        state.prepare([_claim("a", MIG_3G)])
    monkeypatch.undo()
    (made,) = _instances(tmp_path)
    restarted = _state(tmp_path, _in_use(("a", MIG_3G)) if api == "allocated" else API_DOWN)
    assert [i["uuid"] for i in _instances(tmp_path)] == [made["uuid"]]
    assert any(MIG_3G in kept for kept in restarted.kept)
    assert isinstance(restarted.prepare([_claim("a", MIG_3G)])["a"], list)
    record = restarted.record("a")
    assert record is not None and record.devices[0].uuid == made["uuid"]


@pytest.mark.parametrize(("api", "kept"), [("gone", False), ("allocated", True), ("down", True)])
def test_a_plain_claims_spec_written_before_its_record_is_kept_or_removed_by_proof(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str, kept: bool
) -> None:
    """A plain claim is recorded once, after its spec: a crash between the two leaves a spec
    no record names. Start-up removes it once the API server proves the claim gone and keeps
    it otherwise; the kubelet's retry then prepares the claim and its unprepare removes it."""

    state = _static(tmp_path)
    _crash_at(monkeypatch, "prepare.cdi-written")
    with pytest.raises(Crash):
        state.prepare([_claim("a", "gpu-2")])
    monkeypatch.undo()
    spec = state.spec_path("a")
    assert spec.exists()
    evidence = {"gone": NOTHING_IN_USE, "allocated": _in_use(("a", "gpu-2")), "down": API_DOWN}
    restarted = _static(tmp_path, evidence[api])
    assert restarted.record("a") is None
    assert spec.exists() is kept
    assert isinstance(restarted.prepare([_claim("a", "gpu-2")])["a"], list)
    assert spec.exists()
    assert restarted.unprepare([_ref("a")]) == {"a": None}
    assert not spec.exists()


# -- claims the API server accepts but the GPU cannot serve --------------------------------


def test_one_device_twice_in_one_claim_is_refused(tmp_path: Path) -> None:
    state = _static(tmp_path)
    out = state.prepare([_claim("a", "gpu-2", "gpu-2")])
    assert isinstance(out["a"], ClaimError) and "allocated to it twice" in str(out["a"])
    assert state.record("a") is None and not state.spec_path("a").exists()


def test_whole_gpu_with_its_own_mig_placement_is_refused(tmp_path: Path) -> None:
    state = _state(tmp_path)
    out = state.prepare([_claim("a", "gpu-0", MIG_3G)])
    assert isinstance(out["a"], ClaimError) and "parts of the same GPU" in str(out["a"])
    out = state.prepare([_claim("b", MIG_3G, "gpu-0-mig-1g10gb-19-5")])
    assert isinstance(out["b"], ClaimError) and "parts of the same GPU" in str(out["b"])
    assert _instances(tmp_path) == [] and state.prepared_claims() == {}


def test_per_device_limit_naming_no_device_is_refused(tmp_path: Path) -> None:
    config = [
        {
            "source": "FromClaim",
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.dra.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {
                        "strategy": "MPS",
                        "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}},
                    },
                },
            },
        }
    ]
    out = _static(tmp_path).prepare([_claim("a", "gpu-2", config=config)])
    assert isinstance(out["a"], ConfigError) and "names no device of the claim: '3'" in str(out["a"])


def test_interrupted_unprepare_is_finished_while_the_api_still_lists_the_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    state.prepare([_claim("a", MIG_3G)])
    _crash_at(monkeypatch, "unprepare.started-recorded")
    with pytest.raises(Crash):
        state.unprepare([_ref("a")])
    monkeypatch.undo()
    # The pod is gone but its claim is still allocated until the kubelet's unprepare ends:
    # the kubelet asked for the unprepare, so its MIG device goes all the same.
    restarted = _state(tmp_path, _in_use(("a", MIG_3G)))
    assert restarted.prepared_claims() == {} and _instances(tmp_path) == []
    assert restarted.unprepare([_ref("a")]) == {"a": None}


def test_unprepare_after_dynamic_mig_was_turned_off_keeps_the_device(tmp_path: Path) -> None:
    _state(tmp_path).prepare([_claim("a", MIG_3G)])
    # The agent restarts without dynamic MIG (a helm upgrade turned it off).
    static = DeviceState(
        inventory=_inventory(),
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id="boot-1",
    )
    assert static.unprepare([_ref("a")]) == {"a": None}
    assert static.prepared_claims() == {} and not static.spec_path("a").exists()
    assert len(_instances(tmp_path)) == 1  # nothing can destroy it without dynamic MIG


@pytest.mark.parametrize("restart", [False, True])
def test_a_mig_device_held_since_before_dynamic_mig_goes_with_its_claim(
    tmp_path: Path, restart: bool
) -> None:
    """Dynamic MIG turned on (a helm upgrade) while a pod uses a MIG device of the GPU's
    static layout: the device stays while its claim does; when the claim is unprepared, it
    goes as one dynamic MIG made would. Left behind, no record named it any more and the
    scheduler, which counts its placement free, kept allocating that placement (refused as
    "made by hand"), overlapping ones and the whole GPU, all failing, until a restart."""
    static_3g = "gpu-0-mig-3g40gb-9-0"
    assert isinstance(_static(tmp_path).prepare([_claim("a", static_3g)])["a"], list)
    dynamic = _dynamic_state(tmp_path, "mixed", _in_use(("a", static_3g)))
    assert [(i["profileId"], i["start"]) for i in _instances(tmp_path)][:1] == [(9, 0)]
    if restart:  # the checkpoint written at start-up says what the device is
        dynamic = _dynamic_state(tmp_path, "mixed", _in_use(("a", static_3g)))
    assert dynamic.unprepare([_ref("a")]) == {"a": None}
    assert not [i for i in _instances(tmp_path) if i["start"] == 0 and i["profileId"] == 9]
    assert isinstance(dynamic.prepare([_claim("b", static_3g)])["b"], list)
    assert dynamic.unprepare([_ref("b")]) == {"b": None}
    assert isinstance(dynamic.prepare([_claim("c", "gpu-0-mig-4g40gb-5-0")])["c"], list)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_claim_whose_unprepare_was_cut_short_is_prepared_again_with_its_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dynamic: bool
) -> None:
    # The agent dies after removing the claim's CDI spec, before recording it gone: the
    # record still says PrepareCompleted. A new pod of the claim makes the kubelet prepare it
    # again; answering "prepared" from the record alone would hand it a CDI device that no
    # longer exists.
    uid, device = ("a", "gpu-2") if not dynamic else ("0a0a0a0a-0000-4000-8000-00000000000a", MIG_3G)
    state = _state(tmp_path) if dynamic else _static(tmp_path)
    first = state.prepare([_claim(uid, device)])[uid]
    assert isinstance(first, list)

    def die(name: str) -> None:
        if name == "unprepare.cdi-removed":
            raise SystemExit("killed")

    monkeypatch.setattr(faults, "point", die)
    with pytest.raises(SystemExit):
        state.unprepare([_ref(uid)])
    monkeypatch.setattr(faults, "point", lambda name: None)
    restarted = _state(tmp_path, API_DOWN) if dynamic else _static(tmp_path)
    again = restarted.prepare([_claim(uid, device)])[uid]
    assert isinstance(again, list) and again == first
    assert restarted.spec_path(uid).exists()
    if dynamic:
        assert len(_instances(tmp_path)) == 1


# -- a failed write after a reboot ---------------------------------------------------------


def test_a_claim_not_recorded_after_a_reboot_is_not_answered_prepared_from_memory(
    tmp_path: Path, faultfs: FaultFS
) -> None:
    """After a reboot the checkpoint on disk is the last boot's until something is written. A
    first write that fails must leave the agent believing the disk, not the memory it had
    moved ahead: else the kubelet's retry is answered prepared from memory while no record
    of the claim exists (found by the claim-state model)."""
    uid = "0d0d0d0d-0000-4000-8000-00000000000d"
    _static(tmp_path)  # the boot before: a checkpoint without claims
    state = _static(tmp_path, boot_id="boot-2")  # after the reboot
    faultfs.arm("write", 2, "ENOSPC", every=True)  # the disk fills after the CDI spec
    failed = state.prepare([_claim(uid, "gpu-2")])[uid]
    assert isinstance(failed, ClaimError) and "cannot record" in str(failed)
    faultfs.clear()  # space again: the kubelet retries
    retried = state.prepare([_claim(uid, "gpu-2")])[uid]
    assert isinstance(retried, list)
    assert stored_claims(_checkpoint(tmp_path))[uid]["state"] == "PrepareCompleted"
