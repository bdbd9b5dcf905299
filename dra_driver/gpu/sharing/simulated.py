"""Sharing on a simulated node: what would be applied, recorded in a JSON file.

``<plugin dir>/simulated-sharing.json`` holds, per GPU, the time-slice interval in force; per
MPS daemon, its state (``running``/``stopped``), GPUs, directories and limits; and a lifecycle
log of every step in order. The file is re-read before and written atomically after every
change, so a restarted agent (or a test) sees exactly what was applied. Starting a daemon
creates its directories and a ``control`` file in the pipe directory, as the real daemon's
control pipe would appear there.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.cdi.writer import write_atomic
from dra_driver.gpu.sharing.backend import MpsDaemon, SharingError
from dra_driver.gpu.sharing.mps import to_record
from dra_driver.gpu.sharing.timeslicing import timeslice_value

SIMULATED_STATE_FILE = "simulated-sharing.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SimGpu(_Model):
    """A GPU's compute policy."""

    timeslice: str = "Default"


class SimDaemon(_Model):
    """An MPS control daemon as started (and perhaps stopped)."""

    state: str  # running | stopped
    uuids: list[str]
    pipe_dir: str = Field(alias="pipeDir")
    log_dir: str = Field(alias="logDir")
    shm_dir: str = Field(alias="shmDir")
    active_thread_percentage: int | None = Field(default=None, alias="activeThreadPercentage")
    pinned_memory: dict[str, str] = Field(default_factory=dict, alias="pinnedMemory")
    multi_user: bool | None = Field(default=None, alias="multiUser")
    starts: int = 0


class SimState(_Model):
    """The whole file."""

    gpus: dict[str, SimGpu] = Field(default_factory=dict)  # by GPU UUID
    mps: dict[str, SimDaemon] = Field(default_factory=dict)  # by daemon id
    log: list[dict[str, Any]] = Field(default_factory=list)


class SimulatedSharing:
    """:class:`dra_driver.gpu.sharing.backend.SharingBackend` that records instead of applying.

    ``timeslice_unsupported`` names GPUs that refuse a time-slice, as GPUs without the
    compute-policy feature do.
    """

    def __init__(self, path: Path, timeslice_unsupported: Collection[str] = ()) -> None:
        self.path = path
        self._unsupported = frozenset(timeslice_unsupported)
        self._lock = threading.Lock()

    def read(self) -> SimState:
        """The recorded state (empty when nothing was applied yet)."""
        try:
            return SimState.model_validate_json(self.path.read_text())
        except FileNotFoundError:
            return SimState()
        except (ValidationError, ValueError) as exc:
            first = str(exc).splitlines()[0]
            raise SharingError(f"simulated sharing state {self.path} is corrupt: {first}") from None

    def _save(self, state: SimState, event: dict[str, Any]) -> None:
        state.log.append({"time": round(time.time(), 3), **event})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.loads(state.model_dump_json(by_alias=True)))

    def set_timeslice(self, uuid: str, interval: str) -> None:
        """Record the GPU's interval."""
        value = timeslice_value(interval)
        if uuid in self._unsupported:
            raise SharingError(
                f"GPU {uuid} does not support time-slice settings "
                "(nvidia-smi compute-policy: Not Supported)"
            )
        with self._lock:
            state = self.read()
            state.gpus[uuid] = SimGpu(timeslice=interval)
            event = {"op": "set-timeslice", "uuid": uuid, "interval": interval, "value": value}
            self._save(state, event)

    def reset_timeslice(self, uuid: str) -> None:
        """Record the GPU's interval as the default."""
        with self._lock:
            state = self.read()
            state.gpus[uuid] = SimGpu(timeslice="Default")
            self._save(state, {"op": "reset-timeslice", "uuid": uuid})

    def start_mps(self, daemon: MpsDaemon) -> None:
        """Record the daemon as running (again, if it was stopped) and make its directories."""
        with self._lock:
            state = self.read()
            known = state.mps.get(daemon.daemon_id)
            if known is not None and known.state == "running":
                return
            for directory in (daemon.pipe_dir, daemon.log_dir, daemon.shm_dir):
                directory.mkdir(parents=True, exist_ok=True)
            (daemon.pipe_dir / "control").touch()
            state.mps[daemon.daemon_id] = SimDaemon(
                **to_record(daemon).model_dump(exclude={"daemon"}),
                state="running",
                starts=(known.starts if known else 0) + 1,
            )
            event = {"op": "start-mps", "daemon": daemon.daemon_id, "uuids": list(daemon.uuids)}
            self._save(state, event)

    def stop_mps(self, daemon_id: str, pipe_dir: Path) -> None:
        """Record the daemon as stopped."""
        with self._lock:
            state = self.read()
            known = state.mps.get(daemon_id)
            if known is None or known.state != "running":
                return
            known.state = "stopped"
            (pipe_dir / "control").unlink(missing_ok=True)
            self._save(state, {"op": "stop-mps", "daemon": daemon_id})

    def mps_running(self, daemon_id: str, pipe_dir: Path) -> bool:
        """Whether the daemon is recorded as running."""
        known = self.read().mps.get(daemon_id)
        return known is not None and known.state == "running"

    def list_mps(self) -> tuple[str, ...]:
        """Daemons recorded as running."""
        return tuple(sorted(d for d, rec in self.read().mps.items() if rec.state == "running"))

    def kill_mps(self, daemon_id: str) -> None:
        """Tests: the daemon dies on its own (the agent's supervision should restart it)."""
        with self._lock:
            state = self.read()
            known = state.mps.get(daemon_id)
            if known is not None:
                known.state = "stopped"
                self._save(state, {"op": "died-mps", "daemon": daemon_id})
