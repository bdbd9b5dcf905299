"""The checkpoint's format: versions, migrations, and a checksum of what is stored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.state import checkpoint
from dra_driver.gpu.state.checkpoint import CheckpointTooNew, ClaimState, CorruptCheckpoint
from dra_driver.gpu.state.device_state import DeviceState

#: Written by checkpoint.save of the version-1 code; never regenerate it.
V1 = Path(__file__).parents[3] / "data" / "checkpoint" / "v1.json"
BOOT = "0d6c2f3a-boot"


def _copy(tmp_path: Path) -> Path:
    path = tmp_path / "checkpoint.json"
    shutil.copy(V1, path)
    return path


def _write(path: Path, body: dict[str, Any]) -> None:
    checksum = checkpoint._checksum(body)  # the stored body, as a newer agent would write it
    path.write_text(json.dumps({"checksum": checksum, "data": body}, indent=2))


def test_version_1_file_is_read_and_upgraded(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    assert json.loads(path.read_text())["data"]["version"] == 1
    data = checkpoint.load(path, BOOT)
    assert data.version == checkpoint.SCHEMA_VERSION == 2
    assert data.boot_id == BOOT
    assert sorted(data.claims) == [
        "uid-mig",
        "uid-mps",
        "uid-share",
        "uid-started",
        "uid-ts",
        "uid-whole",
    ]
    mig = data.claims["uid-mig"]
    assert mig.state is ClaimState.UNPREPARE_STARTED
    assert mig.devices[0].mig is not None and mig.devices[0].mig.gpu_instance_id == 13
    mps = data.claims["uid-mps"].mps
    assert mps is not None and mps.active_thread_percentage == 50
    assert mps.pinned_memory == {"0": "10240M"}
    share = data.claims["uid-share"].devices[0]
    assert share.consumed_capacity == {"memory": "4294967296", "compute": "25"}
    assert share.mps is not None and share.mps.daemon == "gpu-3"
    assert data.claims["uid-ts"].devices[0].timeslice == "Long"
    assert data.claims["uid-started"].state is ClaimState.PREPARE_STARTED

    checkpoint.save(path, data)
    stored = json.loads(path.read_text())["data"]
    assert stored["version"] == 2
    assert "null" not in path.read_text()  # unset fields are left out, all of them
    assert checkpoint.load(path, BOOT) == data


def test_checksum_is_over_the_stored_body_not_the_model(tmp_path: Path) -> None:
    # An optional field stored explicitly as null (the model would leave it out) still checks.
    body = json.loads(V1.read_text())["data"]
    body["claims"]["uid-whole"]["devices"][0]["timeslice"] = None
    body["version"] = 2
    path = tmp_path / "checkpoint.json"
    _write(path, body)
    assert checkpoint.load(path, BOOT).claims["uid-whole"].devices[0].timeslice is None


def test_a_changed_body_is_corrupt_and_moved_aside(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    path.write_text(path.read_text().replace('"Long"', '"Short"'))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        checkpoint.load(path, BOOT)
    assert not path.exists()


def test_a_newer_version_is_refused_and_left_in_place(tmp_path: Path) -> None:
    body = json.loads(V1.read_text())["data"]
    body["version"] = 3
    path = tmp_path / "plugin" / "checkpoint.json"
    path.parent.mkdir()
    _write(path, body)
    before = path.read_text()
    with pytest.raises(CheckpointTooNew, match="format version 3, newer than this agent's 2"):
        DeviceState(
            inventory=SimulatedDiscovery("l4x4", "node-a").discover(),
            driver_name="gpu.dra.dev",
            node_name="node-a",
            cdi_root=tmp_path / "cdi",
            state_dir=path.parent,
            boot_id=BOOT,
        )
    assert path.read_text() == before
    # Nothing moved aside, nothing written: only the node lock file was taken.
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.json", "prepare.lock"]


def test_migrations_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def to_v3(body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "version": 3, "bootID": body["bootID"] + "-v3"}

    monkeypatch.setattr(checkpoint, "SCHEMA_VERSION", 3)
    monkeypatch.setitem(checkpoint.MIGRATIONS, 2, to_v3)
    data = checkpoint.load(_copy(tmp_path), BOOT)
    assert data.version == 3
    assert data.boot_id == BOOT + "-v3"


@pytest.mark.parametrize("version", [0, "1", None])
def test_a_version_that_is_not_one_is_corrupt(tmp_path: Path, version: object) -> None:
    body = json.loads(V1.read_text())["data"]
    body["version"] = version
    path = tmp_path / "checkpoint.json"
    _write(path, body)
    with pytest.raises(CorruptCheckpoint, match="is not a version"):
        checkpoint.load(path, BOOT)


def _record(name: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> checkpoint.ClaimRecord:
    return checkpoint.ClaimRecord(state=state, namespace="ns", name=name)


def test_a_write_told_what_changed_serialises_only_that_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch names its claims: only their records are serialised again (the others as
    remembered), added and removed records are found anyway, and what a fresh reader finds is
    what a full comparison would have written."""
    path = tmp_path / "checkpoint.json"
    file = checkpoint.CheckpointFile(path, "boot-1")
    data = checkpoint.CheckpointData(bootID="boot-1", claims={f"u{i}": _record(f"c{i}") for i in range(5)})
    file.write(data)  # the first write saves a snapshot; the next ones go to the journal
    dumped: list[str] = []
    real = checkpoint._dump
    monkeypatch.setattr(checkpoint, "_dump", lambda rec: (dumped.append(rec.name), real(rec))[1])
    data.claims["u1"].state = ClaimState.PREPARE_STARTED
    del data.claims["u2"]
    data.claims["u9"] = _record("c9")
    file.write(data, changed={"u1", "u2", "u9"})
    assert sorted(dumped) == ["c1", "c9"]
    assert checkpoint.stored_claims(path) == {
        uid: rec.model_dump(mode="json", by_alias=True, exclude_none=True) for uid, rec in data.claims.items()
    }
    restarted = checkpoint.CheckpointFile(path, "boot-1").read()
    assert restarted.claims == data.claims


