"""Sharing on real GPUs: ``nvidia-smi`` for the compute policy, ``nvidia-cuda-mps-control``
for MPS control daemons.

The tools come from the NVIDIA driver root (``--driver-root``, where the host's driver is
mounted into the agent's container). Only the child processes get the driver root's library
directories in ``LD_LIBRARY_PATH``; the agent itself loads nothing from there.

An MPS control daemon is started with ``nvidia-cuda-mps-control -d`` in a session of its own,
so it outlives the agent: a restarted agent finds it through its pipe directory and keeps it,
or stops it when no prepared claim uses it. The daemon runs in a private mount namespace
(``unshare --mount``) whose ``/dev/shm`` is the daemon's ``shm`` directory, which the claim's
containers also get as ``/dev/shm``: MPS clients and server exchange memory there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from dra_driver.gpu.sharing.backend import MpsDaemon, SharingError
from dra_driver.gpu.sharing.timeslicing import timeslice_value

log = structlog.get_logger(__name__)

#: Where driver installations put their tools and libraries, relative to the driver root.
BIN_DIRS = ("usr/bin", "usr/local/bin", "bin")
LIB_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib",
)
TIMEOUT = 30.0
PID_FILE = "nvidia-cuda-mps-control.pid"


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

    def __init__(self, mps_root: Path, driver_root: Path = Path("/")) -> None:
        self.mps_root = mps_root
        self.driver_root = driver_root

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
        env = dict(os.environ)
        if self.driver_root != Path("/"):
            libs = [str(self.driver_root / d) for d in LIB_DIRS if (self.driver_root / d).is_dir()]
            env["LD_LIBRARY_PATH"] = ":".join(libs)
            bins = [str(self.driver_root / d) for d in BIN_DIRS]
            env["PATH"] = ":".join([*bins, env.get("PATH", "")])
        env.update(extra)
        return env

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

    # --- MPS ------------------------------------------------------------------------------

    def _control(self, pipe_dir: Path, command: str) -> subprocess.CompletedProcess[str]:
        return self._run(
            [self._tool("nvidia-cuda-mps-control")],
            stdin=command + "\n",
            env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)},
        )

    def mps_running(self, daemon_id: str, pipe_dir: Path) -> bool:
        """The daemon's pid file names a live process."""
        try:
            pid = int((pipe_dir / PID_FILE).read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
        return True

    def start_mps(self, daemon: MpsDaemon) -> None:
        """Start the daemon in its own session and mount namespace, then set its limits."""
        for directory in (daemon.pipe_dir, daemon.log_dir, daemon.shm_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if not self.mps_running(daemon.daemon_id, daemon.pipe_dir):
            script = 'mount --bind "$1" /dev/shm && shift && exec "$@"'
            argv = [
                "unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", script, "sh", str(daemon.shm_dir),
                self._tool("nvidia-cuda-mps-control"), "-d",
            ]  # fmt: skip
            env = {
                "CUDA_VISIBLE_DEVICES": ",".join(daemon.uuids),
                "CUDA_MPS_PIPE_DIRECTORY": str(daemon.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(daemon.log_dir),
            }
            try:
                # -d forks the daemon and returns; start_new_session keeps it out of the
                # agent's process group, so stopping the agent does not stop it.
                proc = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    timeout=TIMEOUT,
                    env=self._env(env),
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
            log.info("MPS daemon started", daemon=daemon.daemon_id, uuids=list(daemon.uuids))
        for command in control_commands(daemon):
            proc = self._control(daemon.pipe_dir, command)
            if proc.returncode != 0:
                raise SharingError(
                    f"MPS daemon {daemon.daemon_id}: {command!r} failed: "
                    f"{(proc.stderr or proc.stdout).strip() or proc.returncode}"
                )

    def stop_mps(self, daemon_id: str, pipe_dir: Path) -> None:
        """``echo quit | nvidia-cuda-mps-control``; a daemon that is gone is not an error."""
        if not self.mps_running(daemon_id, pipe_dir):
            return
        proc = self._control(pipe_dir, "quit")
        if proc.returncode != 0 and self.mps_running(daemon_id, pipe_dir):
            raise SharingError(
                f"stopping MPS daemon {daemon_id} failed: {(proc.stderr or proc.stdout).strip()}"
            )
        log.info("MPS daemon stopped", daemon=daemon_id)

    def list_mps(self) -> tuple[str, ...]:
        """Daemons with a pipe directory under the MPS root whose process is alive."""
        try:
            entries = sorted(p for p in self.mps_root.iterdir() if p.is_dir())
        except OSError:
            return ()
        return tuple(p.name for p in entries if self.mps_running(p.name, p / "pipe"))
