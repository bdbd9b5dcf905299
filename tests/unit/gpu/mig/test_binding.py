"""Binding conditions for dynamic MIG: what is published, what waits for the agent, how the
agent prepares before binding, reports, and lets go of claims deallocated before a pod ran."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_driver.claimreport import DeviceStatus, status_body
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.mig.backend import MigError
from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE
from dra_driver.gpu.publish.catalog import MIG_FAILED, MIG_READY
from dra_driver.gpu.publish.publisher import BINDING, NodePublishing
from dra_driver.gpu.state.checkpoint import stored_claims
from dra_driver.kubeletplugin.binding import allocated_devices, failure_status, waiting_devices
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from dra_driver.resourceslice.pool import render_pool
from tests.unit.gpu.mig.test_dynamic_mig import (
    DRIVER,
    NODE,
    _backend,
    _instances,
    _inventory,
    _state,
)
from tests.unit.slice_rules import check_pool

MIG_1G = "gpu-0-mig-1g10gb-19-0"


# -- publishing --------------------------------------------------------------------------------


async def test_placements_carry_binding_conditions_until_the_server_drops_them(
    tmp_path: Path,
) -> None:
    publishing = NodePublishing(_backend(tmp_path), _inventory(), binding=True)
    assert publishing.binding
    slices = render_pool(publishing.pool(NODE, DRIVER))
    assert check_pool(slices) == []
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    assert devices[MIG_1G]["bindingConditions"] == [MIG_READY]
    assert devices[MIG_1G]["bindingFailureConditions"] == [MIG_FAILED]
    # The whole GPU needs no MIG device made: it binds at once.
    assert "bindingConditions" not in devices["gpu-0"]
    assert sum("bindingConditions" in d for d in devices.values()) == len(devices) - 1

    assert await publishing.on_dropped(frozenset({BINDING})) == {
        BINDING: "MIG devices are created when the kubelet prepares the claim, after binding"
    }
    assert not publishing.binding
    devices = {d["name"]: d for s in publishing.pool(NODE, DRIVER).slices for d in s.devices}
    assert not any("bindingConditions" in d for d in devices.values())


def test_no_binding_conditions_without_dynamic_mig() -> None:
    publishing = NodePublishing(None, _inventory(), binding=True)
    assert not publishing.binding


# -- which claims wait for the agent -----------------------------------------------------------


def _api_claim(
    devices: Sequence[str],
    status: Sequence[dict[str, Any]] = (),
    *,
    pool: str = NODE,
    deleting: bool = False,
    binding: bool = True,
) -> dict[str, Any]:
    results = [
        {"request": "r", "driver": DRIVER, "pool": pool, "device": d}
        | (
            {"bindingConditions": [MIG_READY], "bindingFailureConditions": [MIG_FAILED]}
            if binding
            else {}
        )
        for d in devices
    ]
    meta: dict[str, Any] = {
        "name": "c",
        "namespace": "ns",
        "uid": "11111111-2222-3333-4444-555555555555",
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "allocation": {"devices": {"results": results}, "allocationTimestamp": "t0"},
            "devices": list(status),
        },
    }


def _entry(device: str, **conditions: str) -> dict[str, Any]:
    return {
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "conditions": [{"type": k, "status": v} for k, v in conditions.items()],
    }


@pytest.mark.parametrize(
    ("claim", "waiting"),
    [
        (_api_claim([MIG_1G]), {MIG_1G}),
        (_api_claim([MIG_1G], [_entry(MIG_1G, Ready="True")]), {MIG_1G}),
        (_api_claim([MIG_1G], [_entry(MIG_1G, **{MIG_READY: "False"})]), {MIG_1G}),
        (_api_claim([MIG_1G], [_entry(MIG_1G, **{MIG_READY: "True"})]), set()),
        # Failed: the scheduler deallocates it, nothing more to do here.
        (_api_claim([MIG_1G], [_entry(MIG_1G, **{MIG_FAILED: "True"})]), set()),
        (_api_claim([MIG_1G], deleting=True), set()),
        (_api_claim([MIG_1G], pool="other-node"), set()),
        (_api_claim(["gpu-0"], binding=False), set()),
        (_api_claim([MIG_1G, "gpu-1"], [_entry(MIG_1G, **{MIG_READY: "True"})]), {"gpu-1"}),
    ],
)
def test_waiting_devices(claim: dict[str, Any], waiting: set[str]) -> None:
    assert waiting_devices(claim, DRIVER, NODE) == waiting


def test_allocated_devices_of_this_pool_only() -> None:
    claim = _api_claim([MIG_1G, "gpu-1"])
    claim["status"]["allocation"]["devices"]["results"].append(
        {"request": "r", "driver": "other.dev", "pool": NODE, "device": "nic-0"}
    )
    assert allocated_devices(claim, DRIVER, NODE) == {MIG_1G, "gpu-1"}
    assert allocated_devices({"metadata": {}}, DRIVER, NODE) == frozenset()


# -- status written ----------------------------------------------------------------------------


def test_status_sets_binding_conditions_or_failure_conditions() -> None:
    ref = ClaimRef("ns", "c", "u")
    ok = status_body(ref, DRIVER, NODE, [DeviceStatus(MIG_1G, {"uuid": "MIG-1"}, [MIG_READY])], "t")
    conditions = ok["status"]["devices"][0]["conditions"]
    assert [(c["type"], c["status"]) for c in conditions] == [
        ("Ready", "True"),
        (MIG_READY, "True"),
    ]
    failed = status_body(
        ref, DRIVER, NODE, [DeviceStatus(MIG_1G, {}, (), ([MIG_FAILED], "boom"))], "t"
    )
    (entry,) = failed["status"]["devices"]
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in entry["conditions"]] == [
        (MIG_FAILED, "True", "PrepareFailed", "boom")
    ]


def test_failure_conditions_name_each_share_of_a_shared_device() -> None:
    """Capacity layout: claims share gpu-0 by shareID, and the API server accepts the status
    of such a device only under its shareID; two shares of one claim are two entries."""
    claim = _api_claim(["gpu-0", "gpu-0"])
    results = claim["status"]["allocation"]["devices"]["results"]
    results[0]["shareID"], results[1]["shareID"] = "share-a", "share-b"
    body = failure_status(claim, DRIVER, NODE, frozenset({"gpu-0"}), "boom", "t")
    assert body is not None
    entries = body["status"]["devices"]
    assert [(e["device"], e.get("shareID")) for e in entries] == [
        ("gpu-0", "share-a"),
        ("gpu-0", "share-b"),
    ]
    assert all(e["conditions"][0]["type"] == MIG_FAILED for e in entries)


# -- the agent's side --------------------------------------------------------------------------


class _Reporter:
    def __init__(self) -> None:
        self.devices: dict[str, list[tuple[Any, ...]]] = {}
        self.failed: dict[str, tuple[list[tuple[Any, ...]], str]] = {}
        self.events: list[str] = []

    def set_devices(
        self, ref: ClaimRef, devices: Sequence[tuple[Any, ...]], version: str | None = None
    ) -> None:
        self.devices[ref.uid] = list(devices)

    def binding_failed(
        self, ref: ClaimRef, devices: Sequence[tuple[Any, ...]], message: str
    ) -> None:
        self.failed[ref.uid] = (list(devices), message)

    def prepare_failed(self, ref: ClaimRef, message: str) -> None:
        self.events.append(message)


UID = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def _to_prepare(device: str) -> ClaimToPrepare:
    claim = _api_claim([device])
    return ClaimToPrepare(
        ref=ClaimRef("ns", "c", UID),
        claim=claim,
        results=tuple(claim["status"]["allocation"]["devices"]["results"]),
        config=(),
    )


def _fail_creation(tmp_path: Path, message: str | None) -> str:
    path = tmp_path / "plugin" / SIMULATED_STATE_FILE
    state = json.loads(path.read_text())
    (uuid,) = state["gpus"]
    if message is None:
        state["gpus"][uuid].pop("failCreate", None)
    else:
        state["gpus"][uuid]["failCreate"] = message
    path.write_text(json.dumps(state))
    return str(uuid)


async def test_prepared_before_binding_then_by_the_kubelet_then_released(tmp_path: Path) -> None:
    state = _state(tmp_path)
    reporter = _Reporter()
    driver = GpuDriver(state, reporter)
    claim = _to_prepare(MIG_1G)
    await driver.prepare_before_binding(claim)
    (made,) = _instances(tmp_path)
    assert (made["profileId"], made["start"]) == (19, 0)
    (device,) = reporter.devices[UID]
    assert device[0] == MIG_1G and device[1]["uuid"].startswith("MIG-") and device[2] == [MIG_READY]
    assert stored_claims(tmp_path / "plugin" / "checkpoint.json")[UID]["beforeBinding"] is True
    # The kubelet's prepare after binding finds it done: same MIG device, no second one.
    result = (await driver.prepare([claim]))[UID]
    assert not isinstance(result, Exception)
    assert len(_instances(tmp_path)) == 1
    # Still allocated: kept. Deallocated (the scheduler gave up, the claim was deleted): gone.
    await driver.allocated({UID: frozenset({MIG_1G})})
    assert UID in state.prepared_claims()
    await driver.allocated({})
    assert UID not in state.prepared_claims() and _instances(tmp_path) == []
    assert reporter.devices[UID] == []


async def test_a_release_that_fails_is_raised_so_the_watcher_hands_the_claims_over_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    driver = GpuDriver(state, _Reporter())
    await driver.prepare_before_binding(_to_prepare(MIG_1G))

    def busy(*args: Any) -> None:
        raise MigError("In use by another client")

    with monkeypatch.context() as patch:
        patch.setattr(state._carver, "destroy", busy)
        # The watcher retries only a call that raised: a failure must not pass for done.
        with pytest.raises(Exception, match="In use by another client"):
            await driver.allocated({})
    assert UID in state.prepared_claims() and len(_instances(tmp_path)) == 1
    await driver.allocated({})
    assert UID not in state.prepared_claims() and _instances(tmp_path) == []


async def test_a_claim_the_kubelet_prepared_is_never_released_by_the_watcher(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)
    driver = GpuDriver(state, _Reporter())
    await driver.prepare([_to_prepare(MIG_1G)])
    await driver.allocated({})
    assert UID in state.prepared_claims() and len(_instances(tmp_path)) == 1


async def test_failed_creation_sets_failure_conditions_and_names_the_gpu(tmp_path: Path) -> None:
    state = _state(tmp_path)
    reporter = _Reporter()
    told: list[tuple[tuple[str, ...], str]] = []
    driver = GpuDriver(state, reporter, on_carve_failed=lambda gpus, why: told.append((gpus, why)))
    uuid = _fail_creation(tmp_path, "Insufficient Resources")
    await driver.prepare_before_binding(_to_prepare(MIG_1G))
    devices, message = reporter.failed[UID]
    assert devices == [(MIG_1G, [MIG_FAILED], None)]  # no shareID: not a shared device
    assert "Insufficient Resources" in message and reporter.events == [message]
    assert told == [((uuid,), message)]
    assert UID not in state.prepared_claims() and _instances(tmp_path) == []
    # A config error is the claim's problem, not the GPU's: failure conditions, no taint.
    told.clear()
    _fail_creation(tmp_path, None)
    bad = _to_prepare(MIG_1G)
    bad = ClaimToPrepare(
        bad.ref,
        bad.claim,
        bad.results,
        ({"opaque": {"driver": DRIVER, "parameters": {"kind": "Nope"}}},),
    )
    await driver.prepare_before_binding(bad)
    assert UID in reporter.failed and told == []


async def test_a_claim_allocated_again_with_new_shares_is_not_answered_from_the_old_ones(
    tmp_path: Path,
) -> None:
    """Capacity layout: a claim deallocated before binding and allocated again on the same
    GPU (new shareIDs) before the watcher saw it go. Its device names are the same, so the
    watcher's view does not change; the first allocation's preparation must still not answer
    for the second: its status would name a share the API server no longer holds."""
    from tests.unit.gpu.mig.test_mig_capacity import _claim, _share
    from tests.unit.gpu.mig.test_mig_capacity import _instances as instances
    from tests.unit.gpu.mig.test_mig_capacity import _state as capacity_state

    state = capacity_state(tmp_path)
    reporter = _Reporter()
    driver = GpuDriver(state, reporter)
    first = _claim(UID, _share("one", 1, 1))
    await driver.prepare_before_binding(first)
    assert [d[4] for d in reporter.devices[UID]] == ["share-one"]
    assert len(instances(tmp_path)) == 1
    await driver.allocated({UID: frozenset({"gpu-0"})})  # the view: the same device name
    again = _claim(UID, _share("two", 1, 1))
    await driver.prepare_before_binding(again)
    assert [d[4] for d in reporter.devices[UID]] == ["share-two"]
    record = state.record(UID)
    assert record is not None and [d.share_id for d in record.devices] == ["share-two"]
    assert len(instances(tmp_path)) == 1  # the first share's MIG device went with it
    # Prepared again for the same allocation (the watcher's retry): kept as it is.
    uuid = record.devices[0].uuid
    await driver.prepare_before_binding(again)
    after = state.record(UID)
    assert after is not None and after.devices[0].uuid == uuid
