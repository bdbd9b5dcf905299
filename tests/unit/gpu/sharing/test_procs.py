"""Process identities and the host's namespaces, on a /proc tree made by the test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from dra_driver.gpu.sharing import procs


def fake_process(
    proc: Path, pid: int, *, ppid: int, started: int, exe: str, mnt: str, comm: str = "x y)"
) -> None:
    d = proc / str(pid)
    (d / "ns").mkdir(parents=True)
    # The command name may hold spaces and parentheses: fields are counted after the last ")".
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(started)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    os.symlink(exe, d / "exe")
    os.symlink(mnt, d / "ns" / "mnt")
    (d / "environ").write_bytes(b"A=1\0CUDA_MPS_PIPE_DIRECTORY=/p\0")
    (d / "cmdline").write_bytes(exe.encode() + b"\0-d\0")


def test_identity_tells_a_reused_pid_apart(tmp_path: Path) -> None:
    fake_process(tmp_path, 42, ppid=1, started=1000, exe="/usr/bin/tool", mnt="mnt:[1]")
    first = procs.identify(42, tmp_path)
    assert first == procs.ProcessIdentity(42, 1000, "/usr/bin/tool")
    assert procs.is_alive(first, tmp_path)
    # The process exits and another one of the same program gets its PID.
    shutil.rmtree(tmp_path / "42")
    fake_process(tmp_path, 42, ppid=1, started=2000, exe="/usr/bin/tool", mnt="mnt:[1]")
    assert not procs.is_alive(first, tmp_path)


def test_gone_process_has_no_identity(tmp_path: Path) -> None:
    assert procs.identify(7, tmp_path) is None
    assert procs.environ(7, tmp_path) == {}
    assert procs.cmdline(7, tmp_path) == []


def test_environment_and_arguments(tmp_path: Path) -> None:
    fake_process(tmp_path, 5, ppid=1, started=1, exe="/bin/t", mnt="mnt:[1]")
    assert procs.environ(5, tmp_path)["CUDA_MPS_PIPE_DIRECTORY"] == "/p"
    assert procs.cmdline(5, tmp_path) == ["/bin/t", "-d"]


def test_host_namespace_is_the_nearest_ancestor_in_another_mount_namespace(
    tmp_path: Path,
) -> None:
    me = os.getpid()
    # me -> shim (host's mount namespace) -> init
    os.symlink(str(me), tmp_path / "self")
    fake_process(tmp_path, me, ppid=900, started=5, exe="/usr/bin/python3", mnt="mnt:[2]")
    fake_process(tmp_path, 900, ppid=1, started=4, exe="/usr/bin/shim", mnt="mnt:[1]")
    fake_process(tmp_path, 1, ppid=0, started=1, exe="/sbin/init", mnt="mnt:[1]")
    assert procs.host_namespace_pid(tmp_path) == 900


def test_no_host_namespace_on_the_host_itself(tmp_path: Path) -> None:
    me = os.getpid()
    os.symlink(str(me), tmp_path / "self")
    fake_process(tmp_path, me, ppid=1, started=5, exe="/usr/bin/python3", mnt="mnt:[1]")
    fake_process(tmp_path, 1, ppid=0, started=1, exe="/sbin/init", mnt="mnt:[1]")
    assert procs.host_namespace_pid(tmp_path) is None


def test_real_child_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        identity = procs.identify(child.pid)
        assert identity is not None and Path(identity.exe).name.startswith("python")
        assert procs.is_alive(identity)
        assert child.pid in set(procs.pids())
        assert procs.parent(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert not procs.is_alive(identity)
