"""The plugin-registration handshake as the kubelet performs it."""

from __future__ import annotations

from pathlib import Path

import structlog

from dra_driver._proto.pluginregistration import api_pb2 as reg_pb2
from dra_driver._proto.pluginregistration import api_pb2_grpc as reg_grpc
from dra_driver.kubeletplugin import Plugin

from .helpers import DRIVER, NODE, FakeDriver, FakeFetcher, ListHealthSource, channel, config_for


async def test_get_info_describes_dra_plugin(plugin: Plugin) -> None:
    async with channel(plugin.paths.registration) as ch:
        info = await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=5)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(plugin.paths.dra)
    assert Path(info.endpoint).is_absolute()
    # v1 first: the kubelet takes the first entry it supports.
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


async def test_default_socket_names(plugin: Plugin, short_dir: Path) -> None:
    assert plugin.paths.registration == short_dir / "registry" / f"{DRIVER}-reg.sock"
    assert plugin.paths.dra == short_dir / "plugins" / DRIVER / "dra.sock"
    assert plugin.paths.registration.is_socket()
    assert plugin.paths.dra.is_socket()


async def test_health_versions_advertised_only_with_source(
    short_dir: Path, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    async with (
        Plugin(config_for(short_dir), driver, fetcher, health=ListHealthSource([])) as p,
        channel(p.paths.registration) as ch,
    ):
        info = await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=5)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
        "v1.DRAResourceHealth",
    ]


async def test_registration_status_sets_and_clears_event(plugin: Plugin) -> None:
    seen: list[int] = []
    plugin.registration._on_registered = lambda: seen.append(plugin.registration.count)
    assert not plugin.registered.is_set()
    async with channel(plugin.paths.registration) as ch:
        stub = reg_grpc.RegistrationStub(ch)
        with structlog.testing.capture_logs() as logs:
            await stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5
            )
            assert plugin.registered.is_set()
            await stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=False, error="version mismatch"),
                timeout=5,
            )
    assert not plugin.registered.is_set()
    assert plugin.registration.error == "version mismatch"
    assert seen == [1]
    ok = [e for e in logs if e["event"] == "registered with kubelet"]
    assert ok and ok[0]["log_level"] == "info" and ok[0]["node"] == NODE
    bad = [e for e in logs if e["log_level"] == "error"]
    assert len(bad) == 1
    assert bad[0]["reason"] == "version mismatch"
    assert bad[0]["driver"] == DRIVER


async def test_stop_removes_sockets(
    short_dir: Path, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    p = Plugin(config_for(short_dir), driver, fetcher)
    await p.start()
    await p.stop()
    assert not p.paths.registration.exists()
    assert not p.paths.dra.exists()


async def test_stale_socket_from_previous_run_is_replaced(
    short_dir: Path, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    first = Plugin(config_for(short_dir), driver, fetcher)
    await first.start()
    # Simulate a crash: the files stay, the servers go away without cleaning up.
    await first._reg._server.stop(0)
    await first._dra._server.stop(0)
    async with (
        Plugin(config_for(short_dir), driver, fetcher) as second,
        channel(second.paths.registration) as ch,
    ):
        info = await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=5)
        assert info.name == DRIVER
