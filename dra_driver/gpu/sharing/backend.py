"""Applying GPU sharing on the node: one small interface over the hardware steps.

Sharing settings in a claim's config (time-slicing, MPS) and shared GPUs (several claims on one
GPU, limited by MPS) need steps outside the CDI spec: a compute policy set with ``nvidia-smi``
and MPS control daemons started with ``nvidia-cuda-mps-control``. :class:`SharingBackend` hides
how; :mod:`dra_driver.gpu.sharing.host` runs the NVIDIA tools,
:mod:`dra_driver.gpu.sharing.simulated` records what it would do in a JSON file (simulated
nodes and tests). All methods block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dra_driver.errors import DriverError


class SharingError(DriverError):
    """A sharing step failed; the message is one line for a human."""


@dataclass(frozen=True)
class MpsLimits:
    """Defaults an MPS control daemon hands to the servers it starts.

    ``pinned_memory`` maps the device ordinal as the daemon sees it (its
    ``CUDA_VISIBLE_DEVICES`` order) to a limit in MPS's own notation (``10240M``).
    """

    active_thread_percentage: int | None = None
    pinned_memory: tuple[tuple[int, str], ...] = ()
    # The daemon serves clients of any Linux user (-M; the NVIDIA config API's multiUser).
    multi_user: bool = False

    @property
    def empty(self) -> bool:
        """Whether there is nothing to set."""
        return self.active_thread_percentage is None and not self.pinned_memory


@dataclass(frozen=True)
class MpsDaemon:
    """One MPS control daemon: which GPUs it serves and where its pipes and logs live.

    ``shm_dir`` is the directory clients and daemon share as ``/dev/shm``: MPS passes memory
    between them there, so a container must see the daemon's, not its own.
    """

    daemon_id: str
    uuids: tuple[str, ...]
    pipe_dir: Path
    log_dir: Path
    shm_dir: Path
    limits: MpsLimits = field(default_factory=MpsLimits)


class SharingBackend(Protocol):
    """What the driver needs to apply sharing on the node's GPUs."""

    def set_timeslice(self, uuid: str, interval: str) -> None:
        """Set the GPU's time-slice (``Default``, ``Short``, ``Medium``, ``Long``).

        Raises :class:`SharingError` when the GPU does not support it.
        """
        ...

    def reset_timeslice(self, uuid: str) -> None:
        """Put the GPU's time-slice back to the default."""
        ...

    def start_mps(self, daemon: MpsDaemon) -> None:
        """Start the daemon detached from this process and apply its limits; idempotent."""
        ...

    def stop_mps(self, daemon_id: str, pipe_dir: Path) -> None:
        """Stop the daemon; one that is not running is not an error."""
        ...

    def mps_running(self, daemon_id: str, pipe_dir: Path) -> bool:
        """Whether the daemon is running now."""
        ...

    def list_mps(self) -> tuple[str, ...]:
        """Ids of the daemons that may be running (started by this driver, not stopped)."""
        ...
