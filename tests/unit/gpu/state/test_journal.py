"""The checkpoint's journal: what a replay gives back after clean writes, cut batches and
failed writes."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi.writer import DurableWriteError
from dra_driver.gpu.state.journal import Change, Journal, encode, read, scan


def _record(name: str, state: str = "PrepareCompleted") -> dict[str, Any]:
    return {"state": state, "namespace": "ns", "name": name}


def _replayed(path: Path, base: dict[str, Any] | None = None) -> dict[str, Any]:
    claims = dict(base or {})
    for change in read(path):
        if change.record is None:
            claims.pop(change.uid, None)
        else:
            claims[change.uid] = change.record
    return claims


def test_replay_applies_batches_in_order(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    journal.append([Change("u1", _record("a", "PrepareStarted")), Change("u2", _record("b"))])
    journal.append([Change("u1", _record("a"))])
    journal.append([Change("u2", None)])
    journal.close()
    claims = _replayed(tmp_path / "j")
    assert list(claims) == ["u1"]
    assert claims["u1"] == _record("a")


@pytest.mark.parametrize(("cut", "kept"), [(1, ["u1"]), (30, ["u1"]), (-30, ["u1", "u2"])])
def test_a_cut_last_batch_keeps_its_whole_lines(tmp_path: Path, cut: int, kept: list[str]) -> None:
    """Each whole line is one claim's complete record of what was already done on the node."""
    journal = Journal(tmp_path / "j")
    journal.append([Change("u1", _record("a"))])
    journal.close()
    tail = encode([Change("u2", _record("b")), Change("u3", _record("c"))])
    with (tmp_path / "j").open("ab") as f:
        f.write(tail[:cut])
    assert list(_replayed(tmp_path / "j")) == kept


def test_a_corrupt_line_ends_the_replay(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    journal.append([Change("u1", _record("a"))])
    journal.append([Change("u2", _record("b"))])
    journal.close()
    raw = (tmp_path / "j").read_bytes().replace(b'"name":"b"', b'"name":"x"')
    (tmp_path / "j").write_bytes(raw)
    assert list(_replayed(tmp_path / "j")) == ["u1"]


def test_replay_onto_a_later_snapshot_gives_the_same_state(tmp_path: Path) -> None:
    """A crash after the snapshot but before the journal is emptied loses nothing."""
    journal = Journal(tmp_path / "j")
    journal.append([Change("u1", _record("a")), Change("u2", _record("b"))])
    journal.append([Change("u1", None), Change("u3", _record("c"))])
    journal.close()
    earlier = {"u1": _record("x"), "u9": _record("z")}
    later = _replayed(tmp_path / "j", earlier)
    assert _replayed(tmp_path / "j", later) == later
    assert sorted(_replayed(tmp_path / "j")) == ["u2", "u3"]


def test_opening_empties_the_journal(tmp_path: Path) -> None:
    Journal(tmp_path / "j").append([Change("u1", _record("a"))])
    Journal(tmp_path / "j").close()
    assert (tmp_path / "j").read_bytes() == b""
    assert _replayed(tmp_path / "j") == {}


def test_a_failed_sync_takes_the_batch_back_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Later batches must stay readable: no cut line may stay in front of them."""
    journal = Journal(tmp_path / "j")
    journal.append([Change("u1", _record("a"))])

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdatasync", no_space)
    with pytest.raises(OSError):
        journal.append([Change("u2", _record("b"))])
    monkeypatch.undo()
    journal.append([Change("u3", _record("c"))])
    journal.close()
    assert sorted(_replayed(tmp_path / "j")) == ["u1", "u3"]


def test_full_after_the_compaction_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dra_driver.gpu.state.journal.COMPACT_BYTES", 200)
    journal = Journal(tmp_path / "j")
    journal.append([Change("u1", _record("a"))])
    assert not journal.full
    journal.append([Change(f"u{i}", _record("b")) for i in range(3)])
    assert journal.full
    journal.reset()
    assert not journal.full and (tmp_path / "j").stat().st_size == 0


def test_opening_to_read_later_leaves_the_journal_as_it_is(tmp_path: Path) -> None:
    Journal(tmp_path / "j").append([Change("u1", _record("a"))])
    kept = Journal(tmp_path / "j", empty=False)
    assert list(_replayed(tmp_path / "j")) == ["u1"]
    assert kept.size == (tmp_path / "j").stat().st_size
    assert not kept.appendable  # its records are not in a snapshot of this agent's yet
    kept.reset()
    assert _replayed(tmp_path / "j") == {}
    assert kept.appendable
    kept.close()


def test_a_journal_dropped_unclosed_closes_its_file(tmp_path: Path) -> None:
    """The state of an agent that failed to start (or a replaced one) keeps no descriptor: a
    test model or a retrying caller would otherwise run out of them."""

    def open_journals() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir() if _link(fd) == str(tmp_path / "j"))

    journal = Journal(tmp_path / "j")
    assert open_journals() == 1
    del journal
    assert open_journals() == 0
    closed = Journal(tmp_path / "j")
    closed.close()
    closed.close()  # idempotent
    del closed
    assert open_journals() == 0


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:  # the directory's own descriptor, closed by now
        return ""


def test_a_full_disk_while_emptying_the_journal_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Emptying the journal (at start-up and after every snapshot) on a full disk fails as
    every other write of the state does: an error that names the file."""
    journal = Journal(tmp_path / "j")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DurableWriteError, match=f"cannot write {tmp_path / 'j'}: No space"):
        journal.reset()
    journal.close()
    with pytest.raises(DurableWriteError, match=r"cannot write .*: No such file or directory"):
        Journal(tmp_path / "gone" / "j")


@pytest.mark.parametrize(("cut", "whole"), [(None, True), (1, False), (30, False), (-1, False)])
def test_scan_tells_a_journal_that_ends_in_a_cut_batch(
    tmp_path: Path, cut: int | None, whole: bool
) -> None:
    """A batch appended behind a cut line is never read back: the caller must know."""
    journal = Journal(tmp_path / "j")
    journal.append([Change("u1", _record("a"))])
    journal.close()
    if cut is not None:
        with (tmp_path / "j").open("ab") as f:
            f.write(encode([Change("u2", _record("b"))])[:cut])
    assert scan(tmp_path / "j")[1] is whole
    assert scan(tmp_path / "nothing") == ([], True)
