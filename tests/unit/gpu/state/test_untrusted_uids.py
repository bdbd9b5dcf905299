"""Claim UIDs the node state takes from outside: the kubelet's calls, CDI spec file names and
checkpoint keys. Each names files (``<cdi>/k8s.gpu.dra.dev-claim_<uid>.json``,
``<state>/mps/<uid>``), so a UID such as ``..`` would point start-up's clean-up at the state
directory itself. One check (:func:`dra_driver.kubeletplugin.uid.valid_uid`) guards them all:
what fails it is logged and left alone, never prepared, recorded or removed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.state import checkpoint, journal
from dra_driver.gpu.state.checkpoint import ClaimState
from dra_driver.gpu.state.device_state import SPEC_PREFIX, DeviceState
from dra_driver.gpu.state.evidence import (
    NO_EVIDENCE,
    Allocated,
    ClaimInUse,
    Evidence,
    claims_in_use,
    read_specs,
)
from dra_driver.gpu.state.planner import ClaimError
from dra_driver.kubeletplugin.sockets import LOCK_FILE_NAME
from tests.unit.gpu.state.test_faults import _ref
from tests.unit.gpu.state.test_state import DRIVER, NODE, _claim
from tests.unit.kubeletplugin.test_uid import NOT_UIDS

INVENTORY = SimulatedDiscovery("mixed", NODE).discover()
UID = "0a0a0a0a-0000-4000-8000-00000000000a"
#: Each steps out of ``<state>/mps/<uid>``: to the state directory, or to ``mps`` itself.
PATH_UIDS = ["..", ".", ""]
API_UP = "up"


def _start(tmp_path: Path, evidence: Evidence = NO_EVIDENCE) -> DeviceState:
    return DeviceState(
        inventory=INVENTORY,
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id="boot-1",
        evidence=evidence,
    )


def _in_use(*uids: str) -> Evidence:
    """The API server's answer: these claims hold gpu-2, reserved for a pod."""
    return Evidence(
        specs={},
        api={
            uid: ClaimInUse(
                uid=uid,
                namespace="ns",
                name=f"claim-{uid}",
                results=(Allocated(request="req0", device="gpu-2"),),
                reserved=True,
            )
            for uid in uids
        },
    )


def _node_with_a_claim(tmp_path: Path) -> list[Path]:
    """A node with claim UID prepared; returns the files start-up must leave alone."""
    state = _start(tmp_path)
    assert isinstance(state.prepare([_claim(UID, "gpu-2")])[UID], list)
    own = state.mps_dir(UID) / "pipe" / "control"  # a claim's own directory under mps/
    own.parent.mkdir(parents=True)
    own.write_text("")
    other = tmp_path / "plugin" / "not-the-drivers"
    other.write_text("")
    return [own, other, state.spec_path(UID), tmp_path / "plugin" / LOCK_FILE_NAME]


def _all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


# -- CDI spec file names at start-up --------------------------------------------------------


@pytest.mark.parametrize("api", [API_UP, "down"])
@pytest.mark.parametrize("uid", PATH_UIDS)
def test_a_spec_file_named_with_a_path_is_logged_and_left_alone(
    tmp_path: Path, uid: str, api: str
) -> None:
    keep = _node_with_a_claim(tmp_path)
    odd = tmp_path / "cdi" / f"{SPEC_PREFIX}{uid}.json"
    odd.write_text((tmp_path / "cdi" / f"{SPEC_PREFIX}{UID}.json").read_text())
    # The checkpoint is lost: start-up rebuilds it from the CDI specs (and, with the API
    # server's answer, removes the specs of claims it proves gone: every one but UID).
    (tmp_path / "plugin" / "checkpoint.json").unlink()
    (tmp_path / "plugin" / "checkpoint.json.journal").unlink()
    before = [p for p in _all_files(tmp_path) if p.name != "checkpoint.json"]
    with capture_logs() as logs:
        state = _start(tmp_path, _in_use(UID) if api == API_UP else NO_EVIDENCE)
    assert [p for p in [*keep, odd] if not p.exists()] == []
    assert [p for p in before if not p.exists()] == []
    assert sorted(state.prepared_claims()) == [UID]
    assert sorted(checkpoint.stored_claims(tmp_path / "plugin" / "checkpoint.json")) == [UID]
    ignored = [
        e for e in logs if e["event"] == "CDI spec file not named after a claim UID: ignored"
    ]
    assert [e["path"] for e in ignored] == [str(odd)]
    # Nor does a later start (a reboot drops every record and removes their artifacts).
    _start(tmp_path, NO_EVIDENCE)
    assert [p for p in [*keep, odd] if not p.exists()] == []


