"""MPS control daemons on the host, with the stand-in nvidia-cuda-mps-control (a real ELF
program that daemonizes, listens on its pipe and starts a server child).

Needs root: a daemon moves into a cgroup of its own and gets a tmpfs as its shm, as on a node.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.gpu.sharing import host as hostmod
from dra_driver.gpu.sharing import procs
from dra_driver.gpu.sharing.backend import MpsLimits
from dra_driver.gpu.sharing.host import HostSharing
from dra_driver.gpu.sharing.mps import daemon_for
from tests import driverroot

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (cgroups, tmpfs)")


@pytest.fixture(scope="module")
def driver_root() -> Iterator[Path]:
    if driverroot.compiler() is None:
        pytest.skip("no C compiler for the stand-in tools")
    base = Path(tempfile.mkdtemp(prefix="mpsroot"))
    driverroot.make_driver_root(base / "root", nvml_state=base / "state", sockets=False)
    yield base / "root"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def sharing(driver_root: Path) -> Iterator[HostSharing]:
    # Short: the pipe directory holds a unix socket, whose path must stay under 108 bytes.
    base = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    backend = HostSharing(
        base / "gpu.dra.dev" / "mps", driver_root, cgroup_parent=f"dra-test-mps-{os.getpid()}"
    )
    yield backend
    for daemon_id in backend.list_mps():
        backend.stop_mps(daemon_id, backend.mps_root / daemon_id / "pipe")
    for h in Path("/sys/fs/cgroup").iterdir():
        d = h / backend.cgroup_parent
        if d.is_dir():
            for sub in d.iterdir():
                if sub.is_dir():
                    sub.rmdir()
            d.rmdir()
    shutil.rmtree(base, ignore_errors=True)


def started(sharing: HostSharing, daemon_id: str = "claim-1") -> procs.ProcessIdentity:
    daemon = daemon_for(sharing.mps_root, daemon_id, ["GPU-1"], MpsLimits(50))
    sharing.start_mps(daemon)
    (identity,) = daemons(daemon.pipe_dir)
    return identity


def daemons(pipe_dir: Path) -> list[procs.ProcessIdentity]:
    out = []
    for pid in procs.pids():
        path = procs.exe(pid) or ""
        if Path(path).name != hostmod.MPS_CONTROL or "-d" not in procs.cmdline(pid):
            continue
        if procs.environ(pid).get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe_dir):
            identity = procs.identify(pid)
            if identity:
                out.append(identity)
    return out


def test_daemon_is_started_with_its_limits_and_stopped(sharing: HostSharing) -> None:
    identity = started(sharing)
    log = (sharing.mps_root / "claim-1" / "log" / "control.log").read_text()
    assert "set_default_active_thread_percentage 50" in log
    assert sharing.list_mps() == ("claim-1",)
    sharing.stop_mps("claim-1", sharing.mps_root / "claim-1" / "pipe")
    assert not procs.is_alive(identity)
    assert sharing.list_mps() == ()


def test_daemon_leaves_the_agents_cgroup(sharing: HostSharing) -> None:
    """Stopping the agent's container kills every process of its cgroup: the daemon and its
    server live in a cgroup of their own."""
    identity = started(sharing)
    group = f"/{sharing.cgroup_parent}/gpu.dra.dev-claim-1"
    assert procs.cgroups(identity.pid) and all(
        c.endswith(group) for c in procs.cgroups(identity.pid)
    ), procs.cgroups(identity.pid)
    mine = set(procs.cgroups(os.getpid()))
    assert not mine & {c for c in procs.cgroups(identity.pid) if c != "/"}


def test_forged_or_deleted_pid_file_changes_nothing(sharing: HostSharing) -> None:
    """The pipe directory is mounted read-write into pods: its pid file is theirs to forge."""
    identity = started(sharing)
    pipe = sharing.mps_root / "claim-1" / "pipe"
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # a process that is not the daemon
    assert sharing.mps_running("claim-1", pipe)
    sharing.start_mps(daemon_for(sharing.mps_root, "claim-1", ["GPU-1"]))
    assert daemons(pipe) == [identity]  # no second daemon
    pid_file.unlink()
    assert sharing.mps_running("claim-1", pipe)
    # Its record lost too (a new state directory): found again through /proc.
    shutil.rmtree(sharing.registry)
    assert sharing.mps_running("claim-1", pipe)
    sharing.stop_mps("claim-1", pipe)
    assert not procs.is_alive(identity)
    assert procs.identify(os.getpid()) is not None  # the forged PID was never signalled


def test_a_daemon_deaf_to_quit_is_signalled(
    sharing: HostSharing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod replaced the control socket: quit never arrives, the recorded process is
    terminated."""
    monkeypatch.setattr(hostmod, "QUIT_GRACE", 0.5)
    identity = started(sharing)
    pipe = sharing.mps_root / "claim-1" / "pipe"
    (pipe / "control").unlink()
    with socket.socket(socket.AF_UNIX) as impostor:
        impostor.bind(str(pipe / "control"))  # nobody accepts: the client fails
        sharing.stop_mps("claim-1", pipe)
    assert not procs.is_alive(identity)


def test_shm_is_a_world_writable_tmpfs_with_a_limit(sharing: HostSharing) -> None:
    started(sharing)
    shm = sharing.mps_root / "claim-1" / "shm"
    (mount,) = [
        m.split()
        for m in Path("/proc/self/mounts").read_text().splitlines()
        if m.split()[1] == str(shm)
    ]
    assert mount[2] == "tmpfs"
    options = mount[3].split(",")
    assert "size=1048576k" in options and {"nosuid", "nodev"} <= set(options), options
    # Every client uid may write, none may remove another's files (tmpfs omits its default
    # mode=1777 from the options).
    assert stat.S_IMODE(shm.stat().st_mode) == 0o1777
    sharing.stop_mps("claim-1", sharing.mps_root / "claim-1" / "pipe")
    assert str(shm) not in Path("/proc/self/mounts").read_text()


def test_a_multi_user_daemon_is_started_with_its_flag(sharing: HostSharing) -> None:
    # multiUser of the NVIDIA config API (compat mode).
    daemon = daemon_for(sharing.mps_root, "claim-m", ["GPU-1"], MpsLimits(multi_user=True))
    sharing.start_mps(daemon)
    (identity,) = daemons(daemon.pipe_dir)
    assert procs.cmdline(identity.pid)[1:] == ["-d", "-M"]
    assert "Multi-user mode" in (daemon.log_dir / "control.log").read_text()
    sharing.stop_mps("claim-m", daemon.pipe_dir)
    plain = started(sharing)
    assert procs.cmdline(plain.pid)[1:] == ["-d"]
