"""Health bookkeeping: which devices an event taints, what the kubelet hears, what is ignored."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery, build_inventory, load_profile
from dra_driver.gpu.health.broadcast import HealthBroadcaster
from dra_driver.gpu.health.injected import (
    InjectedProber,
    inject,
    injected_events,
    read_injected,
)
from dra_driver.gpu.health.recheck import recheck_once
from dra_driver.gpu.health.tracker import HealthEvent, HealthTracker, parse_xids
from dra_driver.gpu.inventory import Inventory, MigState
from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE, SimulatedMig
from dra_driver.gpu.publish.catalog import CAPACITY, Catalog, build_catalog
from dra_driver.gpu.publish.publisher import NodePublishing, fallback_inventory
from dra_driver.kubeletplugin.interfaces import HealthStatus
from dra_driver.resourceslice.pool import render_pool
from tests.unit.slice_rules import check_pool

DRIVER = "gpu.dra.dev"
NODE = "n"
SINGLE_H100 = str(Path(__file__).parents[2] / "data" / "single-h100.yaml")


def _tracker(profile: str = "mixed") -> tuple[HealthTracker, list[str]]:
    inventory = SimulatedDiscovery(profile, "n").discover()
    return HealthTracker(inventory, DRIVER), [g.uuid for g in inventory.gpus]


def test_xid_on_a_gpu_taints_it_and_its_mig_devices() -> None:
    tracker, uuids = _tracker()
    assert tracker.apply(HealthEvent(uuids[0], "xid", 79), 0.0)
    taints = tracker.taints()
    # gpu-0 too, though in MIG mode: dynamic MIG publishes it, and its placements inherit it.
    assert sorted(taints) == [
        "gpu-0",
        "gpu-0-mig-1g10gb-19-6",
        "gpu-0-mig-2g20gb-14-4",
        "gpu-0-mig-3g40gb-9-0",
    ]
    assert taints["gpu-0-mig-3g40gb-9-0"][0] | {"timeAdded": "x"} == {
        "key": f"{DRIVER}/xid",
        "value": "79",
        "effect": "NoSchedule",
        "timeAdded": "x",
    }
    assert not tracker.apply(HealthEvent(uuids[0], "xid", 79), 0.0)  # nothing new


def test_ignored_xids_change_nothing() -> None:
    tracker, uuids = _tracker()
    for xid in parse_xids("13,31,43,45,68,109"):
        assert not tracker.apply(HealthEvent(uuids[2], "xid", xid), 0.0)
    assert tracker.taints() == {}


def test_lost_gpu_and_recovery() -> None:
    tracker, uuids = _tracker()
    assert tracker.apply(HealthEvent(uuids[2], "gpu-lost"), 0.0)
    assert tracker.taints()["gpu-2"][0]["key"] == f"{DRIVER}/gpu-lost"
    health = {d.device_name: d for d in tracker.device_health("n")}
    assert health["gpu-2"].status is HealthStatus.UNHEALTHY and "lost" in health["gpu-2"].message
    assert health["gpu-3"].status is HealthStatus.HEALTHY
    assert tracker.recover(uuids[2]) == {
        "gpu-2": "GPU is lost (fell off the bus or stopped answering)"
    }
    assert tracker.taints() == {}
    assert tracker.recover(uuids[2]) == {}


def test_unknown_device_is_ignored() -> None:
    tracker, _ = _tracker()
    assert not tracker.apply(HealthEvent("GPU-nope", "xid", 79), 0.0)


def test_tainted_pool_stays_valid() -> None:
    inventory = SimulatedDiscovery("dgx-h100", "n").discover()
    tracker = HealthTracker(inventory, DRIVER)
    tracker.apply(HealthEvent(inventory.gpus[3].uuid, "xid", 48), 0.0)
    slices = render_pool(build_catalog(inventory).pool("n", DRIVER, tracker.taints()))
    assert check_pool(slices) == []
    tainted = [d for s in slices for d in s["spec"]["devices"] if d.get("taints")]
    assert [d["name"] for d in tainted] == ["gpu-3"]


def test_injection_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "inject.json"
    inject(path, "gpu-1", {"xid": 79})
    inject(path, "gpu-2", {"lost": True})
    state = read_injected(path)
    assert injected_events({}, state) == [
        HealthEvent("gpu-1", "xid", 79),
        HealthEvent("gpu-2", "gpu-lost"),
    ]
    inject(path, "gpu-1", None)
    # Clearing is no event (a GPU never says it is fine again): the re-check notices.
    assert injected_events(state, read_injected(path)) == []
    assert InjectedProber(path).probe(["gpu-1", "gpu-2"]) == {
        "gpu-1": None,
        "gpu-2": "still failing: {'lost': True}",
    }
    inject(path, "gpu-1", {"xid": 48})
    assert injected_events(read_injected(path) | {"gpu-1": {"xid": 79}}, read_injected(path)) == [
        HealthEvent("gpu-1", "xid", 48)
    ]


async def test_broadcaster_sends_full_lists_to_every_stream() -> None:
    tracker, uuids = _tracker("l4x4")
    hub = HealthBroadcaster(tracker.device_health("n"))
    first, second = hub.watch(), hub.watch()
    assert len(await anext(first)) == 4 and len(await anext(second)) == 4
    tracker.apply(HealthEvent(uuids[1], "xid", 79), 0.0)
    await hub.publish(tracker.device_health("n"))
    for stream in (first, second):
        devices = await asyncio.wait_for(anext(stream), 2)
        assert [d.device_name for d in devices if d.status is HealthStatus.UNHEALTHY] == ["gpu-1"]


def test_recheck_is_due_an_interval_after_the_latest_event() -> None:
    tracker, uuids = _tracker("l4x4")
    tracker.apply(HealthEvent(uuids[0], "xid", 79), 100.0)
    tracker.apply(HealthEvent("gpu-1", "gpu-lost"), 105.0)
    assert tracker.due(109.9, 10) == []
    assert tracker.due(110.0, 10) == [uuids[0]]
    # The same problem again postpones the re-check without changing the taint.
    since = tracker.taints()["gpu-0"][0]["timeAdded"]
    assert not tracker.apply(HealthEvent(uuids[0], "xid", 79), 108.0)
    assert tracker.due(112.0, 10) == []
    assert tracker.due(118.0, 10) == [uuids[0], "gpu-1"]
    assert tracker.taints()["gpu-0"][0]["timeAdded"] == since


def test_recovery_clears_only_what_its_source_caused() -> None:
    tracker, uuids = _tracker()  # mixed: gpu-0 is in MIG mode
    mig = "gpu-0-mig-1g10gb-19-6"
    tracker.apply(HealthEvent(mig, "xid", 94), 0.0)
    tracker.apply(HealthEvent(uuids[2], "xid", 79), 0.0)
    assert tracker.recover(uuids[2]) == {"gpu-2": "critical Xid 79 error"}
    assert sorted(tracker.unhealthy()) == [mig]
    # A later GPU-wide event takes the MIG device over: its recovery clears all of them.
    tracker.apply(HealthEvent(uuids[0], "gpu-lost"), 1.0)
    assert tracker.recover(mig) == {}
    assert len(tracker.recover(uuids[0])) == 4 and tracker.unhealthy() == {}


class _Prober:
    def __init__(self, healthy: set[str]) -> None:
        self.healthy = healthy
        self.asked: list[list[str]] = []

    def probe(self, sources: Sequence[str]) -> dict[str, str | None]:
        self.asked.append(list(sources))
        return {s: None if s in self.healthy else "still bad" for s in sources}


async def test_recheck_untaints_only_what_the_probe_finds_healthy() -> None:
    tracker, uuids = _tracker("l4x4")
    tracker.apply(HealthEvent(uuids[0], "xid", 79), 0.0)
    tracker.apply(HealthEvent(uuids[1], "gpu-lost"), 0.0)
    prober = _Prober({uuids[1]})
    recovered: list[tuple[str, dict[str, str]]] = []

    def sink(source: str, cleared: dict[str, str]) -> None:
        recovered.append((source, cleared))

    await recheck_once(tracker, prober, 1e9, sink)  # nothing is that old yet
    assert prober.asked == [] and recovered == []
    await recheck_once(tracker, prober, 0.0, sink)
    assert prober.asked == [sorted(uuids[:2])]
    assert recovered == [
        (uuids[1], {"gpu-1": "GPU is lost (fell off the bus or stopped answering)"})
    ]
    assert sorted(tracker.unhealthy()) == ["gpu-0"]
    prober.healthy.add(uuids[0])
    await recheck_once(tracker, prober, 0.0, sink)
    assert tracker.unhealthy() == {} and [s for s, _ in recovered] == [uuids[1], uuids[0]]


class _XidWhileProbing:
    """Finds every source healthy, but an Xid on ``uuid`` arrives while it probes."""

    def __init__(self, tracker: HealthTracker, uuid: str) -> None:
        self.tracker = tracker
        self.uuid = uuid

    def probe(self, sources: Sequence[str]) -> dict[str, str | None]:
        # The agent applies events on its loop while the probe's thread runs: same clock.
        self.tracker.apply(HealthEvent(self.uuid, "xid", 94), time.monotonic())
        return dict.fromkeys(sources)


async def test_recheck_keeps_an_xid_that_arrived_during_its_probe() -> None:
    tracker, uuids = _tracker("l4x4")
    tracker.apply(HealthEvent(uuids[0], "xid", 79), 0.0)
    tracker.apply(HealthEvent(uuids[1], "xid", 79), 0.0)
    recovered: list[str] = []
    await recheck_once(
        tracker, _XidWhileProbing(tracker, uuids[0]), 0.0, lambda s, _: recovered.append(s)
    )
    # gpu-1 is healthy again; gpu-0's fresh Xid is newer than the probe's answer.
    assert recovered == [uuids[1]]
    assert tracker.unhealthy() == {"gpu-0": "critical Xid 94 error"}


def test_recover_clears_only_conditions_older_than_the_probe() -> None:
    tracker, uuids = _tracker("l4x4")
    tracker.apply(HealthEvent(uuids[0], "xid", 79), 10.0)
    tracker.apply(HealthEvent(uuids[1], "xid", 79), 20.0)
    assert tracker.recover(uuids[0], before=10.0) == {}  # an event at the probe's start stays
    assert tracker.recover(uuids[1], before=15.0) == {}
    assert tracker.recover(uuids[0], before=10.5) == {"gpu-0": "critical Xid 79 error"}
    assert sorted(tracker.unhealthy()) == ["gpu-1"]


def test_failed_mig_creation_taints_for_its_hold_but_is_no_health_problem() -> None:
    tracker, uuids = _tracker("dgx-h100")
    event = HealthEvent(uuids[0], "mig-failed", message="Insufficient Resources", hold=300)
    assert tracker.apply(event, 0.0)
    assert tracker.taints()["gpu-0"][0]["key"] == f"{DRIVER}/mig-failed"
    assert tracker.unhealthy()["gpu-0"] == "creating a MIG device failed: Insufficient Resources"
    # Pods on the GPU's devices are fine: the kubelet hears nothing.
    assert {d.status for d in tracker.device_health("n")} == {HealthStatus.HEALTHY}
    # The hold outlasts the re-check interval.
    assert tracker.due(60.0, 30) == [] and tracker.due(300.0, 30) == [uuids[0]]


def test_no_free_mig_placement_taints_until_cleared_and_clearing_spares_other_problems() -> None:
    tracker, uuids = _tracker("dgx-h100")
    event = HealthEvent(uuids[0], "mig-fragmented", message="no placement of 3g.40gb is free")
    assert tracker.apply(event, 0.0)
    assert tracker.taints()["gpu-0"][0]["key"] == f"{DRIVER}/mig-fragmented"
    assert tracker.unhealthy()["gpu-0"].startswith("no MIG placement free: no placement")
    assert {d.status for d in tracker.device_health("n")} == {HealthStatus.HEALTHY}
    assert tracker.clear(uuids[0], "mig-fragmented") == {
        "gpu-0": "no MIG placement free: no placement of 3g.40gb is free"
    }
    assert tracker.taints() == {}
    # An Xid that came since is a problem of its own: clearing fragmentation leaves it.
    tracker.apply(HealthEvent(uuids[1], "xid", xid=79), 1.0)
    assert tracker.clear(uuids[1], "mig-fragmented") == {}
    assert tracker.taints()["gpu-1"][0]["key"] == f"{DRIVER}/xid"


# -- a GPU's events reach every device it is published as, in every layout ---------------


def _mig_on_without_instances(inventory: Inventory, index: int) -> Inventory:
    """``inventory`` with GPU ``index`` as discovery sees it after dynamic MIG used it: MIG
    mode stays on (the carver never turns it off when the last MIG device goes), no MIG
    device is left."""
    gpus = list(inventory.gpus)
    gpus[index] = gpus[index].model_copy(
        update={
            "mig": MigState(capable=True, current_enabled=True, pending_enabled=True),
            "mig_devices": (),
        }
    )
    return inventory.model_copy(update={"gpus": tuple(gpus)})


def _single_h100() -> Inventory:
    """One H100, MIG capable, MIG mode off: the node dynamic MIG carves."""
    return build_inventory(load_profile(SINGLE_H100), NODE)


def test_xid_on_dynamic_mig_gpu_left_in_mig_mode_taints_its_published_devices(
    tmp_path: Path,
) -> None:
    # The agent restarted after dynamic MIG used the GPU: it is in MIG mode, without MIG
    # devices, and published as gpu-0 plus every placement.
    inventory = _mig_on_without_instances(_single_h100(), 0)
    gpu = inventory.gpus[0]
    publishing = NodePublishing(SimulatedMig(tmp_path / SIMULATED_STATE_FILE, inventory), inventory)
    tracker = HealthTracker(inventory, DRIVER)  # as NodeAgent builds it

    # Xid 79: the GPU fell off the bus. Every device of this GPU must be kept off.
    assert tracker.apply(HealthEvent(gpu.uuid, "xid", 79), 0.0)
    assert tracker.apply(HealthEvent(gpu.uuid, "gpu-lost"), 0.0)
    pool = publishing.pool(NODE, DRIVER, tracker.taints())
    devices = [d for s in pool.slices for d in s.devices]
    assert len(devices) > 1, "gpu-0 and its placements are published"
    assert [d["name"] for d in devices if not d.get("taints")] == []
    # And the kubelet hears that pods on any of them lost their GPU.
    health = {d.device_name: d for d in tracker.device_health(NODE)}
    for device in devices:
        assert health[device["name"]].status is HealthStatus.UNHEALTHY
        assert "lost" in health[device["name"]].message


Layout = Callable[[Inventory, Path], Catalog]


def _static(inventory: Inventory, _: Path) -> Catalog:
    return build_catalog(inventory)


def _placements(inventory: Inventory, _: Path) -> Catalog:
    return build_catalog(inventory, dynamic=True)


def _capacity(inventory: Inventory, _: Path) -> Catalog:
    return build_catalog(inventory, dynamic=True, layout=CAPACITY)


def _given_up(inventory: Inventory, tmp_path: Path) -> Catalog:
    """Dynamic MIG given up (no DRAPartitionableDevices): static publishing of the node."""
    backend = SimulatedMig(tmp_path / SIMULATED_STATE_FILE, inventory)
    return build_catalog(fallback_inventory(inventory, backend))


# mixed: gpu-0 is in MIG mode with MIG devices, gpu-1 (an H100 in MIG mode) has them taken
# away below, gpu-2 is a whole MIG-capable H100.
WHOLE, WITH_MIG, MIG_ON_EMPTY = 2, 0, 1
LAYOUTS = [
    pytest.param(WHOLE, _static, id="whole-static"),
    pytest.param(WHOLE, _placements, id="whole-dynamic-placements"),
    pytest.param(WHOLE, _capacity, id="whole-dynamic-capacity"),
    pytest.param(WITH_MIG, _static, id="mig-devices-static"),
    pytest.param(WITH_MIG, _placements, id="mig-devices-dynamic-placements"),
    pytest.param(WITH_MIG, _capacity, id="mig-devices-dynamic-capacity"),
    pytest.param(MIG_ON_EMPTY, _static, id="mig-on-empty-static"),
    pytest.param(MIG_ON_EMPTY, _placements, id="mig-on-empty-dynamic-placements"),
    pytest.param(MIG_ON_EMPTY, _capacity, id="mig-on-empty-dynamic-capacity"),
    pytest.param(MIG_ON_EMPTY, _given_up, id="mig-on-empty-dynamic-given-up"),
]


def _published(catalog: Catalog, tracker: HealthTracker) -> dict[str, bool]:
    """Published device name -> whether it carries a taint (the pool checked valid)."""
    slices = render_pool(catalog.pool(NODE, DRIVER, tracker.taints()))
    assert check_pool(slices) == []
    return {
        d["name"]: bool(d.get("taints")) for s in slices for d in s["spec"].get("devices") or []
    }


def _unhealthy(tracker: HealthTracker) -> set[str]:
    """The devices the kubelet hears are unhealthy."""
    return {
        d.device_name for d in tracker.device_health(NODE) if d.status is HealthStatus.UNHEALTHY
    }


@pytest.mark.parametrize("by_name", [False, True], ids=["uuid", "name"])
@pytest.mark.parametrize(("index", "layout"), LAYOUTS)
def test_a_gpu_event_reaches_every_device_the_gpu_is_published_as(
    tmp_path: Path, index: int, layout: Layout, by_name: bool
) -> None:
    inventory = _mig_on_without_instances(
        SimulatedDiscovery("mixed", NODE).discover(), MIG_ON_EMPTY
    )
    gpu = inventory.gpus[index]
    catalog = layout(inventory, tmp_path)
    tracker = HealthTracker(inventory, DRIVER)
    source = f"gpu-{gpu.minor}" if by_name else gpu.uuid  # simulated nodes inject by name

    assert tracker.apply(HealthEvent(source, "xid", 79), 0.0)
    published = _published(catalog, tracker)
    mine = {n for n in published if catalog.entries[n].gpu.uuid == gpu.uuid}
    # Static MIG publishes nothing of a GPU in MIG mode without MIG devices.
    assert mine or (index, layout) == (MIG_ON_EMPTY, _static)
    assert {n for n, tainted in published.items() if tainted} == mine
    health = {d.device_name for d in tracker.device_health(NODE)}
    assert set(published) <= health, "the kubelet hears about every published device"
    assert _unhealthy(tracker) & set(published) == mine

    assert tracker.recover(source)
    assert not any(_published(catalog, tracker).values()) and _unhealthy(tracker) == set()


@pytest.mark.parametrize(
    "layout", [_static, _placements, _capacity], ids=["static", "placements", "capacity"]
)
def test_an_event_on_a_mig_device_reaches_only_that_device(layout: Layout, tmp_path: Path) -> None:
    inventory = SimulatedDiscovery("mixed", NODE).discover()
    mig = inventory.gpus[WITH_MIG].mig_devices[0]
    name = "gpu-0-mig-3g40gb-9-0"  # its name; with dynamic MIG also that of its placement
    catalog = layout(inventory, tmp_path)
    tracker = HealthTracker(inventory, DRIVER)

    assert tracker.apply(HealthEvent(mig.uuid, "xid", 94), 0.0)
    assert tracker.unhealthy() == {name: "critical Xid 94 error"}
    published = _published(catalog, tracker)
    assert {n for n, tainted in published.items() if tainted} == {name} & set(published)
    assert _unhealthy(tracker) == {name}


@pytest.mark.parametrize("problem", ["mig-fragmented", "mig-failed"])
def test_a_mig_creation_problem_does_not_replace_a_health_problem(problem: str) -> None:
    # A lost GPU (or one with a critical Xid) where a MIG device then cannot be made (a
    # claim allocated before the loss is prepared): the GPU must stay tainted as lost and
    # unhealthy for the kubelet; clearing the MIG problem (30 s later, without a probe)
    # must not untaint it.
    tracker, uuids = _tracker("dgx-h100")
    assert tracker.apply(HealthEvent(uuids[0], "gpu-lost"), 0.0)
    event = HealthEvent(
        uuids[0],
        problem,  # type: ignore[arg-type]
        message="Insufficient Resources",
        hold=300,
    )
    assert not tracker.apply(event, 1.0)
    assert tracker.taints()["gpu-0"][0]["key"] == f"{DRIVER}/gpu-lost"
    health = {d.device_name: d.status for d in tracker.device_health("n")}
    assert health["gpu-0"] is HealthStatus.UNHEALTHY
    assert tracker.clear(uuids[0], problem) == {}  # type: ignore[arg-type]
    assert tracker.taints()["gpu-0"][0]["key"] == f"{DRIVER}/gpu-lost"


async def test_a_gpu_event_taints_mig_devices_made_before_dynamic_mig_was_given_up(
    tmp_path: Path,
) -> None:
    # Dynamic MIG made a MIG device after the agent started (its tracker knows the GPU
    # without it); then the API server dropped DRAPartitionableDevices and the node is
    # published statically: that MIG device is a plain device of its own. An Xid on its
    # GPU must keep the scheduler off it.
    inventory = _single_h100()
    gpu = inventory.gpus[0]
    backend = SimulatedMig(tmp_path / SIMULATED_STATE_FILE, inventory)
    publishing = NodePublishing(backend, inventory)
    tracker = HealthTracker(inventory, DRIVER)  # as NodeAgent builds it, at start
    backend.set_mig_mode(gpu, True)
    profile = next(p for p in gpu.mig_profiles if p.name == "3g.40gb")
    backend.create(gpu, profile, profile.placements[0].start)
    assert await publishing.on_dropped({"DRAPartitionableDevices"})
    assert not publishing.dynamic

    assert tracker.apply(HealthEvent(gpu.uuid, "xid", 79), 0.0)
    slices = render_pool(publishing.pool(NODE, DRIVER, tracker.taints()))
    assert check_pool(slices) == []
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    assert list(devices) == ["gpu-0-mig-3g40gb-9-0"]
    assert [t["key"] for t in devices["gpu-0-mig-3g40gb-9-0"].get("taints", [])] == [
        f"{DRIVER}/xid"
    ]


def test_restored_conditions_stay_only_where_their_source_still_reaches() -> None:
    tracker, gpus = _tracker("l4x4")
    tracker.apply(HealthEvent(gpus[1], "xid", 79), 0.0)
    tracker.apply(HealthEvent(gpus[2], "mig-failed", message="no"), 0.0)  # a hold: not kept
    saved = tracker.saved()
    assert set(saved) == {"gpu-1"}
    restarted, _ = _tracker("l4x4")
    restarted.restore(
        {
            **saved,
            # Renumbered since (gpu-0 is another GPU now), unreadable, not a health problem.
            "gpu-0": {**saved["gpu-1"]},
            "gpu-3": "garbage",
            "gpu-2": {"problem": "mig-failed", "xid": None, "since": "t", "source": gpus[2]},
        },
        5.0,
    )
    assert restarted.taints() == {"gpu-1": tracker.taints()["gpu-1"]}
    assert restarted.due(5.0 + 60.0, 60.0) == [gpus[1]]
    assert restarted.due(5.0 + 59.0, 60.0) == []
