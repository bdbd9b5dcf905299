"""The agent checks its settings and reaches the API server before it changes the node
(the kubelet's sockets aside, which it binds first)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver._proto.dra.v1 import api_pb2 as dra_v1
from dra_driver._proto.dra.v1 import api_pb2_grpc as _dra_v1_grpc
from dra_driver.bindsettings import read_socket_settings
from dra_driver.cli import main
from dra_driver.commands import parse
from dra_driver.errors import StartError
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.mig.factory import make_mig_backend
from dra_driver.kube import KubeClient
from dra_driver.kubeconfig import Connection
from dra_driver.launch import run_bound_first
from dra_driver.reach import ApiUnreachableError, reach_api_server
from tests.unit.kubeserver import plain_client, serve

DRIVER = "gpu.dra.dev"
CLAIM_UID = "0f4e3c1a-9b7d-4f0e-8a2b-3c4d5e6f7a8b"
dra_v1_grpc: Any = _dra_v1_grpc  # the generated stubs carry no annotations


def _args(base: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--backend=simulated",
        "--profile=dgx-a100",
        "--node-name=n",
        "--dynamic-mig=true",
        f"--plugins-dir={base / 'plugins'}",
        f"--cdi-root={base / 'cdi'}",
        f"--registry-dir={base / 'registry'}",
        "--metrics-port=0",
        "--health-port=0",
        *extra,
    ]


def _snapshot(base: Path) -> dict[str, str]:
    """Every path under ``base`` with a digest of its content (directories by name only)."""
    out: dict[str, str] = {}
    for path in sorted(base.rglob("*")):
        rel = str(path.relative_to(base))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_missing_kubeconfig_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A node with MIG devices no claim uses (dynamic MIG would destroy them) and a stale temp
    # file (the agent would sweep it): both must survive an agent that cannot start.
    inventory = SimulatedDiscovery("dgx-a100", "n").discover()
    state_dir = tmp_path / "plugins" / DRIVER
    make_mig_backend("simulated", state_dir=state_dir, inventory=inventory, driver_root=Path("/"))
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / ".k8s.gpu.dra.dev-claim_x.json.tmp").write_text("{")
    before = _snapshot(tmp_path)
    assert any(name.endswith(".json") for name in before), before

    assert main(_args(tmp_path, "--kubeconfig=/nonexistent")) == 1
    assert "/nonexistent" in _one_line_error(capsys)
    assert _snapshot(tmp_path) == before


def test_missing_kubeconfig_creates_no_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_args(tmp_path, "--kubeconfig=/nonexistent")) == 1
    _one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_that_is_a_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "plugins" / DRIVER / "checkpoint.json").mkdir(parents=True)
    assert main(_args(tmp_path, "--kubeconfig=/nonexistent")) == 1
    err = _one_line_error(capsys)
    assert "checkpoint.json is a directory" in err


def test_relative_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_args(tmp_path), "--cdi-root=cdi"]) == 1
    assert "--cdi-root: cdi is not an absolute path" in _one_line_error(capsys)


def test_bad_shared_gpus_ends_the_start_after_the_bind_and_leaves_no_socket(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only the socket settings are checked before the bind; the rest fails after it, and the
    # sockets go again before the one-line error.
    assert main([*_args(tmp_path), "--shared-gpus=index:x"]) == 1
    err = capsys.readouterr().err
    assert "kubelet plugin started" in err and "Traceback" not in err
    assert err.splitlines()[-1] == (
        "dra-driver run: error: --shared-gpus: 'index:x': indices are whole numbers"
    )
    assert not list(tmp_path.glob("**/*.sock"))
    assert not list(tmp_path.glob("**/checkpoint.json"))


async def test_refused_credentials_end_the_start() -> None:
    async with serve() as server:
        server.json("GET", "/api/v1/nodes/n", 401, {"kind": "Status", "code": 401})
        client = plain_client(server)
        try:
            with pytest.raises(ApiUnreachableError, match="refused the credentials"):
                await reach_api_server(client, "n")
        finally:
            await client.close()


async def test_an_unreachable_server_is_retried_then_given_up() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = KubeClient(Connection(server=f"http://127.0.0.1:{port}"))
    try:
        started = time.monotonic()
        with pytest.raises(ApiUnreachableError, match="cannot reach the API server"):
            await reach_api_server(client, "n", wait=1.0)
        assert 0.9 < time.monotonic() - started < 5
    finally:
        await client.close()


async def test_sigterm_during_the_registration_wait_stops_at_once(tmp_path: Path) -> None:
    """The kubelet never registers the plugin; SIGTERM must not wait out the 10 s grace."""
    kubeconfig = tmp_path / "kubeconfig"
    async with serve() as server:
        _write_kubeconfig(kubeconfig, server.url)
        code, took = await _start_and_stop(tmp_path, kubeconfig, b"kubelet plugin serving")
    assert code == 0
    assert took < 2.0, f"took {took:.1f}s to stop"


async def test_sigterm_while_the_api_server_is_unreachable_stops_at_once(tmp_path: Path) -> None:
    """An agent retrying an unreachable API server stops at once, having changed nothing but
    the directories of the kubelet plugin's sockets (bound first, removed at the stop)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    _write_kubeconfig(kubeconfig, f"http://127.0.0.1:{port}")
    sockets: list[str] = []

    def bound() -> None:
        sockets.extend(p.name for p in tmp_path.rglob("*.sock"))

    code, took = await _start_and_stop(tmp_path, kubeconfig, b"API server not reachable yet", bound)
    assert code == 0 and took < 2.0, (code, took)
    # Bound before the API server answered, so the kubelet registers the plugin at once.
    assert sorted(sockets) == ["dra.sock", f"{DRIVER}-reg.sock"], sockets
    assert _files(tmp_path) == {"kubeconfig"}


