"""``dra-driver imex-daemon``: the IMEX config files and peer set by tables, the shell's
supervision with scripts standing in for the daemon, and two shells running the stand-in
``nvidia-imex`` on 127.0.0.1 and 127.0.0.2 that become READY through the probe's check, notice
each other's loss and follow a peer-set change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_driver.computedomain.api import NVIDIA, OWN
from dra_driver.computedomain.daemon import (
    DomainPods,
    ImexDaemon,
    daemon_options,
    describe_exit,
    failures_after,
    imex_log_level,
    reload_delay,
    restart_delay,
)
from dra_driver.computedomain.imexconfig import (
    CMD_PORT,
    CTL,
    DAEMON,
    DEFAULT_DIR,
    ImexConfig,
    ImexFiles,
    ToolNotFound,
    check,
    config_text,
    find_tool,
    host_configs,
    is_ready,
    nodes_text,
    peer_set,
    pod_peer,
    run_check,
)
from dra_driver.settings import Settings, SettingsError
from tests.driverroot import compiler

REPO = Path(__file__).resolve().parents[3]
UID = "6d1c7e3a-0000-4000-8000-000000000001"
LABEL = OWN.domain_label
A, B = "127.0.0.1", "127.0.0.2"


# -- the files ---------------------------------------------------------------------------------


def _keys(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return {k: v for k, v in pairs}


def test_config_text_has_the_real_keys() -> None:
    files = ImexFiles(Path("/run/imex"))
    text = config_text(ImexConfig(pod_ip="10.0.3.7", files=files), domain="team-a/cd")
    assert text.startswith("# nvidia-imex config written by dra-driver imex-daemon")
    assert "team-a/cd" in text.splitlines()[0]
    assert _keys(text) == {
        "LOG_LEVEL": "4",
        "LOG_FILE_NAME": "/run/imex/nvidia-imex.log",
        "LOG_APPEND_TO_LOG": "1",
        "DAEMONIZE": "0",
        "BIND_INTERFACE_IP": "10.0.3.7",
        "SERVER_PORT": "50000",
        "IMEX_NODE_CONFIG_FILE": "/run/imex/nodes_config.cfg",
        "IMEX_CMD_ENABLED": "1",
        "IMEX_CMD_BIND_INTERFACE_IP": "127.0.0.1",
        "IMEX_CMD_PORT": "50005",
    }


def test_config_text_ports_and_a_value_spanning_lines() -> None:
    files = ImexFiles(Path("/tmp/x"))
    text = config_text(ImexConfig(pod_ip=A, files=files, port=41000, cmd_port=41005))
    assert (_keys(text)["SERVER_PORT"], _keys(text)["IMEX_CMD_PORT"]) == ("41000", "41005")
    with pytest.raises(ValueError, match="BIND_INTERFACE_IP"):
        config_text(ImexConfig(pod_ip="10.0.0.1\nDAEMONIZE=1", files=files))


@pytest.mark.parametrize(
    ("peers", "own", "expected"),
    [
        ((), "10.0.0.5", "10.0.0.5\n"),
        (("10.0.0.5",), "10.0.0.5", "10.0.0.5\n"),
        # numerically, not as text: .9 before .10
        (("10.0.0.10", "10.0.0.9"), "10.0.1.1", "10.0.0.9\n10.0.0.10\n10.0.1.1\n"),
        (("192.168.1.2", "10.244.3.4"), "10.244.0.7", "10.244.0.7\n10.244.3.4\n192.168.1.2\n"),
        # IPv6 after IPv4, names after addresses, empty entries dropped
        (("fd00::2", "node-b", "", "10.0.0.1"), "fd00::1", "10.0.0.1\nfd00::1\nfd00::2\nnode-b\n"),
    ],
)
def test_nodes_text(peers: tuple[str, ...], own: str, expected: str) -> None:
    assert nodes_text(peers, own) == expected
    # Every daemon writes the same file from the same pods, whichever it is.
    assert nodes_text(reversed([*peers, own]), peers[0] if peers else own) == expected


def _pod(
    name: str,
    ip: str = "",
    *,
    uid: str = UID,
    label: str = LABEL,
    phase: str = "Running",
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {label: uid}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


@pytest.mark.parametrize(
    ("pod", "peer"),
    [
        (_pod("a", "10.0.0.1"), "10.0.0.1"),
        (_pod("a", "10.0.0.1", phase="Pending"), "10.0.0.1"),  # IP given, containers starting
        (_pod("a", phase="Pending"), ""),  # not yet on the network
        (_pod("a", "10.0.0.1", deleting=True), ""),
        (_pod("a", "10.0.0.1", phase="Failed"), ""),
        (_pod("a", "10.0.0.1", phase="Succeeded"), ""),
        (_pod("a", "10.0.0.1", uid="another-domain"), ""),
        (_pod("a", "10.0.0.1", label=NVIDIA.domain_label), ""),  # the other mode's label
        ({"metadata": {"name": "bare"}}, ""),
    ],
)
def test_pod_peer(pod: dict[str, Any], peer: str) -> None:
    assert pod_peer(pod, UID, LABEL) == peer


def test_peer_set() -> None:
    pods = [
        _pod("a", "10.0.0.1"),
        _pod("b"),
        _pod("c", "10.0.0.3"),
        _pod("d", "10.0.0.4", deleting=True),
    ]
    assert peer_set(pods, UID, LABEL) == {"10.0.0.1", "10.0.0.3"}
    assert peer_set([], UID, LABEL) == frozenset()


def _tool(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_find_tool(tmp_path: Path) -> None:
    with pytest.raises(ToolNotFound) as missing:
        find_tool(tmp_path, DAEMON)
    message = str(missing.value)
    assert "\n" not in message
    assert f"{tmp_path}/usr/bin/nvidia-imex" in message and f"{tmp_path}/bin/nvidia-imex" in message
    in_bin = _tool(tmp_path / "bin" / DAEMON)
    assert find_tool(tmp_path, DAEMON) == in_bin
    in_usr = _tool(tmp_path / "usr/bin" / DAEMON)
    assert find_tool(tmp_path, DAEMON) == in_usr  # usr/bin first, where the package puts it


def test_host_configs(tmp_path: Path) -> None:
    assert host_configs(tmp_path) == []
    nodes = tmp_path / "etc/nvidia-imex/nodes_config.cfg"
    nodes.parent.mkdir(parents=True)
    nodes.write_text("10.0.0.1\n")
    assert host_configs(tmp_path) == [nodes]
    (tmp_path / "etc/nvidia-imex/config.cfg").write_text("SERVER_PORT=50000\n")
    assert [p.name for p in host_configs(tmp_path)] == ["config.cfg", "nodes_config.cfg"]


@pytest.mark.parametrize(
    ("returncode", "stdout", "ready"),
    [
        (0, "READY\n", True),
        (0, "READY", True),
        (0, "WAITING_FOR_PEERS\n", False),
        (0, "NOT_READY\n", False),
        (0, "READY\nWAITING_FOR_PEERS\n", False),
        (0, "", False),
        (1, "READY\n", False),
    ],
)
def test_is_ready(returncode: int, stdout: str, ready: bool) -> None:
    assert is_ready(returncode, stdout) is ready


def test_check_before_the_daemon_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = ImexFiles(tmp_path / "imex")
    ready, said = check(tmp_path, files)
    assert not ready and "has not been started" in said
    files.directory.mkdir()
    files.config.write_text("SERVER_PORT=50000\n")
    ready, said = check(tmp_path, files)
    assert not ready and f"{tmp_path}/usr/bin/{CTL}" in said
    assert run_check(tmp_path, str(files.directory)) == 1
    assert capsys.readouterr().err.startswith("IMEX daemon not ready: nvidia-imex-ctl not found")


def test_check_with_a_tool_saying_something_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = ImexFiles(tmp_path)
    files.config.write_text("SERVER_PORT=50000\n")
    ctl = _tool(tmp_path / "usr/bin" / CTL)
    ctl.write_text('#!/bin/sh\n[ "$1 $3" = "-c -q" ] || exit 9\necho "${ANSWER}"\n')
    monkeypatch.setenv("ANSWER", "WAITING_FOR_PEERS")
    assert check(tmp_path, files) == (False, "WAITING_FOR_PEERS")
    monkeypatch.setenv("ANSWER", "READY")
    assert check(tmp_path, files) == (True, "READY")


# -- decisions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failures", "delay"),
    [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (6, 30.0), (99, 30.0)],
)
def test_restart_delay(failures: int, delay: float) -> None:
    assert restart_delay(failures) == delay


@pytest.mark.parametrize(
    ("previous", "ran_for", "after"), [(0, 0.2, 1), (3, 5.0, 4), (7, 60.0, 1), (7, 3600.0, 1)]
)
def test_failures_after(previous: int, ran_for: float, after: int) -> None:
    assert failures_after(previous, ran_for) == after


@pytest.mark.parametrize(
    ("now", "last", "started", "delay"),
    [
        (100.0, float("-inf"), 0.0, 0.0),  # long running, never reloaded
        (100.0, 98.0, 0.0, 3.5),  # 5.5 s after the last reload
        (100.0, float("-inf"), 99.0, 4.5),  # just started: handlers may not be in place
        (100.0, 90.0, 94.0, 0.0),
    ],
)
def test_reload_delay(now: float, last: float, started: float, delay: float) -> None:
    assert reload_delay(now, last, started, 5.5) == pytest.approx(delay)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (0, "exit status 0"),
        (1, "exit status 1"),
        (-9, "killed by SIGKILL"),
        (-15, "killed by SIGTERM"),
        (-200, "killed by signal 200"),
    ],
)
def test_describe_exit(code: int, text: str) -> None:
    assert describe_exit(code) == text


@pytest.mark.parametrize(
    ("line", "level"),
    [
        (
            "[Nov 27 2026 02:55:13] [INFO] [tid 5098] Connection established to node 10.0.0.2",
            "info",
        ),
        ("[Nov 27 2026 02:55:13] [ERROR] [tid 5098] bad nodes config", "error"),
        ("[Nov 27 2026 02:55:13] [WARNING] [tid 5098] peer slow", "warning"),
        ("nvidia-imex: config.cfg:3: expected KEY=VALUE, got 'x'", "info"),
    ],
)
def test_imex_log_level(line: str, level: str) -> None:
    assert imex_log_level(line) == level


def _ns(**given: Any) -> argparse.Namespace:
    fields = ("domain_uid", "domain", "pod_ip", "pod_namespace", "imex_port", "imex_dir")
    return argparse.Namespace(**{f: given.get(f) for f in fields})


def test_daemon_options_from_the_daemon_sets_environment() -> None:
    env = {"POD_IP": "10.244.1.9", "POD_NAMESPACE": "dra-driver", "NODE_NAME": "gb-1"}
    options = daemon_options(Settings(), _ns(domain_uid=UID, domain="team/cd"), env)
    assert (options.pod_ip, options.pod_namespace, options.node) == (
        "10.244.1.9",
        "dra-driver",
        "gb-1",
    )
    assert (options.port, options.directory, options.domain) == (50000, DEFAULT_DIR, "team/cd")
    # Flags win over the downward API's variables.
    options = daemon_options(
        Settings(node_name="n2"),
        _ns(
            domain_uid=UID,
            pod_ip="10.0.0.2",
            pod_namespace="ns",
            imex_port=41000,
            imex_dir="/tmp/i",
        ),
        env,
    )
    assert (options.pod_ip, options.pod_namespace, options.node) == ("10.0.0.2", "ns", "n2")
    assert (options.port, options.directory) == (41000, Path("/tmp/i"))


@pytest.mark.parametrize(
    ("given", "env", "error"),
    [
        ({}, {"POD_IP": "10.0.0.1", "POD_NAMESPACE": "ns"}, "--domain-uid"),
        ({"domain_uid": UID}, {"POD_NAMESPACE": "ns"}, "--pod-ip (POD_IP)"),
        ({"domain_uid": UID}, {"POD_IP": "10.0.0.1"}, "--pod-namespace"),
        ({"domain_uid": UID, "pod_ip": "node-a"}, {"POD_NAMESPACE": "ns"}, "not an IP address"),
        (
            {"domain_uid": UID, "imex_port": 70000},
            {"POD_IP": "10.0.0.1", "POD_NAMESPACE": "ns"},
            "not a port",
        ),
    ],
)
def test_daemon_options_refused(given: dict[str, Any], env: dict[str, str], error: str) -> None:
    with pytest.raises(SettingsError, match=error.replace("(", r"\(").replace(")", r"\)")):
        daemon_options(Settings(), _ns(**given), env)


# -- following the pods --------------------------------------------------------------------------


@dataclass
class FakePodApi:
    """A list and one watch of pods; records the requests."""

    items: list[dict[str, Any]]
    events: list[dict[str, Any]]
    requests: list[tuple[str, str, str]] = field(default_factory=list)

    async def list_objects(
        self, path: str, resource: str, field_selector: str = "", *, label_selector: str = ""
    ) -> dict[str, Any]:
        self.requests.append(("list", path, label_selector))
        return {"items": self.items, "metadata": {"resourceVersion": "10"}}

    async def watch_objects(
        self,
        path: str,
        resource: str,
        field_selector: str,
        resource_version: str,
        timeout_seconds: int,
        *,
        label_selector: str = "",
    ) -> AsyncIterator[dict[str, Any]]:
        self.requests.append(("watch", path, label_selector))
        for event in self.events:
            yield event
        self.events = []
        await asyncio.Event().wait()


async def test_domain_pods_reports_each_new_peer_set() -> None:
    api = FakePodApi(
        items=[_pod("imex-a", "10.0.0.1"), _pod("imex-b")],
        events=[
            {"type": "MODIFIED", "object": _pod("imex-b", "10.0.0.2", phase="Pending")},
            {"type": "MODIFIED", "object": _pod("imex-b", "10.0.0.2")},  # same peers: quiet
            {"type": "ADDED", "object": _pod("imex-c", "10.0.0.3")},
            {"type": "MODIFIED", "object": _pod("imex-a", "10.0.0.1", deleting=True)},
            {"type": "DELETED", "object": _pod("imex-c", "10.0.0.3")},
        ],
    )
    seen: list[frozenset[str]] = []
    pods = DomainPods(
        api, namespace="dra-driver", uid=UID, names=OWN, on_peers=seen.append, logger=Recorder()
    )
    task = asyncio.create_task(pods.run())
    try:
        await _until(lambda: len(seen) == 5, "five peer sets")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert seen == [
        {"10.0.0.1"},
        {"10.0.0.1", "10.0.0.2"},
        {"10.0.0.1", "10.0.0.2", "10.0.0.3"},
        {"10.0.0.2", "10.0.0.3"},
        {"10.0.0.2"},
    ]
    selector = f"{LABEL}={UID}"
    assert api.requests[:2] == [
        ("list", "/api/v1/namespaces/dra-driver/pods", selector),
        ("watch", "/api/v1/namespaces/dra-driver/pods", selector),
    ]


# -- the shell, with scripts for the daemon --------------------------------------------------------


class Recorder:
    """A logger that keeps its events: (level, event, fields)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def _log(self, level: str) -> Callable[..., None]:
        return lambda event, **kw: self.events.append((level, event, kw))

    def __getattr__(self, level: str) -> Callable[..., None]:
        if level not in ("debug", "info", "warning", "error"):
            raise AttributeError(level)
        return self._log(level)

    def find(self, event: str) -> list[dict[str, Any]]:
        return [kw for _, e, kw in self.events if e == event]

    def said(self, text: str) -> bool:
        return any(text in e for _, e, kw in self.events if kw.get("source") == DAEMON)


