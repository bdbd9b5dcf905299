"""Shared GPUs: the selection syntax, how they are published, and shares at prepare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.gpu.publish.publisher import NodePublishing
from dra_driver.gpu.sharing.selection import Selection, SelectionError, parse_selection
from dra_driver.gpu.sharing.shared_gpus import (
    Share,
    ShareError,
    check_fits,
    consumed,
    share_of,
    shared_uuids,
)
from dra_driver.gpu.sharing.simulated import SimulatedSharing
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from dra_driver.resourceslice.pool import render_pool
from tests.unit.cdi_schema import schema_errors
from tests.unit.slice_rules import check_pool

NODE = "node-1"
DRIVER = "gpu.dra.dev"
GIB = 2**30


# --- selection ----------------------------------------------------------------------------


def test_selection_syntax() -> None:
    assert parse_selection("") == Selection() and Selection().empty
    assert parse_selection("all").all
    assert parse_selection("index:0,2").indices == {0, 2}
    sel = parse_selection("index:1; model:L4 ;uuid:GPU-a,GPU-b")
    assert sel.indices == {1} and sel.models == ("l4",) and sel.uuids == {"GPU-a", "GPU-b"}
    for bad in ("some", "index:", "index:a", "colour:red"):
        with pytest.raises(SelectionError):
            parse_selection(bad)


def test_selection_picks_gpus_not_in_mig_mode() -> None:
    inventory = SimulatedDiscovery("mixed", NODE).discover()
    by_minor = {g.minor: g for g in inventory.gpus}
    # mixed: gpu-0 and gpu-1 are in MIG mode, gpu-2 is an H100, gpu-3 an L4.
    assert shared_uuids(inventory, parse_selection("all")) == {by_minor[2].uuid, by_minor[3].uuid}
    assert shared_uuids(inventory, parse_selection("model:l4")) == {by_minor[3].uuid}
    assert shared_uuids(inventory, parse_selection("index:0,3")) == {by_minor[3].uuid}


@pytest.mark.parametrize(("memory", "shared"), [(0, False), (2 * GIB - 1, False), (2 * GIB, True)])
def test_gpus_with_too_little_memory_are_published_whole(memory: int, shared: bool) -> None:
    """The API server refuses a memory request policy whose minimum (1Gi), or minimum plus one
    step, is more than the capacity, and with it the slice. A unified-memory GPU (GB10) is
    published with memory 0: selected for sharing, it is published whole, with a warning."""
    inventory = SimulatedDiscovery("l4x4", NODE).discover()
    small = inventory.gpus[0].model_copy(
        update={"product_name": "NVIDIA GB10", "memory_bytes": memory}
    )
    inventory = inventory.model_copy(update={"gpus": (small, *inventory.gpus[1:])})
    with structlog.testing.capture_logs() as logs:
        uuids = shared_uuids(inventory, parse_selection("all"))
    assert (small.uuid in uuids) is shared
    assert uuids >= {g.uuid for g in inventory.gpus[1:]}
    warned = [e["gpu"] for e in logs if e["log_level"] == "warning"]
    assert warned == ([] if shared else [small.uuid])
    slices = render_pool(build_catalog(inventory, shared=uuids).pool(NODE, DRIVER))
    assert check_pool(slices) == []
    assert _devices(slices)["gpu-0"].get("allowMultipleAllocations", False) is shared


# --- publishing ---------------------------------------------------------------------------


def _devices(pool_slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in pool_slices for d in s["spec"].get("devices") or []}


def test_shared_gpu_is_published_with_consumable_capacity() -> None:
    inventory = SimulatedDiscovery("l4x4", NODE).discover()
    pool = build_catalog(inventory, shared={inventory.gpus[1].uuid}).pool(NODE, DRIVER)
    slices = render_pool(pool)
    assert check_pool(slices) == []
    devices = _devices(slices)
    assert "allowMultipleAllocations" not in devices["gpu-0"]
    shared = devices["gpu-1"]
    assert shared["allowMultipleAllocations"] is True
    assert shared["capacity"]["memory"]["requestPolicy"] == {
        "default": str(GIB),
        "validRange": {"min": str(GIB), "step": str(GIB)},
    }
    assert shared["capacity"]["compute"] == {
        "value": "100",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
    }
    assert shared["capacity"]["multiprocessors"]["requestPolicy"] == {
        "default": "0",
        "validValues": ["0"],
    }


def test_dynamic_mig_publishes_no_placements_of_a_shared_gpu(tmp_path: Path) -> None:
    from dra_driver.gpu.mig.simulated import SimulatedMig

    inventory = SimulatedDiscovery("dgx-h100", NODE).discover()
    first = inventory.gpus[0]
    backend = SimulatedMig(tmp_path / "mig.json", inventory)
    publishing = NodePublishing(backend, inventory, frozenset({first.uuid}))
    slices = render_pool(publishing.pool(NODE, DRIVER))
    assert check_pool(slices) == []
    devices = _devices(slices)
    assert not [n for n in devices if n.startswith("gpu-0-mig-")]
    assert [n for n in devices if n.startswith("gpu-1-mig-")]
    assert devices["gpu-0"]["allowMultipleAllocations"] is True
    assert "consumesCounters" not in devices["gpu-0"]
    assert "consumesCounters" in devices["gpu-1"]


# --- shares -------------------------------------------------------------------------------


def test_consumed_capacity_arithmetic() -> None:
    assert consumed({"memory": "10Gi", "compute": "30", "gpu.dra.dev/multiprocessors": "0"}) == {
        "memory": 10 * GIB,
        "compute": 30,
        "multiprocessors": 0,
    }
    share = share_of("s1", {"memory": "20Gi", "compute": "0"})
    assert share == Share("s1", 20 * GIB, 0) and share.thread_percentage is None
    assert share_of("s2", {"memory": "1.5Gi"}).memory_bytes == 3 * GIB // 2
    with pytest.raises(ShareError, match="no memory"):
        share_of("s3", {})
    with pytest.raises(ShareError, match="not a percentage"):
        share_of("s4", {"memory": "1Gi", "compute": "101"})
    check_fits(Share("a", 40 * GIB), 39 * GIB, 79 * GIB, gpu="GPU-1")
    with pytest.raises(ShareError, match=r"already hold 40\.0 GiB"):
        check_fits(Share("a", 40 * GIB), 40 * GIB, 79 * GIB, gpu="GPU-1")


def _state(tmp_path: Path, sim: SimulatedSharing) -> tuple[DeviceState, str]:
    inventory = SimulatedDiscovery("dgx-h100", NODE).discover()
    uuid = inventory.gpus[0].uuid
    state = DeviceState(
        inventory=inventory,
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "plugin",
        boot_id="boot-1",
        sharing=sim,
        shared_gpus=frozenset({uuid}),
    )
    return state, uuid


def _share(uid: str, memory: str, compute: str = "0", device: str = "gpu-0") -> ClaimToPrepare:
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "shareID": f"share-{uid}",
        "consumedCapacity": {"memory": memory, "compute": compute, "multiprocessors": "0"},
    }
    return ClaimToPrepare(
        ref=ClaimRef("ns", f"claim-{uid}", uid), claim={}, results=(result,), config=()
    )


def test_shares_join_one_daemon_and_the_last_one_stops_it(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state, uuid = _state(tmp_path, sim)
    out = state.prepare([_share("a", "10Gi"), _share("b", "20Gi", compute="30")])
    assert isinstance(out["a"], list) and isinstance(out["b"], list)
    assert out["a"][0].share_id == "share-a"
    assert out["a"][0].cdi_device_ids == ("k8s.gpu.dra.dev/claim=a-gpu-0-share-a",)
    daemon = sim.read().mps["gpu-0"]
    assert daemon.state == "running" and daemon.uuids == [uuid] and daemon.starts == 1
    spec_a = json.loads(state.spec_path("a").read_text())
    spec_b = json.loads(state.spec_path("b").read_text())
    assert schema_errors(spec_a) == [] and spec_a["devices"][0]["name"] == "a-gpu-0-share-a"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in spec_a["devices"][0]["containerEdits"]["env"]
    assert not [e for e in spec_a["devices"][0]["containerEdits"]["env"] if "THREAD_PERCENTAGE" in e]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in spec_b["devices"][0]["containerEdits"]["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in spec_b["devices"][0]["containerEdits"]["env"]
    pipes = {
        m["hostPath"]
        for s in (spec_a, spec_b)
        for m in s["devices"][0]["containerEdits"]["mounts"]
        if m["containerPath"] == "/tmp/nvidia-mps"
    }
    assert pipes == {daemon.pipe_dir}
    state.unprepare([ClaimRef("ns", "claim-a", "a")])
    assert sim.read().mps["gpu-0"].state == "running"
    state.unprepare([ClaimRef("ns", "claim-b", "b")])
    assert sim.read().mps["gpu-0"].state == "stopped"
    assert not Path(daemon.pipe_dir).exists()
    assert [e["op"] for e in sim.read().log] == ["start-mps", "stop-mps"]


def test_over_commit_is_refused_per_claim(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state, _ = _state(tmp_path, sim)
    # The simulated H100 has 81559 MiB (79.6 GiB).
    out = state.prepare([_share("a", "40Gi"), _share("b", "30Gi"), _share("c", "10Gi")])
    assert isinstance(out["a"], list) and isinstance(out["b"], list)
    assert isinstance(out["c"], Exception)
    assert "claim ns/claim-c" in str(out["c"]) and "already hold 70.0 GiB" in str(out["c"])
    state.unprepare([ClaimRef("ns", "claim-b", "b")])
    assert isinstance(state.prepare([_share("c", "10Gi")])["c"], list)


def test_exclusive_claim_and_shares_exclude_each_other(tmp_path: Path) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state, _ = _state(tmp_path, sim)
    assert isinstance(state.prepare([_share("a", "10Gi")])["a"], list)
    whole = ClaimToPrepare(
        ref=ClaimRef("ns", "claim-x", "x"),
        claim={},
        results=({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},),
        config=(),
    )
    out = state.prepare([whole])
    assert isinstance(out["x"], Exception) and "shareID" in str(out["x"])
    # A share may not carry its own sharing settings: MPS already shares the GPU.
    cfg = {
        "source": "FromClaim",
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.dra.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing"},
            },
        },
    }
    claim = _share("t", "1Gi")
    claim = ClaimToPrepare(ref=claim.ref, claim={}, results=claim.results, config=(cfg,))
    out = state.prepare([claim])
    assert isinstance(out["t"], Exception) and "remove the TimeSlicing config" in str(out["t"])


async def test_without_consumable_capacity_shared_gpus_are_published_and_prepared_whole(
    tmp_path: Path,
) -> None:
    sim = SimulatedSharing(tmp_path / "sim.json")
    state, uuid = _state(tmp_path, sim)
    inventory = SimulatedDiscovery("dgx-h100", NODE).discover()
    publishing = NodePublishing(None, inventory, frozenset({uuid}))
    assert _devices(render_pool(publishing.pool(NODE, DRIVER)))["gpu-0"]["allowMultipleAllocations"]

    given_up = await publishing.on_dropped(frozenset({"DRAConsumableCapacity"}))
    assert (
        list(given_up) == ["DRAConsumableCapacity"]
        and "whole GPUs" in given_up["DRAConsumableCapacity"]
    )
    devices = _devices(render_pool(publishing.pool(NODE, DRIVER)))
    assert not any(d.get("allowMultipleAllocations") for d in devices.values())
    assert not any(
        "requestPolicy" in c for d in devices.values() for c in d.get("capacity", {}).values()
    )
    assert await publishing.on_dropped(frozenset({"DRAConsumableCapacity"})) == {}  # once

    # The scheduler now allocates the GPU whole, without a share: prepare takes it as such.
    whole = ClaimToPrepare(
        ref=ClaimRef("ns", "claim-x", "x"),
        claim={},
        results=({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},),
        config=(),
    )
    assert isinstance(state.prepare([whole])["x"], Exception)
    state.stop_sharing_by_memory()
    out = state.prepare([whole])["x"]
    assert isinstance(out, list) and out[0].cdi_device_ids == ("k8s.gpu.dra.dev/claim=x-gpu-0",)


def test_model_list_is_not_one_silent_substring() -> None:
    """index: and uuid: take comma lists; model:L4,H100 must not silently share nothing."""
    inventory = SimulatedDiscovery("mixed", NODE).discover()
    by_minor = {g.minor: g for g in inventory.gpus}
    assert shared_uuids(inventory, parse_selection("model:H100,L4")) == {
        by_minor[2].uuid,
        by_minor[3].uuid,
    }


def test_shares_of_one_gpu_in_one_claim_add_up_their_compute(tmp_path: Path) -> None:
    """The scheduler counts each share's compute against the GPU's 100: a claim holding shares
    of 30 and 40 was given 70, as its memory limit is the sum of its shares' memory. A share
    with no compute limit (0) leaves the claim's clients unlimited."""
    sim = SimulatedSharing(tmp_path / "sim.json")
    state, _ = _state(tmp_path, sim)

    def two(uid: str, first: str, second: str) -> ClaimToPrepare:
        a, b = _share(uid, "10Gi", compute=first), _share(f"{uid}2", "20Gi", compute=second)
        results = (a.results[0], {**b.results[0], "request": "gpu2"})
        return ClaimToPrepare(ref=a.ref, claim={}, results=results, config=())

    out = state.prepare([two("a", "30", "40"), two("b", "0", "20")])
    assert isinstance(out["a"], list) and isinstance(out["b"], list)
    env_a = json.loads(state.spec_path("a").read_text())["devices"][0]["containerEdits"]["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30720M" in env_a
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70" in env_a
    env_b = json.loads(state.spec_path("b").read_text())["devices"][0]["containerEdits"]["env"]
    assert not [e for e in env_b if "THREAD_PERCENTAGE" in e]
