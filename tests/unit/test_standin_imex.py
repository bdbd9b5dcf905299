"""The stand-in IMEX daemon and its control tool (``nvidia-imex``, ``nvidia-imex-ctl`` in the
stand-in driver root, docs/standin-driver.md): daemons on 127.0.0.1, 127.0.0.2 and 127.0.0.3
(all loopback on Linux) form a domain, notice a peer that was killed, take it back when it
restarts, and re-read their nodes config on SIGUSR1.

The driver root is built once for the module; every daemon a test starts is killed in a
finalizer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.driverroot import IMEX_BINARIES, VERSION, compiler

REPO = Path(__file__).resolve().parents[2]
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
READY = "READY"
NOT_READY = "WAITING_FOR_PEERS"


@pytest.fixture(scope="module")
def bin_dir() -> Iterator[Path]:
    if compiler() is None:
        pytest.skip("no C compiler for the stand-in driver")
    base = Path(tempfile.mkdtemp(prefix="sdi", dir="/tmp"))
    made = subprocess.run(
        [sys.executable, "-m", "tests.driverroot", str(base / "root"), "--nvml",
         str(base / "state")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    yield base / "root/usr/bin"
    shutil.rmtree(base, ignore_errors=True)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports() -> tuple[int, int]:
    """A peer port and a command port that are free on every test address."""
    while True:
        ports = free_port(HOSTS[0]), free_port(HOSTS[0])
        if ports[0] == ports[1]:
            continue
        try:
            for host in HOSTS[1:]:
                for port in ports:
                    with socket.socket() as s:
                        s.bind((host, port))
        except OSError:
            continue
        return ports


@dataclass
class Domain:
    """Stand-in IMEX daemons sharing one port pair and one nodes config."""

    bin: Path
    dir: Path
    port: int
    cmd_port: int
    nodes: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def write_nodes(self, *hosts: str) -> None:
        self.nodes.write_text("# the IMEX domain\n\n" + "".join(f"{h}\n" for h in hosts))

    def config(self, host: str, **extra: str) -> Path:
        """The daemon config of ``host``, in the real file's format (keys this stand-in does
        not use included)."""
        keys = {
            "LOG_LEVEL": "4",
            "LOG_FILE_NAME": str(self.dir / f"imex-{host}.log"),
            "LOG_APPEND_TO_LOG": "1",
            "DAEMONIZE": "0",
            "BIND_INTERFACE_IP": host,
            "SERVER_PORT": str(self.port),
            "IMEX_NODE_CONFIG_FILE": str(self.nodes),
            "IMEX_WAIT_FOR_QUORUM": "RECOVERY",
            "IMEX_CMD_ENABLED": "1",
            "IMEX_CMD_BIND_INTERFACE_IP": host,
            "IMEX_CMD_PORT": str(self.cmd_port),
            "IMEX_NODE_DISCONNECTED_GRACE_TIME": "-1",
        } | extra
        path = self.dir / f"imex-{host}.cfg"
        path.write_text(
            "# NVIDIA IMEX configuration file.\n"
            + "".join(f"\n#   Description: {k}\n{k}={v}\n" for k, v in keys.items())
        )
        return path

    def start(self, host: str, **extra: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [str(self.bin / "nvidia-imex"), "-c", str(self.config(host, **extra))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs[host] = proc
        return proc

    def kill(self, host: str) -> None:
        proc = self.procs.pop(host)
        proc.kill()
        proc.wait(timeout=5)

    def ctl(self, host: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "nvidia-imex-ctl"), "-c", str(self.dir / f"imex-{host}.cfg"), *args],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip

    def state(self, host: str) -> str:
        ran = self.ctl(host, "-q")
        return ran.stdout if ran.returncode == 0 else f"exit {ran.returncode}: {ran.stderr}"

    def log(self, host: str) -> str:
        return (self.dir / f"imex-{host}.log").read_text()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def states(domain: Domain, hosts: tuple[str, ...], want: str) -> Callable[[], bool]:
    return lambda: all(domain.state(h) == want + "\n" for h in hosts)


@pytest.fixture
def domain(bin_dir: Path, tmp_path: Path) -> Iterator[Domain]:
    port, cmd_port = free_ports()
    made = Domain(bin=bin_dir, dir=tmp_path, port=port, cmd_port=cmd_port,
                  nodes=tmp_path / "nodes_config.cfg")  # fmt: skip
    made.write_nodes(*HOSTS)
    yield made
    for proc in made.procs.values():
        proc.kill()
        proc.wait(timeout=5)


def node_lines(table: str) -> dict[str, str]:
    """``-N``'s node lines as address -> state."""
    found = {}
    for line in table.splitlines():
        if line.startswith("Node #"):
            _, addr, state, _ = (part.strip() for part in line.split(" - "))
            found[addr] = state
    return found


def test_the_tools_are_in_the_driver_root(bin_dir: Path) -> None:
    for name in IMEX_BINARIES:
        tool = bin_dir / name
        assert tool.read_bytes()[:4] == b"\x7fELF", name
        assert os.access(tool, os.X_OK), name


