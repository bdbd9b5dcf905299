"""The durable writer under filesystem faults: a write fails clearly or fully succeeds, the
previous file stays intact, no temp file is left, and no pre-placed path is followed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi.writer import (
    DurableWriteError,
    spec_file_name,
    sweep_temp_files,
    write_atomic,
)
from dra_driver.gpu.state import checkpoint
from dra_driver.gpu.state.checkpoint import CheckpointData, ClaimRecord, ClaimState
from tests.unit.faultfs import KINDS, OPERATIONS, FaultFS

# Enough calls of each operation to cover every call one write makes (checked below).
MAX_NTH = 3


def _spec(n: int) -> dict[str, Any]:
    # Large enough that a half write is visibly truncated JSON.
    return {
        "cdiVersion": "0.3.0",
        "kind": "k8s.gpu.dra.dev/claim",
        "devices": [{"name": f"dev-{n}-{i}", "containerEdits": {"env": [f"X={i}"]}} for i in range(200)],
    }


def _checkpoint(n: int) -> CheckpointData:
    data = CheckpointData(boot_id="boot-1")
    for i in range(n):
        data.claims[f"uid-{i}"] = ClaimRecord(state=ClaimState.PREPARE_COMPLETED, namespace="ns", name=f"c{i}", devices=[])
    return data


def _write_spec(path: Path, n: int) -> None:
    write_atomic(path, _spec(n))


def _read_spec(path: Path) -> Any:
    return json.loads(path.read_text())


def _write_checkpoint(path: Path, n: int) -> None:
    checkpoint.save(path, _checkpoint(n))


def _read_checkpoint(path: Path) -> Any:
    return sorted(checkpoint.load(path, "boot-1").claims)


TARGETS: dict[str, tuple[str, Callable[[Path, int], None], Callable[[Path], Any]]] = {
    "cdi-spec": (spec_file_name("k8s.gpu.dra.dev", "claim", "uid-1"), _write_spec, _read_spec),
    "checkpoint": ("checkpoint.json", _write_checkpoint, _read_checkpoint),
}


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_one_clean_write_stays_within_the_injection_range(tmp_path: Path, faultfs: FaultFS) -> None:
    write_atomic(tmp_path / "f.json", _spec(1))
    # One exclusive create, one or more writes, fsync of file and directory, one rename.
    assert faultfs.calls["create"] == 1 and faultfs.calls["rename"] == 1
    assert faultfs.calls["fsync"] == 2
    assert 1 <= faultfs.calls["write"] <= MAX_NTH


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize(
    ("op", "kind"), [(op, kind) for op in OPERATIONS for kind in KINDS if kind != "short" or op == "write"]
)
@pytest.mark.parametrize("nth", range(1, MAX_NTH + 1))
def test_fault_fails_clearly_or_write_succeeds(
    tmp_path: Path, faultfs: FaultFS, target: str, op: str, kind: str, nth: int
) -> None:
    name, write, read = TARGETS[target]
    path = tmp_path / name
    write(path, 1)
    before = read(path)
    faultfs.arm(op, nth, kind)
    renames = faultfs.calls["rename"]
    try:
        write(path, 2)
    except DurableWriteError as exc:
        assert faultfs.injected, "failed without an injected fault"
        assert str(path) in str(exc) and os.strerror(exc.errno or 0) in str(exc)
        after = read(path)
        # Only a failed directory fsync comes after the rename: then the new file is whole.
        assert after == before or (op == "fsync" and faultfs.calls["rename"] > renames)
    else:
        assert not faultfs.injected or kind == "short", faultfs.injected
        assert read(path) != before
    assert _leftovers(tmp_path) == []


def test_short_writes_all_the_way_down_still_write_everything(tmp_path: Path, faultfs: FaultFS) -> None:
    faultfs.arm("write", 1, "short", every=True)
    write_atomic(tmp_path / "f.json", _spec(3))
    assert faultfs.calls["write"] > 5
    assert _read_spec(tmp_path / "f.json") == _spec(3)


def test_a_write_that_makes_no_progress_fails_instead_of_looping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dra_driver.cdi import writer

    class _Stuck:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data: Any) -> int:
            return 0

    (tmp_path / "f.json").write_text('{"old": true}')
    monkeypatch.setattr(writer, "os", _Stuck())
    with pytest.raises(DurableWriteError, match="no progress"):
        write_atomic(tmp_path / "f.json", _spec(1))
    assert json.loads((tmp_path / "f.json").read_text()) == {"old": True}
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["checkpoint.json", spec_file_name("k8s.gpu.dra.dev", "claim", "u")])
def test_a_symlink_at_the_old_temp_path_is_not_followed(tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / f".{name}.tmp").symlink_to(victim)
    write_atomic(tmp_path / name, {"a": 1})
    assert victim.read_text() == "precious"
    assert json.loads((tmp_path / name).read_text()) == {"a": 1}


def test_sweep_removes_only_our_temp_files(tmp_path: Path) -> None:
    ours = [".k8s.gpu.dra.dev-claim_u.json.tmp", ".k8s.gpu.dra.dev-claim_v.json.ab12_x.tmp"]
    theirs = [".other-vendor_x.json.tmp", "k8s.gpu.dra.dev-claim_u.json", ".k8s.gpu.dra.dev-claim_w.json"]
    for name in ours + theirs:
        (tmp_path / name).write_text("x")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = ".k8s.gpu.dra.dev-claim_l.json.tmp"
    (tmp_path / link).symlink_to(victim)
    removed = sweep_temp_files(tmp_path, prefix="k8s.gpu.dra.dev-claim_")
    assert sorted(removed) == sorted([*ours, link])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*theirs, "victim"])
    assert victim.read_text() == "precious"
    assert sweep_temp_files(tmp_path / "missing") == []
