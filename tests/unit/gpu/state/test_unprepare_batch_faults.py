"""A write that fails in the middle of an unprepare batch (dynamic MIG).

Each MIG claim of a batch records UnprepareStarted before its devices go; when that write
fails for a later claim, the claims before it are already answered unprepared, their CDI
specs removed and their MIG devices destroyed. They must be recorded gone too (or not be
answered unprepared): a claim the kubelet was told is unprepared, but which the checkpoint
still holds as PrepareCompleted, comes back at the next read and keeps its devices from every
new claim until the node reboots (the kubelet never asks again).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver import faults
from dra_driver.gpu.state.checkpoint import stored_claims
from dra_driver.gpu.state.planner import ClaimError
from tests.unit.faultfs import FaultFS
from tests.unit.gpu.mig.test_dynamic_mig import MIG_3G, _claim, _instances, _state
from tests.unit.gpu.state.test_faults import _ref
from tests.unit.gpu.state.test_state import _state as _static_state

A = "0a0a0a0a-0000-4000-8000-00000000000a"
B = "0b0b0b0b-0000-4000-8000-00000000000b"
C = "0c0c0c0c-0000-4000-8000-00000000000c"
MIG_1G = "gpu-0-mig-1g10gb-19-0"


def _fail_after_first_claim(monkeypatch: pytest.MonkeyPatch, faultfs: FaultFS, every: bool) -> None:
    """Once the batch's first claim is taken apart, fail the next fsync (``every``: and all
    after it, a disk that stays full): the second claim's UnprepareStarted write."""
    point = faults.point
    armed: list[str] = []

    def hook(name: str) -> None:
        if name == "unprepare.mig-destroyed" and not armed:
            armed.append(name)
            faultfs.arm("fsync", 1, "ENOSPC", every=every)
        point(name)

    monkeypatch.setattr(faults, "point", hook)


def test_claims_answered_unprepared_stay_gone_when_a_later_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faultfs: FaultFS
) -> None:
    state = _state(tmp_path)
    prepared = state.prepare([_claim(A, MIG_3G), _claim(B, MIG_1G)])
    assert all(isinstance(r, list) for r in prepared.values())
    _fail_after_first_claim(monkeypatch, faultfs, every=False)
    out = state.unprepare([_ref(A), _ref(B)])
    faultfs.clear()
    assert out[A] is None
    assert isinstance(out[B], ClaimError) and "No space left" in str(out[B])
    # A is gone for good: in the file, after a re-read, and for a restarted agent.
    assert sorted(stored_claims(tmp_path / "plugin" / "checkpoint.json")) == [B]
    state.prepared_before_binding()  # reads the checkpoint again
    assert sorted(state.prepared_claims()) == [B]
    assert sorted(_state(tmp_path).prepared_claims()) == [B]
    # A's placement is free for a new claim; B, which failed, is still whole.
    assert isinstance(state.prepare([_claim(C, MIG_3G)])[C], list)
    assert state.spec_path(B).exists() and not state.spec_path(A).exists()
    # The kubelet retries B, which goes now.
    assert state.unprepare([_ref(B), _ref(C)]) == {B: None, C: None}
    assert _instances(tmp_path) == []


def test_claims_are_not_answered_unprepared_when_nothing_can_be_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faultfs: FaultFS
) -> None:
    state = _state(tmp_path)
    state.prepare([_claim(A, MIG_3G), _claim(B, MIG_1G)])
    _fail_after_first_claim(monkeypatch, faultfs, every=True)
    out = state.unprepare([_ref(A), _ref(B)])
    faultfs.clear()
    # The disk stays full: A's removal cannot be recorded, so A is not answered unprepared
    # (the kubelet retries it) rather than answered and brought back at the next read.
    assert isinstance(out[A], ClaimError) and "cannot record that it is unprepared" in str(out[A])
    assert isinstance(out[B], ClaimError)
    assert state.unprepare([_ref(A), _ref(B)]) == {A: None, B: None}
    assert stored_claims(tmp_path / "plugin" / "checkpoint.json") == {}
    assert _state(tmp_path).prepared_claims() == {}
    assert _instances(tmp_path) == []


def test_claims_taken_apart_are_recorded_gone_when_a_later_claim_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whole GPUs, no dynamic MIG: no claim of the batch writes before the batch's last write.
    state = _static_state(tmp_path)
    state.prepare([_claim(A, "gpu-2"), _claim(B, "gpu-3")])
    seen: list[str] = []

    def hook(name: str) -> None:
        # A bug (neither OSError nor MigError) while the second claim is taken apart.
        if name == "unprepare.sharing-released":
            seen.append(name)
            if len(seen) == 2:
                raise RuntimeError("a bug")

    monkeypatch.setattr(faults, "point", hook)
    with pytest.raises(RuntimeError, match="a bug"):
        state.unprepare([_ref(A), _ref(B)])
    # The caller answers the whole batch with the error; A, already taken apart, is recorded
    # gone: a restarted agent does not find it prepared with its CDI spec gone.
    assert sorted(stored_claims(tmp_path / "plugin" / "checkpoint.json")) == [B]
    assert sorted(_static_state(tmp_path).prepared_claims()) == [B]
