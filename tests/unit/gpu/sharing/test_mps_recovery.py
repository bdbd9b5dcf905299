"""MPS daemons of claims rebuilt from their CDI specs, and of prepared claims whose daemon
died."""

from __future__ import annotations

from pathlib import Path

from dra_driver.gpu.sharing.simulated import SimulatedSharing
from dra_driver.kubeletplugin.interfaces import ClaimRef
from tests.unit.gpu.sharing.test_shared_gpus import _share, _state
from tests.unit.gpu.sharing.test_sharing import MPS, _claim, _ref
from tests.unit.gpu.sharing.test_sharing import _state as _mps_state


def test_a_recovered_share_keeps_its_gpus_daemon_when_another_share_goes(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state, _ = _state(tmp_path, sim)
    assert isinstance(state.prepare([_share("a", "10Gi")])["a"], list)
    # The checkpoint is lost; the agent restarts and rebuilds it from A's CDI spec.
    (tmp_path / "plugin" / "checkpoint.json").unlink()
    restarted, _ = _state(tmp_path, sim)
    assert "a" in restarted.prepared_claims()
    assert sim.read().mps["gpu-0"].state == "running"
    # Another share of the same GPU comes and goes while A's pod runs.
    assert isinstance(restarted.prepare([_share("b", "10Gi")])["b"], list)
    assert restarted.unprepare([ClaimRef("ns", "claim-b", "b")]) == {"b": None}
    # A's pod still talks to the GPU's daemon.
    assert sim.read().mps["gpu-0"].state == "running"
    # When A goes too, the daemon goes with it.
    assert restarted.unprepare([ClaimRef("ns", "claim-a", "a")]) == {"a": None}
    assert sim.read().mps["gpu-0"].state == "stopped"


def test_a_recovered_mps_claims_daemon_is_stopped_at_its_unprepare(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _mps_state(tmp_path, sim)
    assert isinstance(state.prepare([_claim("m", "gpu-2", config=MPS)])["m"], list)
    (tmp_path / "plugin" / "checkpoint.json").unlink()
    restarted = _mps_state(tmp_path, sim)
    assert sim.read().mps["m"].state == "running"
    assert restarted.unprepare([_ref("m")]) == {"m": None}
    # The claim is gone: so is its daemon (was: left running until the next restart).
    assert sim.read().mps["m"].state == "stopped"


def test_a_prepared_claims_dead_daemon_is_restarted_when_its_next_pod_comes(
    tmp_path: Path,
) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _mps_state(tmp_path, sim)
    assert isinstance(state.prepare([_claim("m", "gpu-2", config=MPS)])["m"], list)
    sim.kill_mps("m")  # the daemon dies (OOM killer, crash)
    # A second pod of the claim starts: the kubelet prepares the claim again.
    assert isinstance(state.prepare([_claim("m", "gpu-2", config=MPS)])["m"], list)
    daemon = sim.read().mps["m"]
    assert daemon.state == "running" and daemon.starts == 2
    assert daemon.active_thread_percentage == 40 and daemon.pinned_memory == {"0": "8192M"}


def test_a_recovered_claims_daemon_serves_only_the_gpus_that_asked_for_mps(
    tmp_path: Path,
) -> None:
    """A claim with an exclusive GPU and an MPS GPU: its daemon serves the MPS GPU alone.
    Rebuilt from the claim's CDI spec after the checkpoint is lost, the record must name
    the same GPUs, or a daemon started again for it would take the exclusive GPU too."""
    sim = SimulatedSharing(tmp_path / "sim.json")
    state = _mps_state(tmp_path, sim)
    mps_second = [{**MPS[0], "requests": ["req1"]}]
    prepared = state.prepare([_claim("m", "gpu-3", "gpu-2", config=mps_second)])
    assert isinstance(prepared["m"], list)
    served = sim.read().mps["m"].uuids
    assert len(served) == 1
    (tmp_path / "plugin" / "checkpoint.json").unlink()
    restarted = _mps_state(tmp_path, sim)
    record = restarted.prepared_claims()["m"]
    assert record.mps is not None and record.mps.uuids == served
