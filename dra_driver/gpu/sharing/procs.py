"""Processes as ``/proc`` shows them: who a process is, and which namespaces are the host's.

An MPS control daemon must be recognised without trusting anything a pod can write: its pipe
directory (and the pid file the daemon leaves there) is mounted read-write into the claim's
containers. What the kernel reports cannot be forged by a pod: a process's executable, its
start time (which tells a reused PID apart), its environment as it was at ``exec`` and its
cgroups (a pod cannot move a process into a cgroup of the host's).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as it was when first seen: a live process with another start time or
    executable under the same PID is someone else."""

    pid: int
    start_time: int
    exe: str


def start_time(pid: int, proc: Path = PROC) -> int | None:
    """Clock ticks after boot at which ``pid`` started (``/proc/<pid>/stat`` field 22)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def exe(pid: int, proc: Path = PROC) -> str | None:
    """The executable of ``pid`` as its own mount namespace names it."""
    try:
        return os.readlink(proc / str(pid) / "exe")
    except OSError:
        return None


def environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    """The environment ``pid`` was started with (empty when unreadable)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    """The arguments of ``pid`` (empty when unreadable)."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def cgroups(pid: int, proc: Path = PROC) -> list[str]:
    """The cgroup paths of ``pid``, one per hierarchy (``/proc/<pid>/cgroup``; relative to
    the reader's cgroup namespace, so a cgroup outside it reads ``/../../<path>``)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return []
    return [line.split(":", 2)[2] for line in lines if line.count(":") >= 2]


def mount_ns(pid: int | str, proc: Path = PROC) -> str | None:
    """The mount namespace of ``pid`` (``self`` for this process), e.g. ``mnt:[4026531832]``."""
    try:
        return os.readlink(proc / str(pid) / "ns" / "mnt")
    except OSError:
        return None


def parent(pid: int, proc: Path = PROC) -> int | None:
    """The parent of ``pid`` (``/proc/<pid>/stat`` field 4)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        return int(stat.rsplit(")", 1)[-1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def identify(pid: int, proc: Path = PROC) -> ProcessIdentity | None:
    """The identity of a live process, or None when it is gone."""
    started, path = start_time(pid, proc), exe(pid, proc)
    if started is None or path is None:
        return None
    return ProcessIdentity(pid=pid, start_time=started, exe=path)


def is_alive(identity: ProcessIdentity, proc: Path = PROC) -> bool:
    """Whether the very process ``identity`` recorded still runs (not a reuse of its PID)."""
    return identify(identity.pid, proc) == identity


def host_namespace_pid(proc: Path = PROC) -> int | None:
    """A process in the host's mount namespace to enter, when this one runs in a container.

    With the host's PID namespace (``hostPID``) the agent sees its ancestors: the nearest one
    in another mount namespace is the container runtime's shim, which lives in the host's.
    None when every ancestor shares this mount namespace: the agent runs on the host itself,
    or in a PID namespace of its own, where it cannot leave its container.
    """
    own = mount_ns("self", proc)
    pid = parent(os.getpid(), proc)
    while pid is not None and pid > 0:
        ns = mount_ns(pid, proc)
        if ns is not None and ns != own:
            return pid
        pid = parent(pid, proc)
    return None


def pids(proc: Path = PROC) -> Iterator[int]:
    """Every PID this process can see."""
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)
