"""Sockets bound before the driver is loaded: the kubelet's calls wait, then are served."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra_health.v1 import api_pb2 as health_pb2
from dra_driver._proto.dra_health.v1 import api_pb2_grpc as health_grpc
from dra_driver.kubeletplugin import ClaimRef, DeviceHealth, HealthStatus, Plugin
from dra_driver.kubeletplugin.late import LateParts, Parts
from dra_driver.kubeletplugin.lock import NodeLock, hold_file_lock
from dra_driver.kubeletplugin.node_service import NodeService

from .helpers import (
    DRIVER,
    NODE,
    FakeDriver,
    FakeFetcher,
    ListHealthSource,
    channel,
    config_for,
    make_claim,
    prepare_request,
    unprepare_request,
)

HEALTHY = DeviceHealth("pool", "gpu-0", HealthStatus.HEALTHY, "")


async def test_calls_wait_for_the_parts_then_are_served(short_dir: Path) -> None:
    parts = LateParts()
    fetcher, driver = FakeFetcher(), FakeDriver()
    ref = fetcher.add(make_claim("a-1a7e"))
    plugin = Plugin(config_for(short_dir), parts, parts, health=parts)
    async with plugin, channel(plugin.paths.dra) as ch:
        stub = v1_grpc.DRAPluginStub(ch)
        prepare = asyncio.ensure_future(
            stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=10)
        )
        await asyncio.sleep(0.3)
        # Not answered, and not failed: nothing is loaded to answer from.
        assert not prepare.done()
        assert driver.calls == []

        parts.attach(Parts(driver, fetcher))
        response = await prepare
        assert response.claims["a-1a7e"].error == ""
        assert [d.device_name for d in response.claims["a-1a7e"].devices] == ["gpu-a-1a7e"]
        unprepared = await stub.NodeUnprepareResources(unprepare_request(v1_pb2, ref), timeout=10)
        assert unprepared.claims["a-1a7e"].error == ""
        assert [op for op, _ in driver.calls] == ["prepare", "unprepare"]


async def test_a_health_stream_opened_early_carries_the_source_attached_later(
    short_dir: Path,
) -> None:
    parts = LateParts()
    source = ListHealthSource([[HEALTHY]])
    plugin = Plugin(config_for(short_dir), parts, parts, health=parts)
    async with plugin, channel(plugin.paths.dra) as ch:
        stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        first = asyncio.ensure_future(stream.read())
        await asyncio.sleep(0.3)
        assert not first.done()
        parts.attach(Parts(FakeDriver(), FakeFetcher(), source))
        message = await asyncio.wait_for(first, 10)
        assert [d.device.device_name for d in message.devices] == ["gpu-0"]
        stream.cancel()


def test_registration_is_forwarded_once_attached() -> None:
    parts = LateParts()
    seen: list[str] = []
    parts.registered()  # before: nobody to tell, and nothing lost (the agent starts registered)
    parts.attach(Parts(FakeDriver(), FakeFetcher(), on_registered=lambda: seen.append("r")))
    parts.registered()
    assert seen == ["r"]
    assert parts.ready
    with pytest.raises(RuntimeError):
        parts.attach(Parts(FakeDriver(), FakeFetcher()))


def _load_state(lock: Path) -> None:
    """What a driver's start-up does before it attaches its parts: it loads its state under
    the node's file lock, as the calls it will serve do (blocking, so in a thread)."""
    with hold_file_lock(lock):
        pass


async def test_an_unprepare_held_before_attach_leaves_the_node_lock_to_loading_the_state(
    short_dir: Path,
) -> None:
    parts = LateParts()
    fetcher, driver = FakeFetcher(), FakeDriver()
    plugin = Plugin(config_for(short_dir), parts, parts, health=parts)
    async with plugin, channel(plugin.paths.dra) as ch:
        stub = v1_grpc.DRAPluginStub(ch)
        # The kubelet, seeing the plugin registered, retries an unprepare it still owes
        # (after a plugin restart it does so at once).
        unprepare = asyncio.ensure_future(
            stub.NodeUnprepareResources(
                unprepare_request(v1_pb2, ClaimRef("default", "claim-a", "a-1a7e")), timeout=30
            )
        )
        await asyncio.sleep(0.3)
        assert not unprepare.done()
        loading = asyncio.ensure_future(asyncio.to_thread(_load_state, plugin.paths.lock))
        try:
            done, _ = await asyncio.wait({loading}, timeout=3)
            assert loading in done, "the held unprepare holds the lock the start-up needs"
        finally:
            if not loading.done():
                unprepare.cancel()  # lets go of the lock, so the loading thread can end
                await loading
        parts.attach(Parts(driver, fetcher))
        response = await unprepare
        assert response.claims["a-1a7e"].error == ""
        assert driver.calls == [("unprepare", ("a-1a7e",))]


@pytest.mark.parametrize("loaded", [True, False], ids=["attached", "never-loaded"])
async def test_a_prepare_and_an_unprepare_held_before_attach_are_answered_after_it(
    short_dir: Path, loaded: bool
) -> None:
    """Held until the state is attached, then served; or, when it never loads (the start
    failed, or the agent stops first), answered with why at once: they must not wait out
    the plugin's stop grace and then end as cancelled calls."""
    parts = LateParts()
    fetcher, driver = FakeFetcher(), FakeDriver()
    prepared = fetcher.add(make_claim("a-1a7e"))
    unprepared = ClaimRef("default", "claim-b", "b-2b8f")
    plugin = Plugin(config_for(short_dir), parts, parts, health=parts)
    async with plugin, channel(plugin.paths.dra) as ch:
        stub = v1_grpc.DRAPluginStub(ch)
        calls = asyncio.gather(
            stub.NodePrepareResources(prepare_request(v1_pb2, prepared), timeout=10),
            stub.NodeUnprepareResources(unprepare_request(v1_pb2, unprepared), timeout=10),
        )
        await asyncio.sleep(0.3)
        assert not calls.done()
        assert not plugin.lock.locked()  # held outside the lock, which the start-up needs

        if not loaded:
            parts.fail("cannot reach the API server")
            prepare, unprepare = await asyncio.wait_for(calls, 2)
            assert "cannot reach the API server" in prepare.claims["a-1a7e"].error
            assert "cannot reach the API server" in unprepare.claims["b-2b8f"].error
            assert not plugin.lock.locked()
            return
        parts.attach(Parts(driver, fetcher))
        prepare, unprepare = await calls
        assert prepare.claims["a-1a7e"].error == ""
        assert [d.device_name for d in prepare.claims["a-1a7e"].devices] == ["gpu-a-1a7e"]
        assert unprepare.claims["b-2b8f"].error == ""
        assert sorted(driver.calls) == [("prepare", ("a-1a7e",)), ("unprepare", ("b-2b8f",))]
        assert driver.overlaps == 0


async def test_a_call_cancelled_before_attach_never_takes_the_lock() -> None:
    parts = LateParts()
    driver, lock = FakeDriver(), NodeLock(None)
    service = NodeService(parts, FakeFetcher(), lock, DRIVER, NODE, NODE)
    held = asyncio.create_task(service.unprepare([ClaimRef("default", "claim-a", "a-1a7e")]))
    await asyncio.sleep(0.05)
    assert not lock.locked()
    held.cancel()  # the kubelet's deadline
    await asyncio.gather(held, return_exceptions=True)

    parts.attach(Parts(driver, FakeFetcher()))
    later = ClaimRef("default", "claim-b", "b-2b8f")
    assert await service.unprepare([later]) == {"b-2b8f": ""}
    assert driver.calls == [("unprepare", ("b-2b8f",))]
