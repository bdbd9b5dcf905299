"""The node's prepared claims: the prepare and unprepare transactions.

Planning and conflict checks are pure (:mod:`.planner`); around them this module keeps the
checkpoint (:mod:`.checkpoint`) and takes the steps in order: MIG devices (:mod:`.carving`),
sharing (:mod:`dra_driver.gpu.sharing.manager`), the CDI spec. Start-up is :mod:`.recovery`.

All methods block (fsync) and are meant to run in a worker thread. Calls are serialised by the
kubelet plugin's node-wide lock file, which start-up takes too: two agents of one node (a
surge update) never interleave, and each re-reads the checkpoint the other may have written.
The internal lock only guards against misuse within the process.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from dra_driver import faults
from dra_driver.cdi.spec import NO_EDITS, ContainerEdits
from dra_driver.cdi.writer import remove, spec_file_name, sweep_temp_files, write_atomic
from dra_driver.errors import PrepareError
from dra_driver.gpu.config import OWN_API, ConfigKinds
from dra_driver.gpu.container import devnodes
from dra_driver.gpu.container.claim_spec import (
    CDI_CLASS,
    CDI_VENDOR,
    build_claim_spec,
    uses_mps,
)
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.mig.backend import MigBackend, MigError
from dra_driver.gpu.publish.catalog import PLACEMENTS, build_catalog
from dra_driver.gpu.sharing.backend import SharingBackend, SharingError
from dra_driver.gpu.sharing.manager import SharingManager
from dra_driver.gpu.state import CHECKPOINT_FILE, checkpoint, recovery
from dra_driver.gpu.state.carving import Carver
from dra_driver.gpu.state.checkpoint import (
    ClaimRecord,
    ClaimState,
    DeviceRecord,
)
from dra_driver.gpu.state.evidence import NO_EVIDENCE, Evidence, read_specs
from dra_driver.gpu.state.planner import (
    CarveError,
    ClaimError,
    Plan,
    check_free,
    check_gpu_free,
    check_within,
    device_records,
    holders,
    is_share,
    plan_claim,
    prepared_devices,
    shared_devices,
)
from dra_driver.kubeletplugin.interfaces import (
    ClaimRef,
    ClaimToPrepare,
    PrepareResult,
    UnprepareResult,
)
from dra_driver.kubeletplugin.lock import hold_file_lock
from dra_driver.kubeletplugin.sockets import LOCK_FILE_NAME
from dra_driver.kubeletplugin.uid import valid_uid

log = structlog.get_logger(__name__)

SPEC_PREFIX = spec_file_name(CDI_VENDOR, CDI_CLASS, "").removesuffix(".json")


class DeviceState:
    """Prepared claims of one node, kept in a checkpoint and in one CDI spec per claim."""

    def __init__(
        self,
        *,
        inventory: Inventory,
        driver_name: str,
        node_name: str,
        cdi_root: Path,
        state_dir: Path,
        boot_id: str,
        common_edits: ContainerEdits = NO_EDITS,
        mig_minors: Mapping[str, int] | None = None,
        device_nodes: devnodes.Resolver = devnodes.plain,
        mig: MigBackend | None = None,
        sharing: SharingBackend | None = None,
        shared_gpus: frozenset[str] = frozenset(),
        evidence: Evidence = NO_EVIDENCE,
        config_apis: ConfigKinds = OWN_API,
        mig_layout: str = PLACEMENTS,
    ) -> None:
        """``mig`` turns on dynamic MIG: MIG devices are created when a claim for one of the
        published placements is prepared and destroyed when it is unprepared. ``sharing``
        applies time-slicing and runs MPS daemons (without it, only the CDI spec carries
        the sharing settings). ``shared_gpus``: UUIDs of GPUs published as shared GPUs, whose
        allocations are shares (several claims, each limited by what the scheduler counted).
        ``evidence``: the claims the API server says hold devices of the node (its ``specs``
        are read from ``cdi_root`` here); without the API's word start-up destroys nothing
        that no checkpoint record names. ``config_apis``: the opaque config APIs accepted
        (the NVIDIA driver's too in its compatibility mode). ``mig_layout``: how dynamic MIG
        is published (:data:`~dra_driver.gpu.publish.catalog.MIG_LAYOUTS`)."""
        self.driver_name = driver_name
        self.node_name = node_name
        self.cdi_root = cdi_root
        self.state_dir = state_dir
        self._common = common_edits
        self._mig_minors = mig_minors
        self._device_nodes = device_nodes
        self._config_apis = config_apis
        self._shared_gpus = shared_gpus
        self._lock = threading.Lock()
        self._inventory = inventory
        self._dynamic = mig is not None
        self._catalog = build_catalog(
            inventory, dynamic=mig is not None, shared=shared_gpus, layout=mig_layout
        )
        self._sharing = SharingManager(sharing, state_dir / "mps")
        self._carver = Carver(mig, {g.uuid: g for g in inventory.gpus})
        self._file = checkpoint.CheckpointFile(state_dir / CHECKPOINT_FILE, boot_id)
        state_dir.mkdir(parents=True, exist_ok=True)
        with hold_file_lock(state_dir / LOCK_FILE_NAME):
            # Under the node lock: a second agent's write in flight is never swept.
            sweep_temp_files(cdi_root, prefix=SPEC_PREFIX)
            sweep_temp_files(state_dir)
            start = recovery.start(
                self._file,
                evidence.with_specs(read_specs(cdi_root, SPEC_PREFIX)),
                node_name=node_name,
                catalog=self._catalog,
                carver=self._carver,
                sharing=self._sharing,
                remove_artifacts=self._remove_artifacts,
            )
        self._data = start.data
        #: The corruption start-up found, and what it kept for want of proof it is unused.
        self.corrupt, self.kept = start.corrupt, start.kept

    def stop_sharing_by_memory(self) -> None:
        """Treat every GPU as a whole GPU from now on: the API server lacks consumable
        capacity, so the scheduler allocates the formerly shared GPUs whole, without shares.
        Shares prepared before stay recorded and are unprepared from their records."""
        with self._lock:
            self._catalog = build_catalog(self._inventory, dynamic=self._dynamic)

    # --- paths ----------------------------------------------------------------------------

    def spec_path(self, claim_uid: str) -> Path:
        """Where the claim's CDI spec lives."""
        return self.cdi_root / spec_file_name(CDI_VENDOR, CDI_CLASS, claim_uid)

    def mps_dir(self, claim_uid: str) -> Path:
        """Host directory shared with the claim's containers as the MPS pipe directory."""
        return self.state_dir / "mps" / claim_uid

    def _remove_artifacts(self, claim_uid: str, sync_dir: bool = True) -> None:
        if not valid_uid(claim_uid):
            # Every entrance refuses such a UID; this is the last line before an rmtree of a
            # path built from it ("..": the state directory).
            log.error("not removing the artifacts of a claim UID that is none", claim_uid=claim_uid)
            return
        remove(self.spec_path(claim_uid), sync_dir=sync_dir)
        shutil.rmtree(self.mps_dir(claim_uid), ignore_errors=True)

    # --- queries --------------------------------------------------------------------------

    def prepared_claims(self) -> dict[str, ClaimRecord]:
        """A copy of the current records, by claim UID."""
        with self._lock:
            return {uid: rec.model_copy(deep=True) for uid, rec in self._data.claims.items()}

    def record(self, claim_uid: str) -> ClaimRecord | None:
        """A copy of one claim's record."""
        with self._lock:
            rec = self._data.claims.get(claim_uid)
            return rec.model_copy(deep=True) if rec else None

    def device_ids(self, claim_uid: str) -> list[tuple[str, str, str | None]]:
        """The claim's recorded devices: (device name, UUID, shareID) each; none if unknown."""
        with self._lock:
            rec = self._data.claims.get(claim_uid)
            return [(d.device_name, d.uuid, d.share_id) for d in rec.devices] if rec else []

    def quick_prepare(self, claims: Sequence[ClaimToPrepare]) -> bool:
        """Whether preparing ``claims`` only writes files (their CDI specs, the journal): no
        MIG device to create (dynamic MIG is off), no sharing step (no config, no shared
        GPUs). Such a batch takes about a millisecond."""
        return (
            not self._carver.enabled
            and not self._shared_gpus
            and all(not claim.config for claim in claims)
        )

    def quick_unprepare(self, refs: Sequence[ClaimRef]) -> bool:
        """Whether unpreparing ``refs`` only removes files: each is recorded, and its record
        names no MIG device and no sharing step."""
        claims = self._data.claims
        for ref in refs:
            rec = claims.get(ref.uid)
            if rec is None or not only_files(rec) or any(d.mig is not None for d in rec.devices):
                return False
        return True

    def prepared_before_binding(self) -> dict[str, tuple[ClaimRef, frozenset[str]]]:
        """Claims the agent prepared before binding: UID -> (claim, its device names)."""
        with self._lock:
            self._refresh()
            return {
                uid: (
                    ClaimRef(rec.namespace, rec.name, uid),
                    frozenset(d.device_name for d in rec.devices),
                )
                for uid, rec in self._data.claims.items()
                if rec.before_binding
            }

    def prepared_count(self) -> int:
        """How many claims are prepared (or being prepared)."""
        return len(self._data.claims)

    # --- the checkpoint under the node lock --------------------------------------------

    def _refresh(self) -> None:
        """Take up what another agent of the node wrote since this one last did (a surge
        update runs two); an unchanged file is not read again."""
        try:
            data = self._file.reread()
        except checkpoint.CorruptCheckpoint as exc:
            # Keep what this agent knows, with what another agent journaled since, and write
            # it again at once: with the file moved aside, the next read (another agent's,
            # or this one's after a failed write) would take the journal alone for all the
            # node's records.
            log.error("checkpoint corrupt: keeping the records in memory", reason=exc.reason)
            self._data = self._file.recovered(self._data)
            try:
                self._file.write(self._data)
            except OSError as err:
                log.error("writing the checkpoint again failed", error=str(err))
            return
        if data is not None:
            self._data = data

    def _record(self, claims: Mapping[str, str], out: dict[str, Any], what: str) -> bool:
        """Write the checkpoint (one journal batch). When that fails, ``claims`` (UID ->
        name) fail with a clear error, and the next call starts again from the file, which a
        failed write leaves as it was: the kubelet's retry then redoes what is not recorded."""
        try:
            self._file.write(self._data, changed=claims.keys())
        except OSError as exc:
            log.error(
                "writing the checkpoint failed", error=str(exc), claims=sorted(claims.values())
            )
            for uid, name in claims.items():
                out[uid] = ClaimError(f"claim {name}: cannot record {what}: {exc}")
            self._file.distrust()
            return False
        return True

    # --- prepare --------------------------------------------------------------------------

    def prepare(
        self, claims: Sequence[ClaimToPrepare], before_binding: bool = False
    ) -> dict[str, PrepareResult]:
        """Prepare a batch of claims; one result per claim UID, errors per claim.

        The checkpoint is written twice per batch, not per claim: once with every new claim
        marked PrepareStarted, once after their CDI specs exist. A claim is answered
        prepared only once the second write succeeded. A batch whose claims make nothing but
        their CDI specs (:func:`only_a_spec`) skips the first write. ``before_binding``: the agent
        prepares them for binding conditions, before any pod of theirs is bound; the records
        say so (see :meth:`prepared_before_binding`). An exception (a bug: a claim's failing
        steps are its own error) leaves memory as the file holds it (:meth:`_finish_all`).
        """
        with self._lock:
            self._refresh()
            out: dict[str, PrepareResult] = {}
            plans: list[Plan] = []
            planned: set[str] = set()
            # The records a claim prepared again had before (a crash, a lost spec): the MIG
            # devices they may name are the claim's own.
            earlier: dict[str, Sequence[DeviceRecord]] = {}
            held = holders(self._data.claims)
            shared = shared_devices(self._data.claims)
            others = [(u, d) for u, r in self._data.claims.items() for d in r.devices]
            for claim in claims:
                uid = claim.ref.uid
                if uid in out or uid in planned:
                    continue  # the same claim twice in a batch: its first entry decides
                if not valid_uid(uid):
                    out[uid] = ClaimError(f"claim {claim.ref}: invalid claim UID {uid!r}")
                    continue
                done = self._data.claims.get(uid)
                # Without its spec (an unprepare cut short after removing it), the claim is
                # prepared again: its devices exist, and "prepared" must mean usable.
                if (
                    done is not None
                    and done.state is ClaimState.PREPARE_COMPLETED
                    and self.spec_path(uid).exists()
                ):
                    try:
                        # A new pod of the claim: its MPS daemon must run (it may have died).
                        self._sharing.revive(str(claim.ref), done)
                    except (SharingError, OSError) as exc:
                        out[uid] = ClaimError(
                            f"claim {claim.ref}: its MPS daemon is not running and cannot be "
                            f"started again: {exc}"
                        )
                        continue
                    out[uid] = prepared_devices(done)
                    continue
                try:
                    plan = plan_claim(
                        claim, self._catalog, self.driver_name, self._config_apis, others
                    )
                    record = ClaimRecord(
                        state=ClaimState.PREPARE_STARTED,
                        namespace=claim.ref.namespace,
                        name=claim.ref.name,
                        devices=device_records(plan, self.node_name),
                        before_binding=True if before_binding else None,
                    )
                    records = record.devices
                    self._sharing.annotate(uid, plan.devices, record)
                    check_within(claim.ref, records, self._catalog)
                    check_free(claim.ref, records, held, shared, self._data.claims)
                    if self._carver.enabled:
                        check_gpu_free(claim.ref, records, others, self._catalog, self._data.claims)
                    self._sharing.check(
                        str(claim.ref),
                        plan.devices,
                        [r for u, r in self._data.claims.items() if u != uid],
                    )
                except PrepareError as exc:
                    log.warning(
                        "prepare refused",
                        claim=str(claim.ref),
                        claim_uid=uid,
                        pods=list(claim.pods),
                        error=str(exc),
                    )
                    out[uid] = exc
                    continue
                except (TypeError, ValueError, AttributeError, KeyError) as exc:
                    # A result or config of the wrong shape (nothing the API server accepts, but
                    # the claim comes from outside) fails this claim only, before anything of it
                    # is recorded; the other claims of the batch go ahead.
                    error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    log.warning(
                        "prepare refused: malformed allocation",
                        claim=str(claim.ref),
                        claim_uid=uid,
                        error=error,
                    )
                    out[uid] = ClaimError(f"claim {claim.ref}: malformed allocation: {error}")
                    continue
                held.update({r.device_name: uid for r in records if r.sharing != "admin"})
                shared.update(r.device_name for r in records if is_share(r))
                others += [(uid, r) for r in records]
                if done is not None:
                    earlier[uid] = done.devices
                self._data.claims[uid] = record
                plans.append(plan)
                planned.add(uid)
            batch = {plan.ref.uid: str(plan.ref) for plan in plans}
            # A batch that makes nothing but CDI specs is recorded once, when complete: a
            # crash before that leaves specs no record names, which the kubelet's retry
            # writes again and start-up removes once the API server proves their claims gone.
            only_specs = all(only_a_spec(p, self._data.claims[p.ref.uid]) for p in plans)
            if plans and (only_specs or self._record(batch, out, "that its prepare started")):
                if not only_specs:
                    faults.point("prepare.started-recorded")
                self._finish_all(plans, out, earlier)
                ready = {uid: name for uid, name in batch.items() if isinstance(out[uid], list)}
                if self._record(ready, out, "that it is prepared"):
                    faults.point("prepare.completed-recorded")
            return out

    def _finish_all(
        self,
        plans: Sequence[Plan],
        out: dict[str, PrepareResult],
        earlier: Mapping[str, Sequence[DeviceRecord]],
    ) -> None:
        """Finish each planned claim of the batch, its result into ``out``.

        Should anything escape a claim's steps (a bug: what a step is expected to raise is its
        claim's error), memory is put back to what the file holds before it propagates, never
        left ahead of it: a claim PrepareCompleted in memory but PrepareStarted in the file
        would be answered prepared to the kubelet's retry, and the next start-up would take
        it apart under its running pod.
        """
        try:
            for plan in plans:
                out[plan.ref.uid] = self._finish(plan, earlier.get(plan.ref.uid, ()))
        except BaseException:
            # Memory goes back to the file, not the file forward to memory: the batch's first
            # write recorded each claim PrepareStarted (a batch of plain claims: nothing),
            # what a crash between the batch's two writes leaves, which is safe already. The
            # records name what the finished claims made; none was answered prepared, so the
            # kubelet's retry prepares them again (every step is idempotent), an unprepare or
            # a restart takes them apart. Recording them instead would be a write whose cause
            # of failure is unknown (perhaps the very disk), needing proof of each claim's
            # artifacts; undoing them, more steps that can fail. So: none stays completed in
            # memory (read without the file: prepared_count, device_ids), and the next call
            # reads the file again (also the records an undo dropped from memory).
            for plan in plans:
                record = self._data.claims.get(plan.ref.uid)
                if record is not None and record.state is ClaimState.PREPARE_COMPLETED:
                    record.state = ClaimState.PREPARE_STARTED
            self._file.distrust()
            raise

    def _finish(self, plan: Plan, earlier: Sequence[DeviceRecord]) -> PrepareResult:
        """Create the claim's MIG devices (dynamic MIG), apply its sharing, then write its
        CDI spec. A step that fails undoes the claim and is its error alone. ``earlier``:
        the claim's records before this prepare, whose MIG devices it may use again."""
        uid = plan.ref.uid
        records = list(self._data.claims[uid].devices)
        try:
            adoptable = [*self._other_records(uid), *earlier]
            plan = self._carver.carve(plan, self._data.claims[uid], adoptable)
        except MigError as exc:
            self._undo_carve(plan.ref, records)
            log.error(
                "creating MIG device failed", claim=str(plan.ref), claim_uid=uid, error=str(exc)
            )
            gpus = tuple(dict.fromkeys(s.gpu.uuid for s in plan.carve if s is not None))
            return CarveError(f"claim {plan.ref}: {exc}", gpus)
        record = self._data.claims[uid]
        try:
            self._sharing.apply(str(plan.ref), record)
        except (SharingError, OSError) as exc:
            # An OSError too (a full disk under a daemon's directories or the backend's
            # files): escaping, it would end the batch between its two writes.
            log.error("applying sharing failed", claim=str(plan.ref), claim_uid=uid, error=str(exc))
            self._undo_sharing(plan.ref, record)
            self._undo_carve(plan.ref, records)
            if isinstance(exc, SharingError):
                return ClaimError(f"claim {plan.ref}: {exc}")
            return ClaimError(
                f"claim {plan.ref}: cannot apply sharing on the node: {exc} (a fault of the "
                "node, not of the claim: the kubelet retries once an administrator fixes it)"
            )
        result = self._write_spec(plan)
        if isinstance(result, Exception):
            self._undo_sharing(plan.ref, record)
            self._undo_carve(plan.ref, records)
        return result

    def _undo_sharing(self, ref: ClaimRef, record: ClaimRecord) -> None:
        """Best effort: stop what a failed prepare started (a restart sweeps the rest)."""
        others = [r for u, r in self._data.claims.items() if u != ref.uid]
        try:
            self._sharing.release([record], others)
        except (SharingError, OSError) as exc:
            # An OSError too: the disk that failed the step may fail its undo.
            log.error("undoing sharing failed", claim=str(ref), claim_uid=ref.uid, error=str(exc))

    def _undo_carve(self, ref: ClaimRef, records: Sequence[DeviceRecord]) -> None:
        """Forget the claim and destroy what its failed prepare created (MIG devices other
        claims also use stay)."""
        self._data.claims.pop(ref.uid, None)
        self._carver.undo(ref, records, self._other_records(ref.uid))

    def _other_records(self, uid: str) -> list[DeviceRecord]:
        return [d for u, r in self._data.claims.items() if u != uid for d in r.devices]

    def _write_spec(self, plan: Plan) -> PrepareResult:
        uid = plan.ref.uid
        try:
            dirs = self._sharing.pipe_and_shm(self._data.claims[uid])
            if uses_mps(plan.devices) and dirs is not None:
                for directory in dirs:
                    Path(directory).mkdir(parents=True, exist_ok=True)
            spec = build_claim_spec(
                uid,
                plan.devices,
                common=self._common,
                mig_minors=self._mig_minors,
                mps_host_dir=dirs[0] if dirs else None,
                device_nodes=self._device_nodes,
                mps_shm_dir=dirs[1] if dirs else None,
            )
            # Not fsync'd: only a crash of the machine loses the page cache, and that reboots
            # the node, after which every claim is prepared again (see checkpoint.py).
            write_atomic(self.spec_path(uid), spec.to_json(), fault="cdi.before-rename", sync=False)
            faults.point("prepare.cdi-written")
        except OSError as exc:
            del self._data.claims[uid]
            with contextlib.suppress(OSError):
                self._remove_artifacts(uid)
            log.error("writing CDI spec failed", claim=str(plan.ref), claim_uid=uid, error=str(exc))
            return ClaimError(f"claim {plan.ref}: cannot write CDI spec: {exc}")
        record = self._data.claims[uid]
        record.state = ClaimState.PREPARE_COMPLETED
        log.info(
            "claim prepared",
            claim=str(plan.ref),
            claim_uid=uid,
            pods=list(plan.pods),
            devices=[d.device_name for d in record.devices],
            node=self.node_name,
        )
        return prepared_devices(record)

    # --- unprepare ------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        """Unprepare a batch; unknown claims succeed (the kubelet may repeat itself).

        The claims taken apart are recorded gone in one write at the end of the batch,
        whatever fails for the claims after them (an error result or an exception); when
        that write fails they are answered with its error, never unprepared.
        """
        with self._lock:
            self._refresh()
            out: dict[str, UnprepareResult] = {}
            changed: dict[str, str] = {}
            try:
                for ref in refs:
                    self._unprepare_one(ref, out, changed)
            finally:
                # A claim answered unprepared but still recorded PrepareCompleted would come
                # back at the next read of the file, its devices refused to every new claim,
                # and the kubelet, told it is unprepared, would never ask again.
                if changed and self._record(changed, out, "that it is unprepared"):
                    for uid, name in changed.items():
                        log.info("claim unprepared", claim=name, claim_uid=uid, node=self.node_name)
                    faults.point("unprepare.recorded")
            return out

    def _unprepare_one(
        self, ref: ClaimRef, out: dict[str, UnprepareResult], changed: dict[str, str]
    ) -> None:
        """Take one claim apart; its result goes to ``out``, and to ``changed`` once its
        record is dropped (the caller records that)."""
        if not valid_uid(ref.uid):
            out[ref.uid] = None  # never prepared: nothing can exist under that name
            return
        rec = self._data.claims.get(ref.uid)
        migs = [d.mig for d in rec.devices if d.mig is not None] if rec else []
        if rec is not None and migs and rec.state is not ClaimState.UNPREPARE_STARTED:
            # Recorded first: a restart finishes what this unprepare starts.
            before, rec.state = rec.state, ClaimState.UNPREPARE_STARTED
            if not self._record({ref.uid: str(ref)}, out, "that its unprepare started"):
                # Nothing of it is taken apart: it stays as it was (also in the batch's
                # final write), and the kubelet retries it.
                rec.state = before
                return
            faults.point("unprepare.started-recorded")
        if rec is not None:
            try:
                # Before the artifacts: a daemon is stopped through its pipe directory.
                others = [r for u, r in self._data.claims.items() if u != ref.uid]
                self._sharing.release([rec], others)
            except SharingError as exc:
                out[ref.uid] = ClaimError(f"claim {ref}: cannot undo sharing: {exc}")
                return
            faults.point("unprepare.sharing-released")
        try:
            self._remove_artifacts(ref.uid, sync_dir=False)
        except OSError as exc:
            out[ref.uid] = ClaimError(f"claim {ref}: cannot remove CDI spec: {exc}")
            return
        faults.point("unprepare.cdi-removed")
        try:
            for mig in migs:
                self._carver.destroy(mig, self._other_records(ref.uid))
        except MigError as exc:
            out[ref.uid] = ClaimError(f"claim {ref}: cannot destroy MIG device: {exc}")
            return
        if migs:
            faults.point("unprepare.mig-destroyed")
        if self._data.claims.pop(ref.uid, None) is not None:
            changed[ref.uid] = str(ref)
        out[ref.uid] = None


def only_a_spec(plan: Plan, record: ClaimRecord) -> bool:
    """Whether preparing the claim makes nothing but its CDI spec: no MIG device to create, no
    sharing step (time-slice, MPS daemon) to undo, and not prepared before binding (which the
    agent, not the kubelet, would have to retry). Such a claim needs no PrepareStarted record:
    all a crash can leave of it is a spec no record names."""
    return all(carve is None for carve in plan.carve) and only_files(record)


def only_files(record: ClaimRecord) -> bool:
    """Whether the record names nothing but files: no MPS daemon, no time-slice, no share,
    and not prepared before binding."""
    return (
        record.mps is None
        and not record.before_binding
        and all(
            d.sharing in (None, "admin") and d.mps is None and d.timeslice is None
            for d in record.devices
        )
    )
