"""Sharing steps of prepare and unprepare: what to record, then what to apply or undo.

:class:`DeviceState` calls this in three places. Before the checkpoint records a claim as
PrepareStarted, :meth:`SharingManager.annotate` has every strategy of
:data:`~dra_driver.gpu.sharing.registry.STRATEGIES` write into the claim's record what the
hardware steps will do (time-slice, MPS daemons with their directories and limits), so a crash
at any later point leaves enough to undo them. After the claim's MIG devices exist,
:meth:`~SharingManager.apply` takes the steps. At unprepare and at start-up,
:meth:`~SharingManager.release` and :meth:`~SharingManager.sweep` undo what no prepared claim
uses any more: the MPS daemons are reference-counted by the claims whose records name them.

Without a backend (unit tests of the CDI spec) the records and directories are the same and
no hardware step is taken.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import structlog

from dra_driver import faults
from dra_driver.gpu.allocation import AllocatedDevice
from dra_driver.gpu.sharing import mps as mpsplan
from dra_driver.gpu.sharing.backend import SharingBackend, SharingError
from dra_driver.gpu.sharing.registry import STRATEGIES
from dra_driver.gpu.sharing.shared_gpus import ShareError
from dra_driver.gpu.sharing.strategy import Strategy
from dra_driver.gpu.state.checkpoint import ClaimRecord, MpsRecord

log = structlog.get_logger(__name__)


class SharingManager:
    """Records, applies and undoes the sharing of the node's prepared claims."""

    def __init__(
        self,
        backend: SharingBackend | None,
        mps_root: Path,
        strategies: Sequence[Strategy] = STRATEGIES,
    ) -> None:
        self.backend = backend
        self.mps_root = mps_root
        self.strategies = tuple(strategies)

    # --- before the checkpoint -----------------------------------------------------------

    def check(
        self,
        claim: str,
        devices: Sequence[AllocatedDevice],
        prepared: Iterable[ClaimRecord],
    ) -> None:
        """Refuse what a strategy cannot serve, or a claim needing two MPS daemons
        (``prepared``: the other claims)."""
        prepared = list(prepared)
        for strategy in self.strategies:
            strategy.check(claim, devices, prepared)
        daemons = set().union(*(s.daemons(devices) for s in self.strategies))
        if len(daemons) > 1:
            raise ShareError(
                f"claim {claim}: its devices would need {len(daemons)} MPS control daemons (shares "
                "of different shared GPUs, or a share and an MPS-configured device), but a "
                "container talks to one; split the claim"
            )

    def annotate(
        self, claim_uid: str, devices: Sequence[AllocatedDevice], record: ClaimRecord
    ) -> None:
        """Fill the claim's record with the steps to take."""
        for strategy in self.strategies:
            strategy.annotate(claim_uid, devices, record, self.mps_root)

    # --- prepare --------------------------------------------------------------------------

    def apply(self, claim: str, record: ClaimRecord) -> None:
        """Take the recorded steps (idempotent: a repeated prepare repeats nothing harmful).

        ``record`` already has the UUIDs of MIG devices created for the claim.
        """
        if self.backend is not None:
            for strategy in self.strategies:
                strategy.apply(claim, record, self.backend)
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
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                # A SharingError fails this claim alone; an OSError would end its batch.
                raise SharingError(
                    f"MPS daemon {spec.daemon_id}: cannot create {directory}: {exc.strerror or exc}"
                ) from None
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
            except (SharingError, OSError) as exc:
                # An OSError too (the daemon's record on a full disk): the claim's unprepare
                # fails alone and the kubelet retries it.
                errors.append(str(exc))
        if self.backend is not None:
            for strategy in reversed(self.strategies):
                errors += strategy.release(released, remaining, self.backend)
        if errors:
            raise SharingError(errors[0])

    def sweep(self, claims: Iterable[ClaimRecord], keep: Collection[str] = ()) -> None:
        """Start-up: stop daemons no prepared claim uses; restart used ones that died.

        ``keep``: daemons some claim's CDI spec mounts into containers; in use even when no
        record names them (a rebuilt checkpoint has no daemon records), so never stopped."""
        if self.backend is None:
            return
        in_use = mpsplan.daemons_in_use(claims)
        for daemon_id in self.backend.list_mps():
            if daemon_id in in_use:
                continue
            if daemon_id in keep:
                log.warning(
                    "kept MPS daemon a CDI spec mounts: no record names it", daemon=daemon_id
                )
                continue
            try:
                self.backend.stop_mps(daemon_id, self.mps_root / daemon_id / "pipe")
                shutil.rmtree(self.mps_root / daemon_id, ignore_errors=True)
                log.info("stopped MPS daemon no prepared claim uses", daemon=daemon_id)
            except (SharingError, OSError) as exc:
                log.error("stopping MPS daemon failed", daemon=daemon_id, error=str(exc))
        for daemon_id, record in in_use.items():
            if self.backend.mps_running(daemon_id, Path(record.pipe_dir)):
                continue
            try:
                self.backend.start_mps(mpsplan.from_record(record))
                log.warning("restarted MPS daemon of prepared claims", daemon=daemon_id)
            except (SharingError, OSError) as exc:
                log.error("restarting MPS daemon failed", daemon=daemon_id, error=str(exc))

    def revive(self, claim: str, record: ClaimRecord) -> None:
        """Start again the daemons of a prepared claim that died (a crash, the OOM killer):
        the kubelet prepares the claim again for each new pod, which would hang on a dead
        daemon's pipe. Raises :class:`SharingError`."""
        if self.backend is None:
            return
        for daemon_id, daemon in mpsplan.daemons_in_use([record]).items():
            if not self.backend.mps_running(daemon_id, Path(daemon.pipe_dir)):
                self.backend.start_mps(mpsplan.from_record(daemon))
                log.warning(
                    "restarted MPS daemon of a prepared claim", claim=claim, daemon=daemon_id
                )

    def pipe_and_shm(self, record: ClaimRecord) -> tuple[str, str] | None:
        """The MPS pipe and shm directories the claim's containers get, if it uses MPS."""
        daemon = record.mps or next((d.mps for d in record.devices if d.mps), None)
        return (daemon.pipe_dir, daemon.shm_dir) if daemon else None