def test_read_specs_skips_names_that_are_no_uid(tmp_path: Path) -> None:
    tmp_path.joinpath(f"{SPEC_PREFIX}{UID}.json").write_text("{}")
    for uid in ["..", ".", "", "A-UPPER", "-x", "a b", "a" * 37]:
        tmp_path.joinpath(f"{SPEC_PREFIX}{uid}.json").write_text("{}")
    assert sorted(read_specs(tmp_path, SPEC_PREFIX)) == [UID]


def test_the_api_servers_claims_need_a_uid_too() -> None:
    item = {
        "metadata": {"uid": "..", "namespace": "ns", "name": "c"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": DRIVER, "pool": NODE, "device": "gpu-2"}]
                }
            }
        },
    }
    good = json.loads(json.dumps(item))
    good["metadata"]["uid"] = UID
    assert sorted(claims_in_use([item, good], driver=DRIVER, pool=NODE)) == [UID]


# -- checkpoint keys ------------------------------------------------------------------------


def _stored_record(tmp_path: Path) -> dict[str, object]:
    return checkpoint.stored_claims(tmp_path / "plugin" / "checkpoint.json")[UID]


@pytest.mark.parametrize("uid", PATH_UIDS)
def test_a_checkpoint_record_under_a_path_is_dropped_with_a_log_line(
    tmp_path: Path, uid: str
) -> None:
    keep = _node_with_a_claim(tmp_path)
    path = tmp_path / "plugin" / "checkpoint.json"
    record = _stored_record(tmp_path) | {"state": ClaimState.PREPARE_STARTED.value}
    body = json.loads(path.read_text())["data"]
    body["claims"][uid] = record  # an interrupted prepare: start-up would undo it
    path.write_text(json.dumps({"checksum": checkpoint._checksum(body), "data": body}))
    with capture_logs() as logs:
        state = _start(tmp_path)
    assert [p for p in keep if not p.exists()] == []
    assert sorted(state.prepared_claims()) == [UID]
    dropped = [e for e in logs if e["event"] == "checkpoint record not under a claim UID: dropped"]
    assert [e["claim_uid"] for e in dropped] == [uid]


@pytest.mark.parametrize("uid", PATH_UIDS)
def test_a_journal_record_under_a_path_is_dropped_with_a_log_line(tmp_path: Path, uid: str) -> None:
    keep = _node_with_a_claim(tmp_path)
    record = _stored_record(tmp_path) | {"state": ClaimState.PREPARE_STARTED.value}
    with (tmp_path / "plugin" / "checkpoint.json.journal").open("ab") as f:
        f.write(journal.encode([journal.Change(uid, record)]))
    with capture_logs() as logs:
        state = _start(tmp_path)
    assert [p for p in keep if not p.exists()] == []
    assert sorted(state.prepared_claims()) == [UID]
    dropped = [e for e in logs if e["event"] == "checkpoint record not under a claim UID: dropped"]
    assert [e["claim_uid"] for e in dropped] == [uid]


# -- the kubelet's calls --------------------------------------------------------------------


@pytest.mark.parametrize("uid", NOT_UIDS)
def test_prepare_refuses_what_the_kubelet_plugin_refuses(tmp_path: Path, uid: str) -> None:
    # One check for both: the driver's own (behind binding conditions, which do not come
    # through the kubelet plugin's gRPC check) used to let "A-UPPER", "...", "-rf" through.
    state = _start(tmp_path)
    before = _all_files(tmp_path)
    out = state.prepare([_claim(uid, "gpu-2")])[uid]
    assert isinstance(out, ClaimError) and "invalid claim UID" in str(out)
    assert state.prepared_claims() == {}
    assert _all_files(tmp_path) == before
    assert state.unprepare([_ref(uid)]) == {uid: None}
