"""Fixtures for driving the kubelet plugin over real unix sockets."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver.kubeletplugin import Plugin

from .helpers import FakeDriver, FakeFetcher, channel, config_for


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory short enough for AF_UNIX socket paths (pytest's tmp_path may not be)."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="kp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fetcher() -> FakeFetcher:
    return FakeFetcher()


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver()


@pytest.fixture
async def plugin(
    short_dir: Path, driver: FakeDriver, fetcher: FakeFetcher
) -> AsyncIterator[Plugin]:
    p = Plugin(config_for(short_dir), driver, fetcher)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


@pytest.fixture
async def v1_stub(plugin: Plugin) -> AsyncIterator[v1_grpc.DRAPluginStub]:
    async with channel(plugin.paths.dra) as ch:
        yield v1_grpc.DRAPluginStub(ch)
