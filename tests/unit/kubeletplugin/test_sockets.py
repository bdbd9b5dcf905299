"""Socket naming (defaults, rolling updates, AF_UNIX limit) and recovery from a registry wipe."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.pluginregistration import api_pb2 as reg_pb2
from dra_driver._proto.pluginregistration import api_pb2_grpc as reg_grpc
from dra_driver.kubeletplugin import MAX_SOCKET_PATH, Plugin, socket_paths
from dra_driver.kubeletplugin.server import UnixServer

from .helpers import (
    DRIVER,
    FakeDriver,
    FakeFetcher,
    channel,
    config_for,
    make_claim,
    prepare_request,
)

POD_UID = "0f4e3c1a-9b7d-4f0e-8a2b-3c4d5e6f7a8b"


def _len(path: Path) -> int:
    return len(os.fsencode(path))


def test_default_paths() -> None:
    paths = socket_paths(DRIVER)
    assert str(paths.registration) == "/var/lib/kubelet/plugins_registry/gpu.dra.dev-reg.sock"
    assert str(paths.dra) == "/var/lib/kubelet/plugins/gpu.dra.dev/dra.sock"
    assert str(paths.lock) == "/var/lib/kubelet/plugins/gpu.dra.dev/prepare.lock"


def test_rolling_update_paths_carry_pod_uid() -> None:
    paths = socket_paths(DRIVER, pod_uid=POD_UID)
    assert paths.registration.name == f"{DRIVER}-{POD_UID}-reg.sock"
    assert paths.dra.name == f"dra-{POD_UID}.sock"
    assert paths.lock == socket_paths(DRIVER).lock


def test_relative_dirs_become_absolute() -> None:
    paths = socket_paths(DRIVER, Path("reg"), Path("plug"))
    assert paths.registration.is_absolute() and paths.dra.is_absolute()


@pytest.mark.parametrize("extra", range(0, 34, 3))
def test_long_dirs_hash_the_uid_to_fit(extra: int) -> None:
    base = Path("/tmp") / ("d" * (30 + extra))
    paths = socket_paths(DRIVER, base / "registry", base / "plugins", POD_UID)
    for path in (paths.registration, paths.dra):
        assert _len(path) <= MAX_SOCKET_PATH
    assert paths.registration.name.startswith(f"{DRIVER}-")
    assert paths.registration.name.endswith("-reg.sock")
    # Deterministic: a restarted pod finds its own sockets again.
    assert paths == socket_paths(DRIVER, base / "registry", base / "plugins", POD_UID)
    other = socket_paths(DRIVER, base / "registry", base / "plugins", POD_UID[::-1])
    assert other.registration != paths.registration
    assert other.dra != paths.dra


def test_too_long_dir_is_rejected() -> None:
    with pytest.raises(ValueError, match="AF_UNIX"):
        socket_paths(DRIVER, Path("/" + "x" * 120), Path("/p"), POD_UID)
    with pytest.raises(ValueError, match="AF_UNIX"):
        socket_paths(DRIVER, Path("/" + "x" * 120), Path("/p"))


@pytest.fixture
def long_dir() -> Iterator[Path]:
    """A base directory that pushes socket paths right up to the AF_UNIX limit."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="kp"))
    # registry: <deep>/r/<driver>-<uid>-reg.sock must overflow with the full UID.
    deep = base / ("x" * (MAX_SOCKET_PATH - _len(base) - len(f"/r/{DRIVER}--reg.sock") - 12))
    deep.mkdir()
    yield deep
    shutil.rmtree(base, ignore_errors=True)


async def test_serves_on_hashed_sockets_at_the_limit(
    long_dir: Path, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    cfg = config_for(long_dir, pod_uid=POD_UID)
    cfg = type(cfg)(
        **{**cfg.__dict__, "registry_dir": long_dir / "r", "plugins_dir": long_dir / "p"}
    )
    async with Plugin(cfg, driver, fetcher) as p:
        assert POD_UID not in p.paths.registration.name
        assert _len(p.paths.registration) <= MAX_SOCKET_PATH
        assert _len(p.paths.registration) >= MAX_SOCKET_PATH - 1
        assert _len(p.paths.dra) <= MAX_SOCKET_PATH
        async with channel(p.paths.registration) as ch:
            info = await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=5)
        assert info.endpoint == str(p.paths.dra)
        ref = fetcher.add(make_claim("a1"))
        async with channel(Path(info.endpoint)) as ch:
            resp = await v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                prepare_request(v1_pb2, ref), timeout=5
            )
        assert resp.claims["a1"].error == ""


def _is_socket(path: Path) -> bool:
    return path.is_socket()


async def _wait_for_socket(path: Path, within: float) -> float:
    start = time.monotonic()
    while not _is_socket(path):
        if time.monotonic() - start > within:
            raise AssertionError(f"{path} not recreated within {within}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def _get_info(path: Path) -> reg_pb2.PluginInfo:
    async with channel(path) as ch:
        return await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=5)


async def test_registration_socket_recreated_after_registry_wipe(
    short_dir: Path, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    cfg = config_for(short_dir)
    cfg = type(cfg)(**{**cfg.__dict__, "watch_interval": 0.5})  # the production default
    async with Plugin(cfg, driver, fetcher) as p:
        p.registered.set()
        p.paths.registration.unlink()
        assert await _wait_for_socket(p.paths.registration, 2.0) < 2.0
        assert not p.registered.is_set()  # the kubelet must register us again
        assert (await _get_info(p.paths.registration)).name == DRIVER
        # A whole-directory wipe, as a restarting kubelet may do.
        shutil.rmtree(p.paths.registration.parent)
        await _wait_for_socket(p.paths.registration, 2.0)
        assert (await _get_info(p.paths.registration)).endpoint == str(p.paths.dra)
    assert not p.paths.registration.exists()


async def test_dra_socket_recreated(
    short_dir: Path, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    async with Plugin(config_for(short_dir), driver, fetcher) as p:
        reg_ctime = p.paths.registration.stat().st_ctime_ns
        p.paths.dra.unlink()
        await _wait_for_socket(p.paths.dra, 2.0)
        ref = fetcher.add(make_claim("a1"))
        async with channel(p.paths.dra) as ch:
            resp = await v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                prepare_request(v1_pb2, ref), timeout=5
            )
        assert resp.claims["a1"].error == ""
        # The registration socket is renewed too, so the kubelet re-registers.
        await _wait_for_socket(p.paths.registration, 2.0)
        assert p.paths.registration.stat().st_ctime_ns != reg_ctime


async def test_refuses_to_delete_a_non_socket(
    short_dir: Path, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    p = Plugin(config_for(short_dir), driver, fetcher)
    p.paths.dra.parent.mkdir(parents=True)
    p.paths.dra.write_text("not a socket")
    with pytest.raises(FileExistsError):
        await p.start()
    await p.stop()
    assert p.paths.dra.read_text() == "not a socket"


async def test_a_socket_that_cannot_be_bound_is_an_os_error_naming_it() -> None:
    """The command line reports an ``OSError`` as one line; grpcio raises RuntimeError when
    it cannot bind, which escaped as a traceback. /proc refuses any new file."""
    path = Path("/proc/self/dra.sock")
    server = UnixServer(path, lambda _: None, "dra")
    with pytest.raises(OSError, match=f"cannot listen on {path}"):
        await server.start()
    assert not server.running
