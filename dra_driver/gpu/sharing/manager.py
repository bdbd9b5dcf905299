"""Sharing steps of prepare and unprepare: what to record, then what to apply or undo.

:class:`DeviceState` calls this in three places. Before the checkpoint records a claim as
PrepareStarted, :meth:`SharingManager.annotate` writes into the claim's records everything the
hardware steps will do (time-slice, MPS daemons with their directories and limits), so a crash
at any later point leaves enough to undo them. After the claim's MIG devices exist,
:meth:`~SharingManager.apply` takes the steps. At unprepare and at start-up,
:meth:`~SharingManager.release` and :meth:`~SharingManager.sweep` undo what no prepared claim
uses any more: the MPS daemons are reference-counted by the claims whose records name them.

Without a backend (unit tests of the CDI spec) the records and directories are the same and
no hardware step is taken.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import structlog

from dra_driver import faults
from dra_driver.gpu.config import MpsConfig
from dra_driver.gpu.container.claim_spec import AllocatedDevice
from dra_driver.gpu.sharing import mps as mpsplan
from dra_driver.gpu.sharing.backend import SharingBackend, SharingError
from dra_driver.gpu.sharing.shared_gpus import Share, ShareError, check_fits, memory_in_use
from dra_driver.gpu.sharing.timeslicing import to_reset
from dra_driver.gpu.state.checkpoint import ClaimRecord, DeviceRecord, MpsRecord

log = structlog.get_logger(__name__)


def _strategy(device: AllocatedDevice) -> str | None:
    sharing = device.config.sharing if device.config else None
    return sharing.strategy if sharing else None


def _mps_config(device: AllocatedDevice) -> MpsConfig | None:
    sharing = device.config.sharing if device.config else None
    return sharing.mps_config if sharing else None


class SharingManager:
    """Records, applies and undoes the sharing of the node's prepared claims."""

    def __init__(self, backend: SharingBackend | None, mps_root: Path) -> None:
        self.backend = backend
        self.mps_root = mps_root

    # --- before the checkpoint -----------------------------------------------------------

    def check(
        self,
        claim: str,
        devices: Sequence[AllocatedDevice],
        prepared: Iterable[ClaimRecord],
    ) -> None:
        """Refuse what cannot work: sharing settings on a share, a claim needing two MPS
        daemons, or shares beyond a GPU's memory (``prepared``: the other claims)."""
        prepared = list(prepared)
        daemons: set[str] = set()
        added: dict[str, int] = {}
        for device in devices:
            if device.share is not None:
                if _strategy(device) is not None:
                    raise ShareError(
                        f"claim {claim}: device {device.device_name} is a share of a shared GPU, "
                        f"which MPS already shares; remove the {_strategy(device)} config"
                    )
                daemons.add(mpsplan.gpu_daemon_id(device.gpu.minor))
                uuid = device.gpu.uuid
                in_use = memory_in_use(prepared, uuid) + added.get(uuid, 0)
                try:
                    check_fits(device.share, in_use, device.gpu.memory_bytes, gpu=uuid)
                except ShareError as exc:
                    raise ShareError(f"claim {claim}: device {device.device_name}: {exc}") from None
                added[uuid] = added.get(uuid, 0) + device.share.memory_bytes
            elif _strategy(device) == "MPS":
                daemons.add("claim")
        if len(daemons) > 1:
            raise ShareError(
                f"claim {claim}: its devices would need {len(daemons)} MPS control daemons (shares "
                "of different shared GPUs, or a share and an MPS-configured device), but a "
                "container talks to one; split the claim"
            )

    def annotate(
        self, claim_uid: str, devices: Sequence[AllocatedDevice], records: Sequence[DeviceRecord]
    ) -> MpsRecord | None:
        """Fill the records with the steps to take; returns the claim's own daemon, if any."""
        own: list[tuple[str, MpsConfig | None]] = []
        for device, rec in zip(devices, records, strict=True):
            if rec.sharing == "admin":
                continue
            if device.share is not None:
                rec.consumed_capacity = {
                    "memory": str(device.share.memory_bytes),
                    **(
                        {"compute": str(device.share.compute_percent)}
                        if device.share.compute_percent is not None
                        else {}
                    ),
                }
                daemon = mpsplan.daemon_for(
                    self.mps_root, mpsplan.gpu_daemon_id(device.gpu.minor), [device.gpu.uuid]
                )
                rec.mps = mpsplan.to_record(daemon)
            elif _strategy(device) == "TimeSlicing" and device.type == "gpu":
                sharing = device.config.sharing if device.config else None
                slicing = getattr(sharing, "time_slicing_config", None)
                rec.timeslice = slicing.interval if slicing else "Default"
            elif _strategy(device) == "MPS":
                own.append((rec.uuid, _mps_config(device)))
        if not own:
            return None
        daemon = mpsplan.daemon_for(
            self.mps_root,
            mpsplan.claim_daemon_id(claim_uid),
            [uuid for uuid, _ in own if uuid],
            mpsplan.config_limits(own),
        )
        return mpsplan.to_record(daemon)

    # --- prepare --------------------------------------------------------------------------

    def apply(self, claim: str, record: ClaimRecord) -> None:
        """Take the recorded steps (idempotent: a repeated prepare repeats nothing harmful).

        ``record`` already has the UUIDs of MIG devices created for the claim.
        """
        for rec in record.devices:
            if rec.timeslice is not None and self.backend is not None:
                self.backend.set_timeslice(rec.uuid, rec.timeslice)
                faults.point("prepare.timeslice-set")
                log.info("time-slice applied", claim=claim, uuid=rec.uuid, interval=rec.timeslice)
        if record.mps is not None:
            # MIG devices created on demand get their UUIDs only now.
            record.mps.uuids = [d.uuid for d in record.devices if d.sharing == "MPS" and d.uuid]
            self._start(claim, record.mps)
        for rec in record.devices:
            if rec.mps is not None:
                self._start(claim, rec.mps)

    def _start(self, claim: str, daemon: MpsRecord) -> None:
        spec = mpsplan.from_record(daemon)
        for directory in (spec.pipe_dir, spec.log_dir, spec.shm_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if self.backend is None:
            return
        running = self.backend.mps_running(spec.daemon_id, spec.pipe_dir)
        self.backend.start_mps(spec)
        faults.point("prepare.mps-started")
        if not running:
            log.info("MPS daemon started", claim=claim, daemon=spec.daemon_id, uuids=daemon.uuids)

    # --- unprepare and start-up -----------------------------------------------------------

    def release(self, released: Iterable[ClaimRecord], remaining: Iterable[ClaimRecord]) -> None:
        """Stop daemons and reset time-slices the released claims used and nothing else does.

        Raises :class:`SharingError` with the first failure after trying every step.
        """
        released, remaining = list(released), list(remaining)
        errors: list[str] = []
        for daemon in mpsplan.daemons_to_stop(released, remaining):
            try:
                if self.backend is not None:
                    self.backend.stop_mps(daemon.daemon, Path(daemon.pipe_dir))
                    log.info("MPS daemon stopped", daemon=daemon.daemon)
                shutil.rmtree(self.mps_root / daemon.daemon, ignore_errors=True)
            except SharingError as exc:
                errors.append(str(exc))
        if self.backend is not None:
            for uuid in to_reset(released, remaining):
                try:
                    self.backend.reset_timeslice(uuid)
                    log.info("time-slice reset", uuid=uuid)
                except SharingError as exc:
                    errors.append(str(exc))
        if errors:
            raise SharingError(errors[0])

    def sweep(self, claims: Iterable[ClaimRecord]) -> None:
        """Start-up: stop daemons no prepared claim uses; restart used ones that died."""
        if self.backend is None:
            return
        in_use = mpsplan.daemons_in_use(claims)
        for daemon_id in self.backend.list_mps():
            if daemon_id in in_use:
                continue
            try:
                self.backend.stop_mps(daemon_id, self.mps_root / daemon_id / "pipe")
                shutil.rmtree(self.mps_root / daemon_id, ignore_errors=True)
                log.info("stopped MPS daemon no prepared claim uses", daemon=daemon_id)
            except SharingError as exc:
                log.error("stopping MPS daemon failed", daemon=daemon_id, error=str(exc))
        for daemon_id, record in in_use.items():
            if self.backend.mps_running(daemon_id, Path(record.pipe_dir)):
                continue
            try:
                self.backend.start_mps(mpsplan.from_record(record))
                log.warning("restarted MPS daemon of prepared claims", daemon=daemon_id)
            except SharingError as exc:
                log.error("restarting MPS daemon failed", daemon=daemon_id, error=str(exc))

    def pipe_and_shm(self, record: ClaimRecord) -> tuple[str, str] | None:
        """The MPS pipe and shm directories the claim's containers get, if it uses MPS."""
        daemon = record.mps or next((d.mps for d in record.devices if d.mps), None)
        return (daemon.pipe_dir, daemon.shm_dir) if daemon else None


def with_share(device: AllocatedDevice, share: Share | None) -> AllocatedDevice:
    """``device`` as a share of its GPU."""
    return dataclasses.replace(device, share=share)