def _files(base: Path) -> set[str]:
    """Every file under ``base`` (directories left out)."""
    return {str(p.relative_to(base)) for p in base.rglob("*") if not p.is_dir()}


def _write_kubeconfig(path: Path, server: str) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "users: [{name: u, user: {}}]\n"
    )


async def _start_and_stop(
    base: Path,
    kubeconfig: Path,
    until: bytes,
    then: Callable[[], None] = lambda: None,
    then_async: Callable[[], Awaitable[None]] | None = None,
) -> tuple[int, float]:
    """Start the agent, once it logs ``until`` call ``then`` (and await ``then_async``) and
    SIGTERM it; its exit code and how long it took to stop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dra_driver.cli",
        *_args(base, f"--kubeconfig={kubeconfig}", "--dynamic-mig=false"),
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        while until not in await asyncio.wait_for(proc.stderr.readline(), 30):
            pass
        then()
        if then_async is not None:
            await then_async()
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = await asyncio.wait_for(proc.wait(), 15)
        return code, time.monotonic() - sent
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_readings_that_differ_end_the_start_and_leave_no_socket(tmp_path: Path) -> None:
    # Guards against the quick reading of the socket settings drifting from the full one:
    # the agent must never serve on sockets its settings do not name.
    argv = _args(tmp_path)
    early = read_socket_settings(argv, {})
    assert early is not None
    with pytest.raises(StartError, match="differ from the full settings"):
        run_bound_first(
            dataclasses.replace(early, node_name="another-node"), lambda: parse(argv).settings
        )
    assert not list(tmp_path.rglob("*.sock"))


async def test_sigterm_before_the_state_is_loaded_answers_the_held_prepare(
    tmp_path: Path,
) -> None:
    """A prepare the kubelet sent while the agent waits for the API server is held; SIGTERM
    answers it with a clear error at once, instead of holding it through the plugin's stop
    grace (which also delays the exit) and then cancelling it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    _write_kubeconfig(kubeconfig, f"http://127.0.0.1:{port}")
    dra = tmp_path / "plugins" / DRIVER / "dra.sock"
    held: list[asyncio.Future[Any]] = []
    channels: list[grpc.aio.Channel] = []

    async def prepare() -> None:
        ch = grpc.aio.insecure_channel(f"unix:{dra}")
        channels.append(ch)
        request = dra_v1.NodePrepareResourcesRequest(
            claims=[dra_v1.Claim(namespace="default", name="claim-a", uid=CLAIM_UID)]
        )
        held.append(
            asyncio.ensure_future(dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(request))
        )
        await asyncio.sleep(0.3)
        assert not held[0].done()

    try:
        code, took = await _start_and_stop(
            tmp_path, kubeconfig, b"API server not reachable yet", then_async=prepare
        )
        response = await asyncio.wait_for(held[0], 5)
    finally:
        for ch in channels:
            await ch.close()
    assert code == 0 and took < 2.0, (code, took)
    assert "stopping" in response.claims[CLAIM_UID].error, response


async def test_sigterm_during_discovery_ends_the_start_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while the GPUs are discovered (NVML may take seconds): the agent stops there,
    without going on to recover the node's state (lock file, checkpoint, MIG devices) and
    to start its loops only to cancel them."""
    from dra_driver import agent as agent_module
    from dra_driver.bindsettings import SocketSettings
    from dra_driver.kubeletplugin.late import LateParts
    from dra_driver.plugin_setup import kubelet_plugin

    stop = asyncio.Event()
    discover = agent_module.discover_async

    async def discover_then_sigterm(discovery: Any) -> Any:
        inventory = await discover(discovery)
        stop.set()  # what the SIGTERM handler does
        return inventory

    monkeypatch.setattr(agent_module, "discover_async", discover_then_sigterm)
    settings = parse(_args(tmp_path, "--dynamic-mig=false", "--health-port=0")).settings
    async with serve() as server:
        server.json("GET", "/api/v1/nodes/n", 200, {"kind": "Node", "metadata": {"name": "n"}})
        parts = LateParts()
        async with kubelet_plugin(SocketSettings.of(settings), parts) as plugin:
            plugin.registered.set()  # the kubelet registered the plugin meanwhile
            await asyncio.wait_for(
                agent_module.serve(settings, Connection(server=server.url), plugin, parts, stop),
                10,
            )
        assert [r["path"] for r in server.seen] == ["/api/v1/nodes/n"]
    assert _files(tmp_path) == set()
