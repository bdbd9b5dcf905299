"""Sharing strategies: the manager runs each registered one at every step, in order."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from dra_driver.gpu.allocation import AllocatedDevice
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.sharing.backend import SharingBackend
from dra_driver.gpu.sharing.manager import SharingManager
from dra_driver.gpu.sharing.mps import Mps
from dra_driver.gpu.sharing.registry import STRATEGIES
from dra_driver.gpu.sharing.shared_gpus import SharedGpus, ShareError
from dra_driver.gpu.sharing.simulated import SimulatedSharing
from dra_driver.gpu.sharing.strategy import Strategy
from dra_driver.gpu.sharing.timeslicing import TimeSlicing
from dra_driver.gpu.state.checkpoint import ClaimRecord, ClaimState, DeviceRecord


class Recorder(Strategy):
    def __init__(self, name: str, calls: list[str], daemon: str | None = None) -> None:
        self.name, self.calls, self.daemon = name, calls, daemon

    def check(
        self, claim: str, devices: Sequence[AllocatedDevice], prepared: Sequence[ClaimRecord]
    ) -> None:
        self.calls.append(f"{self.name}.check")

    def daemons(self, devices: Sequence[AllocatedDevice]) -> set[str]:
        return {self.daemon} if self.daemon else set()

    def annotate(
        self, claim_uid: str, devices: Sequence[AllocatedDevice], record: ClaimRecord, root: Path
    ) -> None:
        self.calls.append(f"{self.name}.annotate")
        record.devices[0].timeslice = self.name

    def apply(self, claim: str, record: ClaimRecord, backend: SharingBackend) -> None:
        self.calls.append(f"{self.name}.apply:{record.devices[0].timeslice}")

    def release(
        self,
        released: Sequence[ClaimRecord],
        remaining: Sequence[ClaimRecord],
        backend: SharingBackend,
    ) -> list[str]:
        self.calls.append(f"{self.name}.release")
        return []


def _claim() -> tuple[list[AllocatedDevice], ClaimRecord]:
    gpu = SimulatedDiscovery("l4x4", "n").discover().gpus[0]
    device = AllocatedDevice(requests=("r",), device_name="gpu-0", gpu=gpu)
    rec = DeviceRecord(request_names=["r"], pool_name="n", device_name="gpu-0", uuid=gpu.uuid)
    return [device], ClaimRecord(
        state=ClaimState.PREPARE_STARTED, namespace="ns", name="c", devices=[rec]
    )


def test_registry_holds_one_of_each_strategy() -> None:
    assert [type(s) for s in STRATEGIES] == [TimeSlicing, Mps, SharedGpus]


def test_steps_run_in_order_and_release_in_reverse(tmp_path: Path) -> None:
    calls: list[str] = []
    backend = SimulatedSharing(tmp_path / "sim.json")
    strategies = (Recorder("a", calls), Recorder("b", calls))
    manager = SharingManager(backend, tmp_path / "mps", strategies)
    devices, record = _claim()
    manager.annotate("u", devices, record)
    manager.check("ns/c", devices, [])
    manager.apply("ns/c", record)
    manager.release([record], [])
    assert calls == [
        "a.annotate",
        "b.annotate",
        "a.check",
        "b.check",
        "a.apply:b",
        "b.apply:b",
        "b.release",
        "a.release",
    ]


def test_two_daemons_for_one_claim_are_refused(tmp_path: Path) -> None:
    calls: list[str] = []
    strategies = (Recorder("a", calls, daemon="gpu-0"), Recorder("b", calls, daemon="claim"))
    manager = SharingManager(None, tmp_path / "mps", strategies)
    devices, _ = _claim()
    with pytest.raises(ShareError, match="would need 2 MPS control daemons"):
        manager.check("ns/c", devices, [])
