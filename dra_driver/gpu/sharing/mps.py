"""MPS: which control daemon a claim uses, where it lives, what it limits.

Two kinds of daemon:

- **per claim**: a claim whose config asks for ``strategy: MPS`` gets its own daemon serving
  the claim's devices; the config's limits become the daemon's defaults (set through the
  control pipe) as well as the containers' ``CUDA_MPS_*`` variables.
- **per shared GPU**: a GPU published for sharing by memory gets one daemon, started by the
  first share prepared on it and stopped when the last one goes; each share's limits come
  from the capacity the scheduler counted for it and reach its containers as variables.

A daemon's directories are ``<plugin dir>/mps/<daemon id>/{pipe,log,shm}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from dra_driver.gpu.allocation import AllocatedDevice
from dra_driver.gpu.config import MpsConfig, mps_config
from dra_driver.gpu.sharing.backend import MpsDaemon, MpsLimits
from dra_driver.gpu.sharing.strategy import Strategy, sharable
from dra_driver.gpu.state.checkpoint import ClaimRecord, MpsRecord

MIB = 2**20


def claim_daemon_id(claim_uid: str) -> str:
    """The id of a claim's own daemon: the claim UID."""
    return claim_uid


def gpu_daemon_id(gpu_minor: int) -> str:
    """The id of a shared GPU's daemon: ``gpu-<minor>`` (short: the pipe directory holds
    UNIX sockets, whose paths must stay under 108 bytes)."""
    return f"gpu-{gpu_minor}"


def mps_limit(nbytes: int) -> str:
    """A memory limit in MPS's notation: whole MiB with the ``M`` suffix (rounded down)."""
    return f"{nbytes // MIB}M"


def config_limits(configs: Sequence[tuple[int, str, MpsConfig | None]]) -> MpsLimits:
    """The daemon defaults from the MPS configs of a claim's devices, in the daemon's order.

    ``configs`` is (the device's index in the claim, its UUID, its MPS config) per device
    the daemon serves; a per-device limit is found by that index or by the UUID, as for the
    container's variables, and set for the device's ordinal in the daemon.
    """
    percentage: int | None = None
    pinned: list[tuple[int, str]] = []
    multi_user = False
    for ordinal, (index, uuid, mps) in enumerate(configs):
        if mps is None:
            continue
        limit = mps.pinned_limit(index, uuid)
        if limit is not None:
            pinned.append((ordinal, mps_limit(limit)))
        if mps.default_active_thread_percentage is not None:
            percentage = mps.default_active_thread_percentage
        # Only the NVIDIA config API has it (compat mode).
        multi_user = multi_user or bool(getattr(mps, "multi_user", None))
    return MpsLimits(
        active_thread_percentage=percentage, pinned_memory=tuple(pinned), multi_user=multi_user
    )


NO_LIMITS = MpsLimits()


def daemon_for(
    root: Path, daemon_id: str, uuids: Sequence[str], limits: MpsLimits = NO_LIMITS
) -> MpsDaemon:
    """A daemon with its directories under ``root`` (``<plugin dir>/mps``)."""
    base = root / daemon_id
    return MpsDaemon(
        daemon_id=daemon_id,
        uuids=tuple(uuids),
        pipe_dir=base / "pipe",
        log_dir=base / "log",
        shm_dir=base / "shm",
        limits=limits,
    )


def to_record(daemon: MpsDaemon) -> MpsRecord:
    """The checkpoint's form of a daemon."""
    return MpsRecord(
        daemon=daemon.daemon_id,
        uuids=list(daemon.uuids),
        pipe_dir=str(daemon.pipe_dir),
        log_dir=str(daemon.log_dir),
        shm_dir=str(daemon.shm_dir),
        active_thread_percentage=daemon.limits.active_thread_percentage,
        pinned_memory={str(k): v for k, v in daemon.limits.pinned_memory},
        multi_user=daemon.limits.multi_user or None,
    )


def from_record(record: MpsRecord) -> MpsDaemon:
    """A daemon as the checkpoint describes it."""
    return MpsDaemon(
        daemon_id=record.daemon,
        uuids=tuple(record.uuids),
        pipe_dir=Path(record.pipe_dir),
        log_dir=Path(record.log_dir),
        shm_dir=Path(record.shm_dir),
        limits=MpsLimits(
            active_thread_percentage=record.active_thread_percentage,
            pinned_memory=tuple(sorted((int(k), v) for k, v in record.pinned_memory.items())),
            multi_user=bool(record.multi_user),
        ),
    )


def daemons_in_use(claims: Iterable[ClaimRecord]) -> dict[str, MpsRecord]:
    """Daemon id -> record, for every daemon one of ``claims`` uses (its own or a GPU's)."""
    out: dict[str, MpsRecord] = {}
    for claim in claims:
        if claim.mps is not None:
            out[claim.mps.daemon] = claim.mps
        for device in claim.devices:
            if device.mps is not None:
                out[device.mps.daemon] = device.mps
    return out


def daemons_to_stop(
    released: Iterable[ClaimRecord], remaining: Iterable[ClaimRecord]
) -> list[MpsRecord]:
    """Daemons the released claims used that no remaining claim uses (the refcount at zero)."""
    kept = daemons_in_use(remaining)
    return [rec for daemon, rec in sorted(daemons_in_use(released).items()) if daemon not in kept]


class Mps(Strategy):
    """``strategy: MPS``: the claim's own control daemon, serving the devices configured so."""

    def daemons(self, devices: Sequence[AllocatedDevice]) -> set[str]:
        """The claim's own daemon, if a device asks for MPS."""
        return {"claim"} if any(d.share is None and d.strategy == "MPS" for d in devices) else set()

    def annotate(
        self,
        claim_uid: str,
        devices: Sequence[AllocatedDevice],
        record: ClaimRecord,
        mps_root: Path,
    ) -> None:
        """Record the claim's daemon with the limits of its devices' MPS configs."""
        own = [
            (devices.index(device), rec.uuid, mps_config(device.config))
            for device, rec in sharable(devices, record)
            if device.share is None and device.strategy == "MPS"
        ]
        if own:
            uuids = [uuid for _, uuid, _ in own if uuid]
            daemon = daemon_for(mps_root, claim_daemon_id(claim_uid), uuids, config_limits(own))
            record.mps = to_record(daemon)