def test_reading_opens_the_journal_untouched_and_the_first_write_snapshots_it(tmp_path: Path) -> None:
    """The agent reads at start-up: the journal is opened then (its descriptors stay the same
    from then on) but nothing in it changes until the first write, whose snapshot holds what
    the journal held before it is emptied."""
    path = tmp_path / "checkpoint.json"
    writer = checkpoint.CheckpointFile(path, BOOT)
    data = checkpoint.CheckpointData(bootID=BOOT, claims={"u1": _record("c1")})
    writer.write(data)
    data.claims["u2"] = _record("c2")
    writer.write(data, changed={"u2"})  # in the journal only
    writer.close()
    journal_path = tmp_path / "checkpoint.json.journal"
    journalled = journal_path.read_bytes()
    assert journalled

    reader = checkpoint.CheckpointFile(path, BOOT)
    fds = len(list(Path("/proc/self/fd").iterdir()))
    assert sorted(reader.read().claims) == ["u1", "u2"]
    opened = len(list(Path("/proc/self/fd").iterdir()))
    assert opened == fds + 1
    assert journal_path.read_bytes() == journalled

    data.claims["u3"] = _record("c3")
    reader.write(data, changed={"u3"})
    assert len(list(Path("/proc/self/fd").iterdir())) == opened
    assert journal_path.read_bytes() == b""  # all of it in the new snapshot
    assert sorted(checkpoint.stored_claims(path)) == ["u1", "u2", "u3"]
    reader.close()


def test_a_journal_that_cannot_be_opened_at_reading_is_opened_by_the_first_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint.json"
    file = checkpoint.CheckpointFile(path, BOOT)

    def refused(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "Journal", refused)
    assert file.read().claims == {}
    monkeypatch.undo()
    data = checkpoint.CheckpointData(bootID=BOOT, claims={"u1": _record("c1")})
    file.write(data)
    data.claims["u2"] = _record("c2")
    file.write(data, changed={"u2"})
    assert (tmp_path / "checkpoint.json.journal").read_bytes()
    file.close()
    assert sorted(checkpoint.stored_claims(path)) == ["u1", "u2"]
