"""Sockets bound before the driver is loaded: the kubelet's calls wait, then are served."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra_health.v1 import api_pb2 as health_pb2
from dra_driver._proto.dra_health.v1 import api_pb2_grpc as health_grpc
from dra_driver.kubeletplugin import DeviceHealth, HealthStatus, Plugin
from dra_driver.kubeletplugin.late import LateParts, Parts

from .helpers import (
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
    assert parts.attached
    with pytest.raises(RuntimeError):
        parts.attach(Parts(FakeDriver(), FakeFetcher()))
