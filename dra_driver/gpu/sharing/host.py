"""Sharing on real GPUs: ``nvidia-smi`` for the compute policy, ``nvidia-cuda-mps-control``
for MPS control daemons.

The tools come from the NVIDIA driver root (``--driver-root``, where the host's driver is
mounted into the agent's container), run with the driver's libraries preloaded
(:func:`~dra_driver.gpu.driverroot.tool_env`); the agent itself loads nothing from there.

MPS control daemons serve running pods, so they must outlive the agent: a crash, a restart or
``helm upgrade`` of the agent must not stop them. A container's processes die with its PID
namespace and are killed through its cgroup, so a daemon is started outside both: the agent
runs with the host's PID namespace (the chart's ``hostPID``) and launches the daemon through
``nsenter`` in the host's mount and cgroup namespaces (those of the container runtime's shim),
where it moves into a cgroup of its own (``dra-driver-mps/...``) and runs the host's copy of
the tool from the host's driver root. Its ``/dev/shm`` (in a private mount namespace) is a
tmpfs of mode 1777 with a size limit, mounted on the host at the daemon's ``shm`` directory,
which the claim's containers get as their ``/dev/shm``: clients of any uid can write it.

A daemon is identified by what only the kernel and the agent write: its PID, start time and
executable, recorded in ``<plugin dir>/mps-daemons/<id>.json`` (no pod mounts that directory)
and checked against ``/proc`` before the daemon is trusted or signalled. The pid file the daemon
leaves in its pipe directory is never read: that directory is mounted read-write into pods.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog
from pydantic import BaseModel, ValidationError

from dra_driver.cdi.writer import remove, write_atomic
from dra_driver.gpu.driverroot import BIN_DIRS, CUDA, NVML, tool_env
from dra_driver.gpu.sharing import procs
from dra_driver.gpu.sharing.backend import MpsDaemon, SharingError
from dra_driver.gpu.sharing.timeslicing import timeslice_value

log = structlog.get_logger(__name__)

TIMEOUT = 30.0
MPS_CONTROL = "nvidia-cuda-mps-control"
#: The cgroup (in every hierarchy) under which each daemon gets a cgroup of its own.
CGROUP_PARENT = "dra-driver-mps"
#: Size limit of a daemon's /dev/shm tmpfs (MPS keeps small control structures there).
SHM_SIZE = "1g"
#: How long a daemon may take to exit after ``quit`` (then SIGTERM), and after SIGTERM.
QUIT_GRACE = 5.0
TERM_GRACE = 2.0

# Shell run in the host's mount and cgroup namespaces (or the agent's own outside a
# container); only POSIX sh and util-linux, which every node has. `hierarchies` lists the
# cgroup v2 root, or each cgroup v1 hierarchy (the runtime kills a container through any).
_HIERARCHIES = """
hierarchies() {
  if [ -f /sys/fs/cgroup/cgroup.procs ]; then echo /sys/fs/cgroup; return; fi
  for h in /sys/fs/cgroup/*; do [ -L "$h" ] || [ ! -f "$h/cgroup.procs" ] || echo "$h"; done
}
"""
LAUNCH_SCRIPT = (
    _HIERARCHIES
    + """
set -eu
shm=$1 size=$2 group=$3; shift 3
join() {  # move this shell into the cgroup $2 below hierarchy $1
  d=$1
  for part in $(echo "$2" | tr / ' '); do
    parent=$d d=$d/$part
    mkdir -p "$d"
    for f in cpuset.cpus cpuset.mems; do  # a v1 cpuset with an empty set admits no process
      if [ -f "$d/$f" ] && [ -z "$(cat "$d/$f")" ]; then cat "$parent/$f" > "$d/$f"; fi
    done
  done
  echo $$ > "$d/cgroup.procs"
}
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" "$shm"
mountpoint -q "$shm" || mount -t tmpfs -o "mode=1777,size=$size,nosuid,nodev" dra-mps-shm "$shm"
for h in $(hierarchies); do join "$h" "$group"; done
exec unshare --mount --propagation private -- \
  sh -c 'mount --bind "$1" /dev/shm && shift && exec "$@"' sh "$shm" "$@"
"""
)
CLEANUP_SCRIPT = (
    _HIERARCHIES
    + """
shm=$1 group=$2
for h in $(hierarchies); do
  d="$h/$group"; [ -d "$d" ] || continue
  for i in 1 2 3 4 5 6 7 8 9 10; do
    while read -r p; do kill -9 "$p" 2>/dev/null || true; done < "$d/cgroup.procs"
    rmdir "$d" 2>/dev/null && break; sleep 0.1
  done
done
! mountpoint -q "$shm" || umount "$shm"
"""
)


class DaemonRecord(BaseModel):
    """``mps-daemons/<id>.json``: the process that is the daemon, as first seen."""

    pid: int
    start_time: int
    exe: str

    def identity(self) -> procs.ProcessIdentity:
        """As a process identity."""
        return procs.ProcessIdentity(pid=self.pid, start_time=self.start_time, exe=self.exe)


def control_commands(daemon: MpsDaemon) -> list[str]:
    """The control-pipe commands that set a daemon's default limits (pure)."""
    commands = []
    if daemon.limits.active_thread_percentage is not None:
        commands.append(
            f"set_default_active_thread_percentage {daemon.limits.active_thread_percentage}"
        )
    for ordinal, limit in daemon.limits.pinned_memory:
        commands.append(f"set_default_device_pinned_mem_limit {ordinal} {limit}")
    return commands


def timeslice_failed(returncode: int, output: str) -> bool:
    """Whether ``nvidia-smi compute-policy`` refused: it may exit 0 and print why (pure)."""
    text = output.lower()
    return returncode != 0 or "not supported" in text or "failed" in text


class HostSharing:
    """:class:`dra_driver.gpu.sharing.backend.SharingBackend` on the node's real GPUs."""

    def __init__(
        self,
        mps_root: Path,
        driver_root: Path = Path("/"),
        host_driver_root: Path | None = None,
        *,
        cgroup_parent: str = CGROUP_PARENT,
        shm_size: str = SHM_SIZE,
    ) -> None:
        self.mps_root = mps_root
        self.driver_root = driver_root
        self.host_driver_root = host_driver_root or driver_root
        # Only the agent writes here: no claim's container mounts it.
        self.registry = mps_root.with_name("mps-daemons")
        self.cgroup_parent = cgroup_parent
        self.shm_size = shm_size
        self._warned_in_container = False

    # --- running the tools ----------------------------------------------------------------

    def _tool(self, name: str) -> str:
        for directory in BIN_DIRS:
            candidate = self.driver_root / directory / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        found = shutil.which(name)
        if found is None:
            raise SharingError(f"{name} not found in the driver root {self.driver_root} or PATH")
        return found

    def _env(self, extra: Mapping[str, str] = {}) -> dict[str, str]:
        """This process's environment with what the driver's tools need (run here)."""
        return {**os.environ, **tool_env(self.driver_root), **extra}

    def _run(
        self, argv: Sequence[str], *, stdin: str = "", env: Mapping[str, str] = {}
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                list(argv),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                env=self._env(env),
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise SharingError(f"{argv[0]}: {exc}") from None

    # --- time-slicing ---------------------------------------------------------------------

    def set_timeslice(self, uuid: str, interval: str) -> None:
        """``nvidia-smi compute-policy -i <uuid> --set-timeslice=<n>``."""
        value = timeslice_value(interval)
        proc = self._run(
            [self._tool("nvidia-smi"), "compute-policy", "-i", uuid, f"--set-timeslice={value}"]
        )
        output = (proc.stdout + proc.stderr).strip()
        if timeslice_failed(proc.returncode, output):
            detail = output.splitlines()[-1] if output else f"exit status {proc.returncode}"
            raise SharingError(f"GPU {uuid}: cannot set time-slice {interval}: {detail}")
        log.info("time-slice set", uuid=uuid, interval=interval)

    def reset_timeslice(self, uuid: str) -> None:
        """Back to the default interval."""
        self.set_timeslice(uuid, "Default")

    # --- MPS: where a daemon runs ---------------------------------------------------------

    def _host(self) -> tuple[list[str], Path]:
        """The command prefix that enters the host's mount and cgroup namespaces, and where
        the driver root is seen there; no prefix outside a container (or without hostPID)."""
        target = procs.host_namespace_pid()
        if target is not None:
            prefix = ["nsenter", f"--target={target}", "--mount", "--cgroup", "--"]
            return prefix, self.host_driver_root
        if os.getpid() == 1 and not self._warned_in_container:
            # PID 1 of a PID namespace of its own: a container without hostPID.
            log.warning(
                "MPS daemons run inside the agent's container and stop with it: "
                "run the agent with the host's PID namespace (hostPID)"
            )
            self._warned_in_container = True
        return [], self.driver_root

    def _group(self, daemon_id: str) -> str:
        # The plugin directory's name is the driver's: two drivers on a node never collide.
        return f"{self.cgroup_parent}/{self.mps_root.parent.name}-{daemon_id}"

    # --- MPS: which process is the daemon -------------------------------------------------

    def _record_path(self, daemon_id: str) -> Path:
        return self.registry / f"{daemon_id}.json"

    def _recorded(self, daemon_id: str) -> procs.ProcessIdentity | None:
        try:
            text = self._record_path(daemon_id).read_text()
            return DaemonRecord.model_validate_json(text).identity()
        except (OSError, ValidationError):
            return None

    def _record(self, daemon_id: str, identity: procs.ProcessIdentity) -> None:
        record = DaemonRecord(pid=identity.pid, start_time=identity.start_time, exe=identity.exe)
        try:
            self.registry.mkdir(parents=True, exist_ok=True)
            write_atomic(self._record_path(daemon_id), record.model_dump())
        except OSError as exc:  # the mkdir's, or write_atomic's DurableWriteError
            # The daemon runs; a later look finds it again through /proc.
            log.warning("MPS daemon identity not recorded", daemon=daemon_id, error=str(exc))

    def _search(self, daemon_id: str, pipe_dir: Path) -> procs.ProcessIdentity | None:
        """The control daemon serving ``pipe_dir``, found through /proc: the MPS control tool
        started with ``-d`` or ``-f`` with that pipe directory in its environment, in the
        daemon's own cgroup (no pod can put a process there); only an agent confined to a PID
        namespace of its own, which cannot move daemons, goes without that proof."""
        confined = os.getpid() == 1
        group = "/" + self._group(daemon_id)
        for pid in procs.pids():
            path = procs.exe(pid)
            if path is None or Path(path.removesuffix(" (deleted)")).name != MPS_CONTROL:
                continue
            if not {"-d", "-f"} & set(procs.cmdline(pid)[1:]):
                continue  # a client, not the daemon
            if procs.environ(pid).get("CUDA_MPS_PIPE_DIRECTORY") != str(pipe_dir):
                continue
            if not confined and not any(c.endswith(group) for c in procs.cgroups(pid)):
                continue
            identity = procs.identify(pid)
            if identity is not None:
                return identity
        return None

    def _daemon(self, daemon_id: str, pipe_dir: Path) -> procs.ProcessIdentity | None:
        """The live daemon: as recorded if that very process still runs, else as /proc shows
        it (a lost record); the record is renewed when found anew."""
        recorded = self._recorded(daemon_id)
        if recorded is not None and procs.is_alive(recorded):
            return recorded
        found = self._search(daemon_id, pipe_dir)
        if found is not None:
            self._record(daemon_id, found)
        return found

    def mps_running(self, daemon_id: str, pipe_dir: Path) -> bool:
        """Whether the daemon's process runs (never judged by files a pod can write)."""
        return self._daemon(daemon_id, pipe_dir) is not None

    # --- MPS: start, stop, list -----------------------------------------------------------

    def _control(self, pipe_dir: Path, command: str) -> subprocess.CompletedProcess[str]:
        return self._run(
            [self._tool(MPS_CONTROL)],
            stdin=command + "\n",
            env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)},
        )

    def start_mps(self, daemon: MpsDaemon) -> None:
        """Start the daemon outside the agent's container, then set its limits; a daemon that
        runs already is kept."""
        for directory in (daemon.pipe_dir, daemon.log_dir, daemon.shm_dir):
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                # A SharingError, which start-up's restart of a dead daemon logs (an OSError
                # would end the start-up) and a prepare makes its claim's error.
                raise SharingError(
                    f"MPS daemon {daemon.daemon_id}: cannot create {directory}: "
                    f"{exc.strerror or exc}"
                ) from None
        if self._daemon(daemon.daemon_id, daemon.pipe_dir) is None:
            self._launch(daemon)
        for command in control_commands(daemon):
            proc = self._control(daemon.pipe_dir, command)
            if proc.returncode != 0:
                raise SharingError(
                    f"MPS daemon {daemon.daemon_id}: {command!r} failed: "
                    f"{(proc.stderr or proc.stdout).strip() or proc.returncode}"
                )

    def _launch(self, daemon: MpsDaemon) -> None:
        prefix, root = self._host()
        found = Path(self._tool(MPS_CONTROL))
        if not found.is_relative_to(self.driver_root):
            # The daemon runs the host's copy, which only the driver root names.
            raise SharingError(
                f"{MPS_CONTROL} is not in the driver root {self.driver_root} (only at "
                f"{found}): set --driver-root to where the host's NVIDIA driver is mounted"
            )
        tool = root / found.relative_to(self.driver_root)
        # Only the daemon gets the driver's libraries (through env at its exec): the host's
        # own tools of the launch (sh, mkdir, mount, unshare) run as the host runs them.
        driver = tool_env(self.driver_root, (NVML, CUDA), seen_as=root)
        argv = [
            *prefix, "sh", "-c", LAUNCH_SCRIPT, "sh",
            str(daemon.shm_dir), self.shm_size, self._group(daemon.daemon_id),
            *(["env", *(f"{k}={v}" for k, v in driver.items())] if driver else []),
            str(tool), "-d", *(["-M"] if daemon.limits.multi_user else []),
        ]  # fmt: skip
        env = {
            "CUDA_VISIBLE_DEVICES": ",".join(daemon.uuids),
            "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(daemon.log_dir),
        }
        try:
            # -d forks the daemon and returns once it listens.
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                env={**os.environ, **env},
                start_new_session=True,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise SharingError(f"starting MPS daemon {daemon.daemon_id}: {exc}") from None
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise SharingError(
                f"starting MPS daemon {daemon.daemon_id} failed: "
                f"{detail[-1] if detail else f'exit status {proc.returncode}'}"
            )
        identity = self._search(daemon.daemon_id, daemon.pipe_dir)
        if identity is None:
            raise SharingError(
                f"MPS daemon {daemon.daemon_id}: {MPS_CONTROL} -d returned but no daemon "
                f"serves {daemon.pipe_dir}"
            )
        self._record(daemon.daemon_id, identity)
        log.info(
            "MPS daemon started",
            daemon=daemon.daemon_id,
            pid=identity.pid,
            uuids=list(daemon.uuids),
            cgroup=self._group(daemon.daemon_id),
        )

    def stop_mps(self, daemon_id: str, pipe_dir: Path) -> None:
        """``quit`` through the control pipe; a daemon still there after the grace period is
        signalled (the very process recorded, never a PID read from a pod's files). Then its
        cgroup and its shm tmpfs are removed. A daemon that is gone is not an error."""
        identity = self._daemon(daemon_id, pipe_dir)
        if identity is not None:
            try:
                self._control(pipe_dir, "quit")
            except SharingError as exc:
                # A hung daemon times the client out, a driver upgrade may remove the tool:
                # the recorded process is signalled all the same, never left running.
                log.warning("MPS daemon quit failed", daemon=daemon_id, error=str(exc))
            if not _exited(identity, QUIT_GRACE):
                log.warning("MPS daemon ignored quit: terminating it", daemon=daemon_id)
                _signal(identity, signal.SIGTERM)
                if not _exited(identity, TERM_GRACE):
                    _signal(identity, signal.SIGKILL)
                    if not _exited(identity, TERM_GRACE):
                        raise SharingError(
                            f"MPS daemon {daemon_id} (pid {identity.pid}) won't stop"
                        )
        self._cleanup(daemon_id, pipe_dir.parent / "shm")
        remove(self._record_path(daemon_id))
        if identity is not None:
            log.info("MPS daemon stopped", daemon=daemon_id, pid=identity.pid)

    def _cleanup(self, daemon_id: str, shm_dir: Path) -> None:
        """Kill what is left in the daemon's cgroup (its servers), remove the cgroup and
        unmount its shm."""
        prefix, _ = self._host()
        argv = [*prefix, "sh", "-c", CLEANUP_SCRIPT, "sh", str(shm_dir), self._group(daemon_id)]
        proc = self._run(argv)
        if proc.returncode != 0:
            raise SharingError(
                f"MPS daemon {daemon_id}: cleanup failed: {(proc.stderr or proc.stdout).strip()}"
            )

    def list_mps(self) -> tuple[str, ...]:
        """Daemons recorded or with a directory under the MPS root whose process runs."""
        ids: set[str] = set()
        for directory, pattern in ((self.registry, "*.json"), (self.mps_root, "*")):
            try:
                ids.update(
                    p.stem if p.suffix == ".json" else p.name for p in directory.glob(pattern)
                )
            except OSError:
                continue
        return tuple(
            daemon_id
            for daemon_id in sorted(ids)
            if self.mps_running(daemon_id, self.mps_root / daemon_id / "pipe")
        )


def _exited(identity: procs.ProcessIdentity, grace: float) -> bool:
    """Wait up to ``grace`` seconds for the process to be gone."""
    deadline = time.monotonic() + grace
    while procs.is_alive(identity):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _signal(identity: procs.ProcessIdentity, signum: signal.Signals) -> None:
    """Signal the process if it is still the one recorded."""
    if procs.is_alive(identity):
        with contextlib.suppress(ProcessLookupError):
            os.kill(identity.pid, signum)