def test_three_daemons_form_a_domain_and_track_a_killed_peer(domain: Domain) -> None:
    a, b, c = HOSTS
    for host in HOSTS:
        domain.start(host)
    wait_for(states(domain, HOSTS, READY), "three READY daemons")

    table = domain.ctl(a, "-N")
    assert table.returncode == 0, table.stderr
    assert node_lines(table.stdout) == {h: READY for h in HOSTS}
    assert f"Version: {VERSION}" in table.stdout
    assert "Domain State: UP" in table.stdout
    rows = [line.split() for line in table.stdout.splitlines() if line[:8].strip().isdigit()]
    assert rows == [["0", "C", "C", "C"], ["1", "C", "C", "C"], ["2", "C", "C", "C"]]

    # Killed: the other two are no longer ready, and -N shows which node is gone.
    domain.kill(c)
    wait_for(states(domain, (a, b), NOT_READY), "the survivors to notice", timeout=5)
    table = domain.ctl(b, "-N")
    assert node_lines(table.stdout) == {a: NOT_READY, b: NOT_READY, c: "UNAVAILABLE"}
    rows = [line.split() for line in table.stdout.splitlines() if line[:8].strip().isdigit()]
    assert rows == [["0", "C", "C", "R"], ["1", "C", "C", "R"], ["2", "I", "I", "I"]]
    assert "Domain State: DEGRADED" in table.stdout
    as_json = json.loads(domain.ctl(a, "-N", "-j").stdout)
    assert as_json["status"] == "DEGRADED"
    assert as_json["nodes"]["2"] == as_json["nodes"]["2"] | {"status": "UNAVAILABLE", "host": c}
    assert as_json["nodes"]["0"]["connections"]["2"]["status"] == "RECOVERING"
    for host in (a, b):
        log = domain.log(host)
        assert f"Connection established to node {c}" in log
        assert f"Connection to node {c} lost" in log
        assert "IMEX daemon is not ready: waiting for 1 peer(s)" in log

    # The dead node's command service is gone: -q fails as the real tool does.
    gone = domain.ctl(c, "-q")
    assert gone.returncode != 0 and gone.stdout == ""
    assert f"{c}:{domain.cmd_port}" in gone.stderr and "refused" in gone.stderr

    # Restarted: READY again everywhere.
    domain.start(c)
    wait_for(states(domain, HOSTS, READY), "READY after the restart")
    assert "Domain State: UP" in domain.ctl(c, "-N").stdout

    # Dead again, then dropped from the nodes config: SIGUSR1 re-reads it.
    domain.kill(c)
    wait_for(states(domain, (a, b), NOT_READY), "the survivors to notice again")
    domain.write_nodes(a, b)
    for host in (a, b):
        domain.procs[host].send_signal(signal.SIGUSR1)
    wait_for(states(domain, (a, b), READY), "READY after the reload")
    assert node_lines(domain.ctl(a, "-N").stdout) == {a: READY, b: READY}
    assert "SIGUSR1: re-reading" in domain.log(a)

    # SIGTERM: a clean exit.
    proc = domain.procs.pop(a)
    proc.terminate()
    assert proc.wait(timeout=5) == 0
    assert domain.log(a).rstrip().endswith("Exit")


def test_a_daemon_alone_is_ready_and_finds_itself_without_a_bind_address(domain: Domain) -> None:
    domain.write_nodes(HOSTS[0])
    # No BIND_INTERFACE_IP: the daemon is the nodes config's address that is this machine's.
    domain.start(HOSTS[0], BIND_INTERFACE_IP="", IMEX_CMD_BIND_INTERFACE_IP="")
    wait_for(states(domain, HOSTS[:1], READY), "a lone READY daemon")
    assert "127.0.0.1 (this node)" in domain.log(HOSTS[0])
    by_port = subprocess.run(
        [str(domain.bin / "nvidia-imex-ctl"), "-i", "127.0.0.1", str(domain.cmd_port), "-q"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert (by_port.returncode, by_port.stdout) == (0, "READY\n")


def test_the_command_service_on_a_unix_socket(domain: Domain) -> None:
    sock = domain.dir / "imex.sock"
    domain.write_nodes(HOSTS[0])
    domain.start(HOSTS[0], IMEX_CMD_UNIX_DOMAIN_PATH=str(sock))
    wait_for(sock.exists, "the command socket")
    ran = subprocess.run(
        [str(domain.bin / "nvidia-imex-ctl"), "-q", f"--u={sock}"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert (ran.returncode, ran.stdout) == (0, "READY\n"), ran.stderr


def test_a_bad_config_line_is_an_error(domain: Domain) -> None:
    config = domain.config(HOSTS[0])
    config.write_text(config.read_text() + "THIS LINE IS NOT A SETTING\n")
    ran = subprocess.run(
        [str(domain.bin / "nvidia-imex"), "-c", str(config)],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert ran.returncode == 1
    lines = config.read_text().splitlines()
    assert ran.stderr == (
        f"nvidia-imex: {config}:{len(lines)}: expected KEY=VALUE, "
        "got 'THIS LINE IS NOT A SETTING'\n"
    )
    config.write_text(config.read_text().replace("THIS LINE IS NOT A SETTING\n", "SERVER_PORT=x\n"))
    ran = subprocess.run(
        [str(domain.bin / "nvidia-imex"), "-c", str(config)],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert ran.returncode == 1
    assert "invalid value for SERVER_PORT: 'x'" in ran.stderr


def test_a_bad_nodes_config_is_an_error(domain: Domain) -> None:
    domain.nodes.write_text("127.0.0.1\nnot an address\n")
    ran = subprocess.run(
        [str(domain.bin / "nvidia-imex"), "-c", str(domain.config(HOSTS[0]))],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert ran.returncode == 1
    assert f"{domain.nodes}:2: not a node address: 'not an address'" in ran.stderr
