"""Health bookkeeping: which devices an event taints, what the kubelet hears, what is ignored."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.health import (
    HealthBroadcaster,
    HealthEvent,
    HealthTracker,
    inject,
    injected_events,
    parse_xids,
    read_injected,
)
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.kubeletplugin.interfaces import HealthStatus
from dra_driver.resourceslice.pool import render_pool
from tests.unit.slice_rules import check_pool

DRIVER = "gpu.dra.dev"


def _tracker(profile: str = "mixed") -> tuple[HealthTracker, list[str]]:
    inventory = SimulatedDiscovery(profile, "n").discover()
    return HealthTracker(inventory, DRIVER), [g.uuid for g in inventory.gpus]


def test_xid_on_a_gpu_taints_it_and_its_mig_devices() -> None:
    tracker, uuids = _tracker()
    assert tracker.apply(HealthEvent(uuids[0], "xid", 79))
    taints = tracker.taints()
    assert sorted(taints) == ["gpu-0-mig-1g10gb-19-6", "gpu-0-mig-2g20gb-14-4", "gpu-0-mig-3g40gb-9-0"]
    assert taints["gpu-0-mig-3g40gb-9-0"][0] | {"timeAdded": "x"} == {
        "key": f"{DRIVER}/xid",
        "value": "79",
        "effect": "NoSchedule",
        "timeAdded": "x",
    }
    assert not tracker.apply(HealthEvent(uuids[0], "xid", 79))  # nothing new


def test_ignored_xids_change_nothing() -> None:
    tracker, uuids = _tracker()
    for xid in parse_xids("13,31,43,45,68,109"):
        assert not tracker.apply(HealthEvent(uuids[2], "xid", xid))
    assert tracker.taints() == {}


def test_lost_gpu_and_recovery() -> None:
    tracker, uuids = _tracker()
    assert tracker.apply(HealthEvent(uuids[2], "gpu-lost"))
    assert tracker.taints()["gpu-2"][0]["key"] == f"{DRIVER}/gpu-lost"
    health = {d.device_name: d for d in tracker.device_health("n")}
    assert health["gpu-2"].status is HealthStatus.UNHEALTHY and "lost" in health["gpu-2"].message
    assert health["gpu-3"].status is HealthStatus.HEALTHY
    assert tracker.apply(HealthEvent(uuids[2], "recovered"))
    assert tracker.taints() == {}


def test_unknown_device_is_ignored() -> None:
    tracker, _ = _tracker()
    assert not tracker.apply(HealthEvent("GPU-nope", "xid", 79))


def test_tainted_pool_stays_valid() -> None:
    inventory = SimulatedDiscovery("dgx-h100", "n").discover()
    tracker = HealthTracker(inventory, DRIVER)
    tracker.apply(HealthEvent(inventory.gpus[3].uuid, "xid", 48))
    slices = render_pool(build_catalog(inventory).pool("n", DRIVER, tracker.taints()))
    assert check_pool(slices) == []
    tainted = [d for s in slices for d in s["spec"]["devices"] if d.get("taints")]
    assert [d["name"] for d in tainted] == ["gpu-3"]


def test_injection_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "inject.json"
    inject(path, "gpu-1", {"xid": 79})
    inject(path, "gpu-2", {"lost": True})
    state = read_injected(path)
    assert injected_events({}, state) == [HealthEvent("gpu-1", "xid", 79), HealthEvent("gpu-2", "gpu-lost")]
    inject(path, "gpu-1", None)
    assert injected_events(state, read_injected(path)) == [HealthEvent("gpu-1", "recovered")]


async def test_broadcaster_sends_full_lists_to_every_stream() -> None:
    tracker, uuids = _tracker("l4x4")
    hub = HealthBroadcaster(tracker.device_health("n"))
    first, second = hub.watch(), hub.watch()
    assert len(await anext(first)) == 4 and len(await anext(second)) == 4
    tracker.apply(HealthEvent(uuids[1], "xid", 79))
    await hub.publish(tracker.device_health("n"))
    for stream in (first, second):
        devices = await asyncio.wait_for(anext(stream), 2)
        assert [d.device_name for d in devices if d.status is HealthStatus.UNHEALTHY] == ["gpu-1"]
