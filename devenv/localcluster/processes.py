"""Processes of the local cluster: start, watch, stop, and wait for them.

A component runs in its own process group and logs to one file; stopping signals the group,
so the children a component spawns go with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from devenv.localcluster.releases import release_cache, selected_release
from dra_driver.errors import DriverError

LOG_TAIL_LINES = 40


class ClusterError(DriverError, RuntimeError):
    """A control-plane component failed to start or a wait timed out."""


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the control-plane components."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    controller_manager: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(*pick_free_ports(5))


def pick_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return `count` distinct free TCP ports on `host`.

    All sockets are held open until every port is chosen, so the ports are distinct;
    another process may still grab one before it is used (callers retry on failure).
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def repo_root() -> Path:
    """The repository root: the directory above the ``devenv`` package."""
    return Path(__file__).resolve().parents[2]


def binary_path() -> Path:
    """Where the testenv binary is: ``$DRA_TESTENV_BIN``, else the selected release's
    ``.cache/testenv/<version>/bin/testenv`` (see :mod:`devenv.localcluster.releases`)."""
    env = os.environ.get("DRA_TESTENV_BIN")
    if env:
        return Path(env)
    root = repo_root()
    return release_cache(root, selected_release(root)) / "bin" / "testenv"


def checked_binary(path: Path | None = None) -> Path:
    """``path`` (default :func:`binary_path`) if it is an executable file, else a ClusterError."""
    path = path or binary_path()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ClusterError(
            f"testenv binary not found at {path}; run `make testenv` "
            "(or set DRA_TESTENV_BIN to a built binary)"
        )
    return path


def run_testenv(binary: Path, *args: str, timeout: float = 60) -> str:
    """Run one command of the testenv binary: its output, or a ClusterError with its stderr."""
    out = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise ClusterError(f"testenv {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(data[-lines:])


@dataclass
class ManagedProcess:
    """A subprocess in its own process group, logging to one file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    #: Set once stopped: its group's number may belong to another process group by then.
    stopped: bool = False

    def start(self) -> None:
        self.stopped = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Signal the whole process group, escalate to SIGKILL after `timeout`; once.

        A second call (a node's kubelet is both a node's and a cluster's process) does
        nothing: the group's leader is reaped, and its number can be another group's."""
        if self.pid is None or self.stopped:
            return
        _kill_group(self.pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                break
            time.sleep(0.05)
        else:
            _kill_group(self.pid, signal.SIGKILL)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)
        # Anything left in the group (children) goes too.
        _kill_group(self.pid, signal.SIGKILL)
        # Only now: a stop interrupted on its way (Ctrl-C) is done by the next one.
        self.stopped = True

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)


def process_identity(pid: int) -> str | None:
    """What tells process ``pid`` from a later one given the same PID (after it exited, or
    a reboot): the boot's id and the process's start time; None if there is no such process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return f"{boot}/{started}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie counts as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_for(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    process: ManagedProcess | None = None,
    interval: float = 0.1,
) -> None:
    """Poll `check` until it returns True; raise ClusterError with the log tail on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if process is not None and not process.alive():
            raise ClusterError(
                f"{process.name} exited (code {process.returncode()}) while waiting for {what}; "
                f"log {process.log_path}:\n{process.log_tail()}"
            )
        if time.monotonic() >= deadline:
            msg = f"timed out after {timeout:.0f}s waiting for {what}"
            if process is not None:
                msg += f"; log {process.log_path}:\n{process.log_tail()}"
            raise ClusterError(msg)
        time.sleep(interval)
