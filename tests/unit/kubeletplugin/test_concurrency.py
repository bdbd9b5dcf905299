"""Serialisation of driver calls, deadlines and cancellation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver.kubeletplugin import Plugin
from dra_driver.kubeletplugin.lock import NodeLock

from .helpers import (
    FakeDriver,
    FakeFetcher,
    channel,
    config_for,
    make_claim,
    prepare_request,
    unprepare_request,
)


async def test_concurrent_prepare_and_unprepare_are_serialised(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    driver.delay = 0.05
    refs = [fetcher.add(make_claim(f"a{i}")) for i in range(3)]
    calls = []
    for _ in range(3):
        for ref in refs:
            calls.append(v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=10))
            calls.append(v1_stub.NodeUnprepareResources(unprepare_request(v1_pb2, ref), timeout=10))
    responses = await asyncio.gather(*calls)
    assert all(not c.error for r in responses for c in r.claims.values())
    # Calls that queue up behind a running one may be merged into one driver call.
    assert len(driver.calls) <= len(calls)
    assert {u for _, uids in driver.calls for u in uids} == {r.uid for r in refs}
    assert driver.overlaps == 0


async def test_waiting_calls_are_merged_into_one_driver_call(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    """While one driver call runs, the prepares queued behind it go in one batch."""
    driver.delay = 0.2
    refs = [fetcher.add(make_claim(f"a{i}")) for i in range(16)]
    first = asyncio.ensure_future(
        v1_stub.NodePrepareResources(prepare_request(v1_pb2, refs[0]), timeout=10)
    )
    await asyncio.wait_for(driver.started.wait(), 5)
    rest = [
        v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=10) for ref in refs[1:]
    ]
    responses = [await first, *await asyncio.gather(*rest)]
    for ref, response in zip(refs, responses, strict=True):
        assert [d.device_name for d in response.claims[ref.uid].devices] == [f"gpu-{ref.uid}"]
    assert len(driver.calls) == 2
    assert sorted(driver.calls[1][1]) == sorted(r.uid for r in refs[1:])
    assert driver.overlaps == 0
    # The first ran alone; the batch was told of the calls merged into it.
    assert driver.others == [0, 14]


async def test_a_lone_call_is_told_no_other_call_is_in_progress(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    ref = fetcher.add(make_claim("a"))
    await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=10)
    await v1_stub.NodeUnprepareResources(unprepare_request(v1_pb2, ref), timeout=10)
    assert [op for op, _ in driver.calls] == ["prepare", "unprepare"]
    assert driver.others == [0, 0]


async def test_two_instances_share_the_node_lock(short_dir: Path, fetcher: FakeFetcher) -> None:
    """An old and a new pod during a rolling update never run driver calls at the same time."""
    shared = FakeDriver(delay=0.05)
    ref = fetcher.add(make_claim("a1"))
    old = Plugin(config_for(short_dir, pod_uid="old-pod"), shared, fetcher)
    new = Plugin(config_for(short_dir, pod_uid="new-pod"), shared, fetcher)
    assert old.paths.lock == new.paths.lock
    assert old.paths.dra != new.paths.dra
    async with old, new, channel(old.paths.dra) as c1, channel(new.paths.dra) as c2:
        stubs = [v1_grpc.DRAPluginStub(c1), v1_grpc.DRAPluginStub(c2)]
        calls = []
        for i in range(6):
            stub = stubs[i % 2]
            calls.append(stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=10))
            calls.append(stub.NodeUnprepareResources(unprepare_request(v1_pb2, ref), timeout=10))
        await asyncio.gather(*calls)
    assert 2 <= len(shared.calls) <= 12  # calls queued in one instance may be merged
    assert shared.overlaps == 0


async def _eventually(predicate: Callable[[], bool], within: float = 2.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


async def test_deadline_cancels_slow_driver_and_releases_lock(
    plugin: Plugin, v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    driver.delay = 5.0
    ref = fetcher.add(make_claim("a1"))
    start = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=0.3)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The handler stops working on the claim instead of running on after the caller left.
    await _eventually(lambda: driver.active == 0 and not plugin.lock.locked())
    assert time.monotonic() - start < 2.0
    driver.delay = 0.0
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=5)
    assert resp.claims["a1"].error == ""


async def test_client_cancel_releases_lock(
    plugin: Plugin, v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    driver.delay = 5.0
    ref = fetcher.add(make_claim("a1"))
    call = v1_stub.NodeUnprepareResources(unprepare_request(v1_pb2, ref))
    await asyncio.wait_for(driver.started.wait(), 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await _eventually(lambda: driver.active == 0 and not plugin.lock.locked())
    driver.delay = 0.0
    resp = await v1_stub.NodeUnprepareResources(unprepare_request(v1_pb2, ref), timeout=5)
    assert resp.claims["a1"].error == ""


async def test_deadline_while_waiting_for_file_lock(
    plugin: Plugin, v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    """Another instance holds the node lock past our deadline; nothing stays locked after."""
    other = NodeLock(plugin.paths.lock)
    ref = fetcher.add(make_claim("a1"))
    async with other.hold():
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert driver.calls == []
    await _eventually(lambda: not plugin.lock.locked())
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=5)
    assert resp.claims["a1"].error == ""
    assert driver.calls == [("prepare", ("a1",))]


async def test_lock_serialises_tasks_and_survives_cancellation(short_dir: Path) -> None:
    lock = NodeLock(short_dir / "x.lock")
    inside = 0
    peak = 0

    async def work() -> None:
        nonlocal inside, peak
        async with lock.hold():
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    tasks = [asyncio.create_task(work()) for _ in range(10)]
    await asyncio.sleep(0.015)
    tasks[5].cancel()
    tasks[9].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert peak == 1
    assert not lock.locked()
    async with asyncio.timeout(1):
        async with lock.hold():
            pass


async def test_lock_recreates_missing_directory(short_dir: Path) -> None:
    lock = NodeLock(short_dir / "gone" / "x.lock")
    async with lock.hold():
        assert (short_dir / "gone" / "x.lock").exists()


async def test_lock_without_file_serialises_in_process() -> None:
    lock = NodeLock(None)
    async with lock.hold():
        assert lock.locked()
    assert not lock.locked()
