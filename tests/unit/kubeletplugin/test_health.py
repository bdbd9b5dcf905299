"""DRAResourceHealth streaming (v1alpha1 and v1)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver._proto.dra_health.v1 import api_pb2 as h1_pb2
from dra_driver._proto.dra_health.v1 import api_pb2_grpc as h1_grpc
from dra_driver._proto.dra_health.v1alpha1 import api_pb2 as h1a1_pb2
from dra_driver._proto.dra_health.v1alpha1 import api_pb2_grpc as h1a1_grpc
from dra_driver.kubeletplugin import DeviceHealth, HealthStatus, Plugin
from dra_driver.kubeletplugin.health_servicer import MAX_MESSAGE_LEN, truncate_message

from .helpers import NODE, FakeDriver, FakeFetcher, ListHealthSource, channel, config_for

UPDATES = [
    [
        DeviceHealth(NODE, "gpu-0", HealthStatus.HEALTHY),
        DeviceHealth(NODE, "gpu-1", HealthStatus.HEALTHY, last_updated=1_700_000_000),
    ],
    [
        DeviceHealth(NODE, "gpu-0", HealthStatus.HEALTHY),
        DeviceHealth(
            NODE,
            "gpu-1",
            HealthStatus.UNHEALTHY,
            message="XID 79: " + "x" * 2000,
            timeout_seconds=60,
        ),
    ],
    [],
]


@pytest.fixture
async def health_plugin(
    short_dir: Path, driver: FakeDriver, fetcher: FakeFetcher
) -> AsyncIterator[Plugin]:
    async with Plugin(
        config_for(short_dir), driver, fetcher, health=ListHealthSource(UPDATES)
    ) as p:
        yield p


def _flatten(response: Any) -> list[tuple[str, str, int, str]]:
    return [
        (d.device.pool_name, d.device.device_name, d.health, d.message) for d in response.devices
    ]


@pytest.mark.parametrize(("pb2", "grpc_mod"), [(h1_pb2, h1_grpc), (h1a1_pb2, h1a1_grpc)])
async def test_stream_delivers_complete_lists(
    health_plugin: Plugin, pb2: Any, grpc_mod: Any
) -> None:
    before = int(time.time())
    async with channel(health_plugin.paths.dra) as ch:
        call = grpc_mod.DRAResourceHealthStub(ch).NodeWatchResources(
            pb2.NodeWatchResourcesRequest()
        )
        got = [await call.read() for _ in UPDATES]
        call.cancel()
    assert [len(r.devices) for r in got] == [2, 2, 0]
    first, second, _ = got
    assert _flatten(first) == [
        (NODE, "gpu-0", pb2.HEALTHY, ""),
        (NODE, "gpu-1", pb2.HEALTHY, ""),
    ]
    assert first.devices[0].last_updated_time >= before  # 0 means "now"
    assert first.devices[1].last_updated_time == 1_700_000_000
    bad = second.devices[1]
    assert bad.health == pb2.UNHEALTHY
    assert bad.health_check_timeout_seconds == 60
    assert len(bad.message) == MAX_MESSAGE_LEN
    assert bad.message.startswith("XID 79: ") and bad.message.endswith("...")


async def test_no_health_service_without_source(plugin: Plugin) -> None:
    import grpc

    async with channel(plugin.paths.dra) as ch:
        call = h1_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            h1_pb2.NodeWatchResourcesRequest()
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_truncate_message() -> None:
    assert truncate_message("ok") == "ok"
    assert truncate_message("a" * MAX_MESSAGE_LEN) == "a" * MAX_MESSAGE_LEN
    cut = truncate_message("a" * (MAX_MESSAGE_LEN + 1))
    assert len(cut) == MAX_MESSAGE_LEN and cut.endswith("...")


async def test_a_stream_with_nothing_new_refreshes_the_kubelet_before_its_health_timeout(
    short_dir: Path,
    driver: FakeDriver,
    fetcher: FakeFetcher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kubelet stamps each device with the time it last heard of it and shows the
    device's health as Unknown once ``health_check_timeout_seconds`` (30 s when 0) passed
    without a message. Health that does not change must still be re-sent before that."""
    from dra_driver.kubeletplugin import health_servicer

    # Scaled down: a timeout of 0.6 s must be refreshed well within 0.6 s.
    monkeypatch.setattr(health_servicer, "KUBELET_DEFAULT_TIMEOUT", 0.6, raising=False)
    source = ListHealthSource([[DeviceHealth(NODE, "gpu-0", HealthStatus.UNHEALTHY, "XID 79")]])
    async with (
        Plugin(config_for(short_dir), driver, fetcher, health=source) as p,
        channel(p.paths.dra) as ch,
    ):
        call = h1_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            h1_pb2.NodeWatchResourcesRequest()
        )
        first = await call.read()
        started = time.monotonic()
        again = await asyncio.wait_for(call.read(), 2.0)
        assert time.monotonic() - started < 0.6
        call.cancel()
    assert _flatten(again) == _flatten(first) == [(NODE, "gpu-0", h1_pb2.UNHEALTHY, "XID 79")]


@pytest.mark.parametrize("text", ["é" * 600, "温度" * 400, "x" + "€" * 1023])
def test_a_non_ascii_message_fits_the_kubelets_byte_limit(text: str) -> None:
    """The kubelet caps a message at 1024 bytes (Go's len), not characters: a longer one it
    cuts mid-character, and the pod's status shows a broken character and no marker."""
    cut = truncate_message(text).encode()
    assert len(cut) <= MAX_MESSAGE_LEN
    assert cut.endswith(b"...")
    assert text.startswith(cut.decode()[:-3])  # valid UTF-8, a prefix of the message
