"""The node's prepared claims: prepare, unprepare, the checkpoint and the CDI specs.

All methods block (fsync) and are meant to run in a worker thread. Calls are serialised by the
kubelet plugin's node-wide lock; the internal lock only guards against misuse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_driver import faults
from dra_driver.cdi.spec import NO_EDITS, ContainerEdits
from dra_driver.cdi.writer import fsync_dir, remove, spec_file_name, write_atomic
from dra_driver.errors import PrepareError
from dra_driver.gpu import checkpoint, devnodes
from dra_driver.gpu.checkpoint import (
    CheckpointData,
    ClaimRecord,
    ClaimState,
    DeviceRecord,
    MigRecord,
)
from dra_driver.gpu.claim_spec import (
    CDI_CLASS,
    CDI_VENDOR,
    AllocatedDevice,
    build_claim_spec,
    cdi_device_id,
    uses_mps,
)
from dra_driver.gpu.config import ConfigError, parse_allocation_config, resolve_config
from dra_driver.gpu.devices import devices_for_gpu, gpu_device_name
from dra_driver.gpu.inventory import Gpu, Inventory, MigDevice, Placement
from dra_driver.gpu.mig import MigBackend, MigError, overlaps
from dra_driver.gpu.partitions import PlacementSpec, placement_index
from dra_driver.gpu.shares import ShareError, share_of
from dra_driver.gpu.sharing import SharingBackend, SharingError
from dra_driver.gpu.sharing_manager import SharingManager, with_share
from dra_driver.kubeletplugin.interfaces import (
    ClaimRef,
    ClaimToPrepare,
    PreparedDevice,
    PrepareResult,
    UnprepareResult,
)

log = structlog.get_logger(__name__)

CHECKPOINT_FILE = "checkpoint.json"


class ClaimError(PrepareError):
    """A claim cannot be prepared; the message tells the user what to fix."""


@dataclass(frozen=True)
class _Plan:
    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    results: tuple[dict[str, Any], ...]
    pods: tuple[str, ...] = ()
    # Dynamic MIG: the placement to create for each device (None: the device exists).
    carve: tuple[PlacementSpec | None, ...] = ()


# A device's footprint on its GPU: the GPU's UUID and the placement it takes (None: all of it).
_Footprint = tuple[str, Placement | None]


def _device_index(inventory: Inventory) -> dict[str, tuple[Gpu, MigDevice | None]]:
    """Published device name -> the GPU (and MIG device) behind it."""
    index: dict[str, tuple[Gpu, MigDevice | None]] = {}
    for gpu in inventory.gpus:
        devices = devices_for_gpu(gpu, inventory)
        migs: Iterable[MigDevice | None] = gpu.mig_devices if gpu.mig_enabled else [None]
        for device, mig in zip(devices, migs, strict=True):
            index[device["name"]] = (gpu, mig)
    return index


def _usable_uid(uid: str) -> bool:
    """Whether a claim UID can name files: the API server's UIDs are UUIDs, and a UID with a
    path separator or a NUL (only a broken or hostile caller sends one) must never reach a
    path, where ``..`` would point outside the driver's directories."""
    return bool(uid) and "/" not in uid and "\x00" not in uid and uid not in (".", "..")


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
    ) -> None:
        """``mig`` turns on dynamic MIG: MIG devices are created when a claim for one of the
        published placements is prepared and destroyed when it is unprepared. ``sharing``
        applies time-slicing and runs MPS daemons (without it, only the CDI spec carries
        the sharing settings). ``shared_gpus``: UUIDs of GPUs published as shared GPUs, whose
        allocations are shares (several claims, each limited by what the scheduler counted)."""
        self.driver_name = driver_name
        self.node_name = node_name
        self.cdi_root = cdi_root
        self.state_dir = state_dir
        self._common = common_edits
        self._mig_minors = mig_minors
        self._device_nodes = device_nodes
        self._lock = threading.Lock()
        self._devices = _device_index(inventory)
        self._mig = mig
        self._sharing = SharingManager(sharing, state_dir / "mps")
        self._shared_gpus = shared_gpus
        self._gpus = {g.uuid: g for g in inventory.gpus}
        self._placements = placement_index(inventory) if mig is not None else {}
        if mig is not None:
            # A MIG-capable GPU is published whole as well as in placements.
            for gpu in inventory.gpus:
                if gpu.mig.capable:
                    self._devices[gpu_device_name(gpu)] = (gpu, None)
        self._path = state_dir / CHECKPOINT_FILE
        self.corrupt: checkpoint.CorruptCheckpoint | None = None
        state_dir.mkdir(parents=True, exist_ok=True)
        try:
            data = checkpoint.load(self._path, boot_id)
        except checkpoint.CorruptCheckpoint as exc:
            self.corrupt = exc
            log.error(
                "checkpoint corrupt", reason=exc.reason, moved_to=str(exc.moved_to), node=node_name
            )
            data = CheckpointData(boot_id=boot_id)
        self._data = self._recover(data, boot_id)

    # --- start-up -------------------------------------------------------------------------

    def _recover(self, data: CheckpointData, boot_id: str) -> CheckpointData:
        """Drop what a reboot made stale and undo prepares a crash interrupted."""
        stale: list[str] = []
        if data.boot_id != boot_id:
            stale = list(data.claims)
            log.info(
                "node rebooted: dropping prepared claims", count=len(stale), node=self.node_name
            )
        else:
            stale = [
                uid
                for uid, rec in data.claims.items()
                if rec.state is not ClaimState.PREPARE_COMPLETED
            ]
        dropped = [data.claims.pop(uid) for uid in stale]
        try:
            # Daemons first: their pipe directories go with the claims' artifacts.
            self._sharing.release(dropped, data.claims.values())
        except SharingError as exc:
            log.error("undoing sharing of dropped claims failed", error=str(exc))
        self._sharing.sweep(data.claims.values())
        for uid, rec in zip(stale, dropped, strict=True):
            self._remove_artifacts(uid)
            # An interrupted unprepare is finished, an interrupted prepare undone: either way
            # the claim goes, and its MIG devices with it (see _destroy_orphans).
            log.info(
                "finished interrupted unprepare"
                if rec.state is ClaimState.UNPREPARE_STARTED
                else "undid interrupted prepare",
                claim=f"{rec.namespace}/{rec.name}",
                claim_uid=uid,
            )
        data.boot_id = boot_id
        if stale or not self._path.exists():
            checkpoint.save(self._path, data)
        if self._mig is not None:
            self._destroy_orphans(data)
        return data

    def _destroy_orphans(self, data: CheckpointData) -> None:
        """Destroy MIG devices no prepared claim uses (dynamic MIG owns the GPUs' layout).

        Covers instances left by a crash mid-prepare (their claim was just dropped) and
        MIG devices made before the driver started; a claim's devices are recognised by the
        placement recorded for them, or by the device name (claims prepared statically).
        """
        assert self._mig is not None
        kept_names = {d.device_name for rec in data.claims.values() for d in rec.devices}
        kept = {
            (d.mig.gpu_uuid, d.mig.profile_id, d.mig.start)
            for rec in data.claims.values()
            for d in rec.devices
            if d.mig is not None
        }
        for gpu in self._gpus.values():
            if not gpu.mig.capable:
                continue
            for inst in self._mig.list(gpu):
                spec = next(
                    (
                        s
                        for s in self._placements.values()
                        if s.gpu.uuid == gpu.uuid
                        and s.profile.profile_id == inst.profile_id
                        and s.placement.start == inst.placement.start
                    ),
                    None,
                )
                name = spec.device_name if spec else ""
                if (gpu.uuid, inst.profile_id, inst.placement.start) in kept or name in kept_names:
                    continue
                self._mig.destroy(gpu, inst.gpu_instance_id)
                log.info(
                    "destroyed MIG device no claim uses",
                    gpu=gpu.uuid,
                    device=name or f"gi{inst.gpu_instance_id}",
                    uuid=inst.device.uuid if inst.device else None,
                )

    # --- paths ----------------------------------------------------------------------------

    def spec_path(self, claim_uid: str) -> Path:
        """Where the claim's CDI spec lives."""
        return self.cdi_root / spec_file_name(CDI_VENDOR, CDI_CLASS, claim_uid)

    def mps_dir(self, claim_uid: str) -> Path:
        """Host directory shared with the claim's containers as the MPS pipe directory."""
        return self.state_dir / "mps" / claim_uid

    def _remove_artifacts(self, claim_uid: str, sync_dir: bool = True) -> None:
        remove(self.spec_path(claim_uid), sync_dir=sync_dir)
        shutil.rmtree(self.mps_dir(claim_uid), ignore_errors=True)

    def _sync_cdi_root(self) -> None:
        """Make the batch's spec renames and removals durable with one directory fsync."""
        if self.cdi_root.is_dir():
            fsync_dir(self.cdi_root)

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

    def prepared_count(self) -> int:
        """How many claims are prepared (or being prepared)."""
        return len(self._data.claims)

    # --- prepare --------------------------------------------------------------------------

    def _plan(self, claim: ClaimToPrepare) -> _Plan:
        ref = claim.ref
        configs = parse_allocation_config(claim.config, driver=self.driver_name, claim=str(ref))
        devices: list[AllocatedDevice] = []
        carve: list[PlacementSpec | None] = []
        for result in claim.results:
            name = str(result.get("device", ""))
            placement = self._placements.get(name)
            found = (placement.gpu, None) if placement else self._devices.get(name)
            carve.append(placement)
            if found is None:
                known = ", ".join(sorted(self._devices)) or "none"
                raise ClaimError(
                    f"claim {ref}: device {name!r} is not published by this node "
                    f"(devices: {known}); the allocation is stale, delete the pod so the "
                    "claim is allocated again"
                )
            gpu, mig = found
            request = str(result.get("request", ""))
            kind = "mig" if mig or placement else "gpu"
            config = resolve_config(configs, request, kind, claim=str(ref))
            device = AllocatedDevice(
                requests=(request,), device_name=name, gpu=gpu, mig=mig, config=config
            )
            shared = gpu.uuid in self._shared_gpus and mig is None and placement is None
            if shared and not result.get("adminAccess"):
                # A shared GPU: the scheduler counted this claim's share of it.
                if not result.get("shareID"):
                    raise ClaimError(
                        f"claim {ref}: device {name} is a shared GPU but its allocation has no "
                        "shareID; is the DRAConsumableCapacity feature on in the scheduler?"
                    )
                share = share_of(str(result["shareID"]), result.get("consumedCapacity"))
                device = with_share(device, share)
            devices.append(device)
        return _Plan(
            ref=ref,
            devices=tuple(devices),
            results=claim.results,
            pods=claim.pods,
            carve=tuple(carve),
        )

    def _holders(self) -> dict[str, str]:
        """Device name -> UID of the claim holding it exclusively, or of a share of it."""
        held: dict[str, str] = {}
        for uid, rec in self._data.claims.items():
            for dev in rec.devices:
                if dev.sharing != "admin":
                    held[dev.device_name] = uid
        return held

    def _shared(self) -> set[str]:
        """Devices held by shares (several claims may hold a share of a shared GPU)."""
        return {
            d.device_name for r in self._data.claims.values() for d in r.devices if _is_share(d)
        }

    def _records(self, plan: _Plan) -> list[DeviceRecord]:
        records = []
        for device, result, spec in zip(plan.devices, plan.results, plan.carve, strict=True):
            admin = bool(result.get("adminAccess"))
            strategy = (
                device.config.sharing.strategy if device.config and device.config.sharing else None
            )
            records.append(
                DeviceRecord(
                    request_names=list(device.requests),
                    pool_name=self.node_name,
                    device_name=device.device_name,
                    cdi_device_ids=[
                        cdi_device_id(
                            plan.ref.uid,
                            device.device_name,
                            device.share.share_id if device.share else None,
                        )
                    ],
                    share_id=result.get("shareID"),
                    uuid="" if spec else device.uuid,
                    sharing="admin" if admin else strategy,
                    mig=_mig_record(spec) if spec else None,
                )
            )
        return records

    def _footprint(self, rec: DeviceRecord) -> _Footprint | None:
        """Which part of which GPU a recorded device occupies."""
        if rec.mig is not None:
            return rec.mig.gpu_uuid, Placement(start=rec.mig.start, size=rec.mig.size)
        spec = self._placements.get(rec.device_name)
        if spec is not None:
            return spec.gpu.uuid, spec.placement
        found = self._devices.get(rec.device_name)
        if found is None:
            return None
        gpu, mig = found
        return gpu.uuid, mig.placement if mig else None

    def _check_gpu_free(
        self,
        ref: ClaimRef,
        records: Sequence[DeviceRecord],
        others: Sequence[tuple[str, DeviceRecord]],
    ) -> None:
        """Dynamic MIG: a whole GPU and MIG devices of it (or overlapping ones) exclude each other.

        The scheduler's counters already prevent such allocations; this double-checks, and
        it is what keeps MIG mode from changing under a claim that holds the whole GPU.
        """
        # Shares of a shared GPU are whole-GPU users that coexist by design (a shared GPU has
        # no MIG placements published).
        taken = [
            (uid, r, self._footprint(r))
            for uid, r in others
            if r.sharing != "admin" and not _is_share(r)
        ]
        for rec in records:
            mine = self._footprint(rec)
            if mine is None or rec.sharing == "admin" or _is_share(rec):
                continue
            for uid, other, theirs in taken:
                if uid == ref.uid or theirs is None or theirs[0] != mine[0]:
                    continue
                if mine[1] is None or theirs[1] is None or overlaps(mine[1], theirs[1]):
                    holder = self._data.claims.get(uid)
                    owner = f"{holder.namespace}/{holder.name}" if holder else uid
                    raise ClaimError(
                        f"claim {ref}: device {rec.device_name} cannot be prepared while claim "
                        f"{owner} holds {other.device_name} on the same GPU {mine[0]} (a whole "
                        "GPU and its MIG devices exclude each other; MIG mode can only change "
                        "on an idle GPU)"
                    )

    def _check_free(
        self,
        ref: ClaimRef,
        records: Sequence[DeviceRecord],
        held: Mapping[str, str],
        shared: set[str] | None = None,
    ) -> None:
        """The last line of defence against double allocation.

        Shares of a shared GPU may hold it together (``shared``: devices held by shares); an
        exclusive claim and a share may not.
        """
        shared = shared or set()
        for rec in records:
            holder = held.get(rec.device_name)
            if rec.sharing == "admin" or holder in (None, ref.uid):
                continue
            if _is_share(rec) and rec.device_name in shared:
                continue
            other = self._data.claims.get(holder) if holder else None
            owner = f"{other.namespace}/{other.name}" if other else holder
            raise ClaimError(
                f"claim {ref}: device {rec.device_name} is already prepared for claim {owner}"
            )

    def prepare(self, claims: Sequence[ClaimToPrepare]) -> dict[str, PrepareResult]:
        """Prepare a batch of claims; one result per claim UID, errors per claim.

        The checkpoint is written twice per batch, not per claim: once with every new claim
        marked PrepareStarted, once after their CDI specs exist.
        """
        with self._lock:
            out: dict[str, PrepareResult] = {}
            plans: list[_Plan] = []
            held = self._holders()
            shared = self._shared()
            others = [(u, d) for u, r in self._data.claims.items() for d in r.devices]
            for claim in claims:
                uid = claim.ref.uid
                if not _usable_uid(uid):
                    out[uid] = ClaimError(f"claim {claim.ref}: invalid claim UID {uid!r}")
                    continue
                done = self._data.claims.get(uid)
                if done is not None and done.state is ClaimState.PREPARE_COMPLETED:
                    out[uid] = _prepared(done)
                    continue
                try:
                    plan = self._plan(claim)
                    records = self._records(plan)
                    own_mps = self._sharing.annotate(uid, plan.devices, records)
                    self._check_free(claim.ref, records, held, shared)
                    if self._mig is not None:
                        self._check_gpu_free(claim.ref, records, others)
                    self._sharing.check(
                        str(claim.ref),
                        plan.devices,
                        [r for u, r in self._data.claims.items() if u != uid],
                    )
                except (ClaimError, ConfigError, ShareError) as exc:
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
                shared.update(r.device_name for r in records if _is_share(r))
                others += [(uid, r) for r in records]
                self._data.claims[uid] = ClaimRecord(
                    state=ClaimState.PREPARE_STARTED,
                    namespace=claim.ref.namespace,
                    name=claim.ref.name,
                    devices=records,
                    mps=own_mps,
                )
                plans.append(plan)
            if plans:
                checkpoint.save(self._path, self._data)
                faults.point("prepare.started-recorded")
                out.update({plan.ref.uid: self._finish(plan) for plan in plans})
                self._sync_cdi_root()
                checkpoint.save(self._path, self._data)
                faults.point("prepare.completed-recorded")
            return out

    def _finish(self, plan: _Plan) -> PrepareResult:
        """Create the claim's MIG devices (dynamic MIG), then write its CDI spec."""
        records = list(self._data.claims[plan.ref.uid].devices)
        try:
            plan = self._carve(plan)
        except MigError as exc:
            self._undo_carve(plan.ref, records)
            log.error("creating MIG device failed", claim=str(plan.ref), error=str(exc))
            return ClaimError(f"claim {plan.ref}: {exc}")
        record = self._data.claims[plan.ref.uid]
        try:
            self._sharing.apply(str(plan.ref), record)
        except SharingError as exc:
            log.error("applying sharing failed", claim=str(plan.ref), error=str(exc))
            self._undo_sharing(plan.ref, record)
            self._undo_carve(plan.ref, records)
            return ClaimError(f"claim {plan.ref}: {exc}")
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
        except SharingError as exc:
            log.error("undoing sharing failed", claim=str(ref), error=str(exc))

    def _carve(self, plan: _Plan) -> _Plan:
        """Make the GPUs match the claim: MIG devices created, or MIG mode off for whole GPUs.

        The intent (GPU, profile, placement) is already in the checkpoint, so a crash at any
        step leaves something a restart recognises and destroys.
        """
        if self._mig is None:
            return plan
        record = self._data.claims[plan.ref.uid]
        devices = list(plan.devices)
        for i, (device, rec, spec) in enumerate(
            zip(plan.devices, record.devices, plan.carve, strict=True)
        ):
            if spec is None:
                if (
                    device.mig is None
                    and device.gpu.mig.capable
                    and self._mig.mig_enabled(device.gpu)
                ):
                    # A whole GPU in MIG mode cannot run CUDA work; it is idle (checked above).
                    self._mig.set_mig_mode(device.gpu, False)
                    faults.point("prepare.mig-disabled")
                continue
            if not self._mig.mig_enabled(spec.gpu):
                self._mig.set_mig_mode(spec.gpu, True)
                faults.point("prepare.mig-enabled")
            created = self._mig.create(spec.gpu, spec.profile, spec.placement.start)
            faults.point("prepare.mig-created")
            assert rec.mig is not None
            rec.mig.gpu_instance_id = created.gpu_instance_id
            rec.mig.compute_instance_id = created.compute_instance_id
            rec.uuid = created.uuid
            devices[i] = dataclasses.replace(device, mig=created)
            log.info(
                "created MIG device",
                claim=str(plan.ref),
                device=device.device_name,
                uuid=created.uuid,
                gpu_instance=created.gpu_instance_id,
            )
        return dataclasses.replace(plan, devices=tuple(devices))

    def _undo_carve(self, ref: ClaimRef, records: Sequence[DeviceRecord]) -> None:
        """Best effort: destroy what a failed prepare created (a restart sweeps the rest)."""
        self._data.claims.pop(ref.uid, None)
        for rec in records:
            if rec.mig is not None:
                try:
                    self._destroy(rec.mig)
                except MigError as exc:
                    log.error("destroying MIG device failed", claim=str(ref), error=str(exc))

    def _destroy(self, mig: MigRecord) -> None:
        """Destroy the MIG device recorded for a claim, if it (still) exists."""
        assert self._mig is not None
        gpu = self._gpus.get(mig.gpu_uuid)
        if gpu is None:
            return
        for inst in self._mig.list(gpu):
            if inst.profile_id == mig.profile_id and inst.placement.start == mig.start:
                self._mig.destroy(gpu, inst.gpu_instance_id)
                log.info("destroyed MIG device", gpu=gpu.uuid, profile=mig.profile, start=mig.start)

    def _write_spec(self, plan: _Plan) -> PrepareResult:
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
            write_atomic(
                self.spec_path(uid), spec.to_json(), fault="cdi.before-rename", sync_dir=False
            )
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
        return _prepared(record)

    # --- unprepare ------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, UnprepareResult]:
        """Unprepare a batch; unknown claims succeed (the kubelet may repeat itself)."""
        with self._lock:
            out: dict[str, UnprepareResult] = {}
            changed = False
            for ref in refs:
                if not _usable_uid(ref.uid):
                    out[ref.uid] = None  # never prepared: nothing can exist under that name
                    continue
                rec = self._data.claims.get(ref.uid)
                migs = [d.mig for d in rec.devices if d.mig is not None] if rec else []
                if rec is not None and migs and rec.state is not ClaimState.UNPREPARE_STARTED:
                    # Recorded first: a restart finishes what this unprepare starts.
                    rec.state = ClaimState.UNPREPARE_STARTED
                    checkpoint.save(self._path, self._data)
                    faults.point("unprepare.started-recorded")
                if rec is not None:
                    try:
                        # Before the artifacts: a daemon is stopped through its pipe directory.
                        others = [r for u, r in self._data.claims.items() if u != ref.uid]
                        self._sharing.release([rec], others)
                    except SharingError as exc:
                        out[ref.uid] = ClaimError(f"claim {ref}: cannot undo sharing: {exc}")
                        continue
                    faults.point("unprepare.sharing-released")
                try:
                    self._remove_artifacts(ref.uid, sync_dir=False)
                except OSError as exc:
                    out[ref.uid] = ClaimError(f"claim {ref}: cannot remove CDI spec: {exc}")
                    continue
                faults.point("unprepare.cdi-removed")
                try:
                    for mig in migs:
                        self._destroy(mig)
                except MigError as exc:
                    out[ref.uid] = ClaimError(f"claim {ref}: cannot destroy MIG device: {exc}")
                    continue
                if migs:
                    faults.point("unprepare.mig-destroyed")
                if self._data.claims.pop(ref.uid, None) is not None:
                    changed = True
                    log.info(
                        "claim unprepared", claim=str(ref), claim_uid=ref.uid, node=self.node_name
                    )
                out[ref.uid] = None
            self._sync_cdi_root()
            if changed:
                checkpoint.save(self._path, self._data)
                faults.point("unprepare.recorded")
            return out


def _is_share(rec: DeviceRecord) -> bool:
    """Whether the record is a share of a shared GPU (it records what the share consumed)."""
    return rec.consumed_capacity is not None


def _mig_record(spec: PlacementSpec) -> MigRecord:
    return MigRecord(
        gpu_uuid=spec.gpu.uuid,
        profile_id=spec.profile.profile_id,
        profile=spec.profile.name,
        start=spec.placement.start,
        size=spec.placement.size,
    )


def _prepared(record: ClaimRecord) -> list[PreparedDevice]:
    return [
        PreparedDevice(
            request_names=tuple(d.request_names),
            pool_name=d.pool_name,
            device_name=d.device_name,
            cdi_device_ids=tuple(d.cdi_device_ids),
            share_id=d.share_id,
        )
        for d in record.devices
    ]