async def _until(
    check: Callable[[], bool | Awaitable[bool]], what: str, within: float = 10.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        result = check()
        if result if isinstance(result, bool) else await result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(0.05)


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


async def test_a_daemon_that_exits_is_restarted_with_backoff(tmp_path: Path) -> None:
    binary = _script(tmp_path / "imex", 'echo "cannot bind: address in use"\nexit 3\n')
    log = Recorder()
    core = ImexDaemon(
        binary,
        ImexConfig(pod_ip=A, files=ImexFiles(tmp_path / "run")),
        logger=log,
        restart_first=0.05,
        restart_cap=0.1,
    )
    core.set_peers([B])
    task = asyncio.create_task(core.run())
    try:
        await _until(lambda: core.starts >= 4, "four starts")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    exits = log.find("nvidia-imex exited, restarting")
    assert [e["exit_code"] for e in exits[:2]] == [3, 3]
    assert exits[0]["exit"] == "exit status 3"
    assert [e["restart_in"] for e in exits[:3]] == [0.05, 0.1, 0.1]
    assert log.said("cannot bind: address in use")
    assert (tmp_path / "run/nodes_config.cfg").read_text() == f"{A}\n{B}\n"


async def test_peers_are_debounced_into_one_reload_and_the_daemon_stops_cleanly(
    tmp_path: Path,
) -> None:
    # The script: its own log lines in the log file, SIGUSR1 and SIGTERM acknowledged there.
    run = tmp_path / "run"
    binary = _script(
        tmp_path / "imex",
        f"nodes={run}/nodes_config.cfg\nlog={run}/nvidia-imex.log\n"
        """say() { echo "[INFO] $*" >> "$log"; }
say "started with $(tr '\\n' ' ' < "$nodes")"
trap 'say "reload: $(tr "\\n" " " < "$nodes")"' USR1
trap 'say bye; exit 0' TERM
while :; do sleep 0.05; done
""",
    )
    log = Recorder()
    core = ImexDaemon(
        binary,
        ImexConfig(pod_ip=B, files=ImexFiles(run)),
        logger=log,
        debounce=0.2,
        reload_gap=0.3,
    )
    task = asyncio.create_task(core.run())
    await asyncio.sleep(0.3)
    assert core.starts == 0  # no peers known yet: not started alone
    core.set_peers([A, B])
    try:
        await _until(lambda: log.said(f"started with {A} {B}"), "the start")
        # A burst: three sets in a row, the last one counts.
        core.set_peers([A, B, "127.0.0.3"])
        core.set_peers([A])
        core.set_peers([A, "127.0.0.4"])
        await _until(lambda: log.said("reload:"), "a reload")
        await asyncio.sleep(0.8)
        assert core.reloads == 1 and core.starts == 1
        assert (run / "nodes_config.cfg").read_text() == f"{A}\n{B}\n127.0.0.4\n"
        assert log.said(f"reload: {A} {B} 127.0.0.4")
        # The same set again: nothing to do.
        core.set_peers([B, "127.0.0.4", A])
        await asyncio.sleep(0.5)
        assert core.reloads == 1
        pid = core.pid
        assert pid is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert log.find("nvidia-imex stopped") == [{"exit": "exit status 0", "exit_code": 0}]
    assert log.said("bye")  # its last words, forwarded before the shell let go
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# -- the stand-in nvidia-imex --------------------------------------------------------------------


@pytest.fixture(scope="module")
def driver_root() -> Iterator[Path]:
    if compiler() is None:
        pytest.skip("no C compiler for the stand-in driver")
    base = Path(tempfile.mkdtemp(prefix="imexd", dir="/tmp"))
    made = subprocess.run(
        [sys.executable, "-m", "tests.driverroot", str(base / "root"), "--nvml", str(base / "state")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    yield base / "root"
    shutil.rmtree(base, ignore_errors=True)


def _free(host: str, port: int = 0) -> int:
    with socket.socket() as s:
        # As the daemon binds: a port whose last connections linger in TIME_WAIT is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return int(s.getsockname()[1])


def _ports() -> tuple[int, int, int]:
    """A peer port free on both addresses, and two command ports on 127.0.0.1."""
    while True:
        port = _free(A)
        try:
            _free(B, port)
        except OSError:
            continue
        cmd_a, cmd_b = _free(A), _free(A)
        if len({port, cmd_a, cmd_b}) == 3:
            return port, cmd_a, cmd_b


@dataclass
class Shell:
    """One pod's shell, run as a task."""

    core: ImexDaemon
    root: Path
    log: Recorder
    task: asyncio.Task[None] | None = None

    def start(self, peers: list[str]) -> None:
        self.core.set_peers(peers)
        self.task = asyncio.create_task(self.core.run())

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def ready(self) -> bool:
        return (await asyncio.to_thread(check, self.root, self.core.files))[0]

    async def not_ready(self) -> bool:
        return not await self.ready()


def _shell(driver_root: Path, base: Path, host: str, port: int, cmd_port: int) -> Shell:
    log = Recorder()
    config = ImexConfig(pod_ip=host, files=ImexFiles(base / host), port=port, cmd_port=cmd_port)
    core = ImexDaemon(
        find_tool(driver_root, DAEMON),
        config,
        domain="team/cd",
        logger=log,
        debounce=0.2,
        reload_gap=1.0,
        restart_first=1.5,
    )
    return Shell(core, driver_root, log)


async def test_two_daemons_form_a_domain(driver_root: Path, tmp_path: Path) -> None:
    port, cmd_a, cmd_b = _ports()
    a = _shell(driver_root, tmp_path, A, port, cmd_a)
    b = _shell(driver_root, tmp_path, B, port, cmd_b)
    shells = [a, b]
    try:
        for shell in shells:
            shell.start([A, B])
        await _until(a.ready, "a READY")
        await _until(b.ready, "b READY")
        for shell in shells:
            assert shell.core.files.nodes.read_text() == f"{A}\n{B}\n"
        # The probe itself, as the kubelet runs it.
        probe = [
            sys.executable, "-m", "dra_driver.cli", "imex-daemon", "--check",
            "--driver-root", str(driver_root), "--imex-dir", str(a.core.files.directory),
        ]  # fmt: skip
        ran = await asyncio.to_thread(
            subprocess.run, probe, cwd=REPO, capture_output=True, text=True, timeout=30
        )
        assert (ran.returncode, ran.stderr) == (0, "")
        await _until(lambda: a.log.said(f"Connection established to node {B}"), "the log")

        # b's daemon dies: a notices, b's shell starts it again, both ready again.
        pid = b.core.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await _until(a.not_ready, "a to notice", within=3)
        ran = await asyncio.to_thread(
            subprocess.run, probe, cwd=REPO, capture_output=True, text=True, timeout=30
        )
        assert ran.returncode == 1
        assert ran.stderr == "IMEX daemon not ready: WAITING_FOR_PEERS\n"
        await _until(b.ready, "b restarted")
        await _until(a.ready, "a READY again")
        assert b.core.starts == 2
        [exited] = b.log.find("nvidia-imex exited, restarting")
        assert exited["exit"] == "killed by SIGKILL" and exited["restart_in"] == 1.5

        # b's pod goes away altogether: its daemon is stopped, a is no longer ready.
        await b.stop()
        assert b.core.pid is None
        assert b.log.find("nvidia-imex stopped")[0]["exit_code"] == 0
        await _until(a.not_ready, "a to notice b's stop", within=3)

        # b comes back (a new pod on the same address).
        b = _shell(driver_root, tmp_path, B, port, cmd_b)
        shells.append(b)
        b.start([A, B])
        await _until(b.ready, "the new b READY")
        await _until(a.ready, "a READY with the new b")

        # b leaves the domain: a is told, rewrites its nodes config and reloads, not restarts.
        await b.stop()
        await _until(a.not_ready, "a to notice b leave", within=3)
        a.core.set_peers([A])
        await _until(a.ready, "a READY alone")
        assert a.core.files.nodes.read_text() == f"{A}\n"
        assert (a.core.reloads, a.core.starts) == (1, 1)
        await _until(lambda: a.log.said("SIGUSR1: re-reading"), "the reload in the log")
    finally:
        for shell in shells:
            if shell.task is not None:
                await shell.stop()


def test_the_probe_loads_neither_the_api_client_nor_the_shell(tmp_path: Path) -> None:
    # It runs every 2 s in every daemon pod.
    code = (
        "import sys\n"
        "from dra_driver.cli import main\n"
        f"rc = main(['imex-daemon', '--check', '--driver-root', '{tmp_path}', "
        f"'--imex-dir', '{tmp_path}'])\n"
        "heavy = ('aiohttp', 'dra_driver.kube', 'dra_driver.computedomain.daemon',\n"
        "         'dra_driver.resourceslice.reflector', 'dra_driver.computedomain.api')\n"
        "print(rc, [m for m in heavy if m in sys.modules])\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.stdout == "1 []\n", ran.stderr
    assert ran.stderr == (
        f"IMEX daemon not ready: {tmp_path}/config.cfg does not exist: the IMEX daemon has not "
        "been started\n"
    )


async def test_the_process_follows_its_pods_and_stops_on_sigterm(
    driver_root: Path, tmp_path: Path
) -> None:
    from aiohttp import web

    from tests.unit.kubeserver import serve

    try:
        _free(A, CMD_PORT)  # the process binds the real command port on the pod's loopback
    except OSError:
        pytest.skip(f"port {CMD_PORT} is in use on {A}")
    # A driver root whose host also has an IMEX service configured.
    root = tmp_path / "root"
    (root / "usr").mkdir(parents=True)
    (root / "usr/bin").symlink_to(driver_root / "usr/bin")
    host_config = root / "etc/nvidia-imex/config.cfg"
    host_config.parent.mkdir(parents=True)
    host_config.write_text("SERVER_PORT=50000\n")
    pods_path = "/api/v1/namespaces/dra-driver/pods"
    watched: list[str] = []

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            items = [_pod("imex-a", A), _pod("imex-b", phase="Pending")]
            return web.json_response({"items": items, "metadata": {"resourceVersion": "5"}})
        watched.append(request.query.get("labelSelector", ""))
        response = web.StreamResponse()
        await response.prepare(request)
        # Open until the client goes (aiohttp does not cancel a handler when it does).
        while True:
            if request.transport is None or request.transport.is_closing():
                return response
            await asyncio.sleep(0.05)

    async with serve() as server:
        server.routes[("GET", pods_path)] = pods
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
            f"clusters: [{{name: c, cluster: {{server: '{server.url}'}}}}]\n"
            "users: [{name: u, user: {}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        )
        files = ImexFiles(tmp_path / "run")
        env = {
            **os.environ,
            "DRA_DOMAIN_UID": UID,
            "DRA_DOMAIN": "team/cd",
            "DRA_LOG_FORMAT": "json",
            "DRA_COMPAT": "",
            "DRA_DRIVER_ROOT": str(root),
            "DRA_IMEX_PORT": str(_free(A)),
            "DRA_IMEX_DIR": str(files.directory),
            "DRA_KUBECONFIG": str(kubeconfig),
            "NODE_NAME": "node-a",
            "POD_IP": A,
            "POD_NAMESPACE": "dra-driver",
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dra_driver.cli", "imex-daemon",
            cwd=REPO, env=env, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            await _until(
                lambda: asyncio.to_thread(lambda: check(root, files)[0]), "the daemon READY"
            )
            assert files.nodes.read_text() == f"{A}\n"
            # The watch follows the list the daemon got ready from: on a busy machine it
            # may come a moment after READY.
            await _until(lambda: bool(watched), "the pods' watch")
            assert watched == [f"{LABEL}={UID}"]
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 15) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.stderr is not None
        lines = [json.loads(line) for line in (await proc.stderr.read()).splitlines()]
    assert lines and all((e["domain"], e["node"]) == ("team/cd", "node-a") for e in lines)
    events = {e["event"]: e for e in lines}
    warned = [e for e in lines if e["event"].startswith("the host has an IMEX config")]
    assert [(e["level"], e["config"]) for e in warned] == [("warning", str(host_config))]
    assert events["domain daemons"]["peers"] == [A]
    assert events["nvidia-imex stopped"]["exit_code"] == 0
    assert any(e.get("source") == DAEMON for e in lines)


async def test_a_line_too_long_to_forward_does_not_block_the_daemon(tmp_path: Path) -> None:
    """A line past the stream's limit ends the reading of that line only: a daemon whose
    output is no longer read blocks on its next writes once the pipe is full, and with it
    the IMEX domain on the node."""
    marker = tmp_path / "went-on"
    binary = _script(
        tmp_path / "imex",
        "head -c 70000 /dev/zero | tr '\\0' x; echo\n"
        'i=0; while [ $i -lt 10000 ]; do echo "[INFO] line $i of the daemon\'s chatter"; '
        "i=$((i+1)); done\n"
        f"touch {marker}\nwhile :; do sleep 0.05; done\n",
    )
    log = Recorder()
    config = ImexConfig(pod_ip=A, files=ImexFiles(tmp_path / "run"))
    core = ImexDaemon(binary, config, logger=log, stop_timeout=0.5)
    core.set_peers([B])
    task = asyncio.create_task(core.run())
    try:
        await _until(marker.exists, "the daemon past its output", within=10)
        # The daemon wrote on; its lines are read as they come, the last one soon after.
        last = "line 9999 of the daemon's chatter"
        await _until(lambda: log.said(last), "its last line read", within=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
