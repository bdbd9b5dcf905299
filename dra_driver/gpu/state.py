"""The node's prepared claims: prepare, unprepare, the checkpoint and the CDI specs.

All methods block (fsync) and are meant to run in a worker thread. Calls are serialised by the
kubelet plugin's node-wide lock; the internal lock only guards against misuse.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_driver import faults
from dra_driver.cdi.spec import NO_EDITS, ContainerEdits
from dra_driver.cdi.writer import remove, spec_file_name, write_atomic
from dra_driver.gpu import checkpoint, devnodes
from dra_driver.gpu.checkpoint import CheckpointData, ClaimRecord, ClaimState, DeviceRecord
from dra_driver.gpu.claim_spec import (
    CDI_CLASS,
    CDI_VENDOR,
    AllocatedDevice,
    build_claim_spec,
    cdi_device_id,
    uses_mps,
)
from dra_driver.gpu.config import ConfigError, parse_allocation_config, resolve_config
from dra_driver.gpu.devices import devices_for_gpu
from dra_driver.gpu.inventory import Gpu, Inventory, MigDevice
from dra_driver.kubeletplugin.interfaces import (
    ClaimRef,
    ClaimToPrepare,
    PreparedDevice,
    PrepareResult,
    UnprepareResult,
)

log = structlog.get_logger(__name__)

CHECKPOINT_FILE = "checkpoint.json"


class ClaimError(Exception):
    """A claim cannot be prepared; the message tells the user what to fix."""


@dataclass(frozen=True)
class _Plan:
    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    results: tuple[dict[str, Any], ...]


def _device_index(inventory: Inventory) -> dict[str, tuple[Gpu, MigDevice | None]]:
    """Published device name -> the GPU (and MIG device) behind it."""
    index: dict[str, tuple[Gpu, MigDevice | None]] = {}
    for gpu in inventory.gpus:
        devices = devices_for_gpu(gpu, inventory)
        migs: Iterable[MigDevice | None] = gpu.mig_devices if gpu.mig_enabled else [None]
        for device, mig in zip(devices, migs, strict=True):
            index[device["name"]] = (gpu, mig)
    return index


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
    ) -> None:
        self.driver_name = driver_name
        self.node_name = node_name
        self.cdi_root = cdi_root
        self.state_dir = state_dir
        self._common = common_edits
        self._mig_minors = mig_minors
        self._device_nodes = device_nodes
        self._lock = threading.Lock()
        self._devices = _device_index(inventory)
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
                uid for uid, rec in data.claims.items() if rec.state is ClaimState.PREPARE_STARTED
            ]
        for uid in stale:
            rec = data.claims.pop(uid)
            self._remove_artifacts(uid)
            log.info(
                "undid interrupted prepare", claim=f"{rec.namespace}/{rec.name}", claim_uid=uid
            )
        data.boot_id = boot_id
        if stale or not self._path.exists():
            checkpoint.save(self._path, data)
        return data

    # --- paths ----------------------------------------------------------------------------

    def spec_path(self, claim_uid: str) -> Path:
        """Where the claim's CDI spec lives."""
        return self.cdi_root / spec_file_name(CDI_VENDOR, CDI_CLASS, claim_uid)

    def mps_dir(self, claim_uid: str) -> Path:
        """Host directory shared with the claim's containers as the MPS pipe directory."""
        return self.state_dir / "mps" / claim_uid

    def _remove_artifacts(self, claim_uid: str) -> None:
        remove(self.spec_path(claim_uid))
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

    def prepared_count(self) -> int:
        """How many claims are prepared (or being prepared)."""
        return len(self._data.claims)

    # --- prepare --------------------------------------------------------------------------

    def _plan(self, claim: ClaimToPrepare) -> _Plan:
        ref = claim.ref
        configs = parse_allocation_config(claim.config, driver=self.driver_name, claim=str(ref))
        devices: list[AllocatedDevice] = []
        for result in claim.results:
            name = str(result.get("device", ""))
            found = self._devices.get(name)
            if found is None:
                known = ", ".join(sorted(self._devices)) or "none"
                raise ClaimError(
                    f"claim {ref}: device {name!r} is not published by this node "
                    f"(devices: {known}); the allocation is stale, delete the pod so the "
                    "claim is allocated again"
                )
            gpu, mig = found
            request = str(result.get("request", ""))
            config = resolve_config(configs, request, "mig" if mig else "gpu", claim=str(ref))
            devices.append(
                AllocatedDevice(
                    requests=(request,), device_name=name, gpu=gpu, mig=mig, config=config
                )
            )
        return _Plan(ref=ref, devices=tuple(devices), results=claim.results)

    def _holders(self) -> dict[str, str]:
        """Device name -> UID of the claim holding it exclusively."""
        held: dict[str, str] = {}
        for uid, rec in self._data.claims.items():
            for dev in rec.devices:
                if dev.sharing != "admin":
                    held[dev.device_name] = uid
        return held

    def _records(self, plan: _Plan) -> list[DeviceRecord]:
        records = []
        for device, result in zip(plan.devices, plan.results, strict=True):
            admin = bool(result.get("adminAccess"))
            strategy = (
                device.config.sharing.strategy if device.config and device.config.sharing else None
            )
            records.append(
                DeviceRecord(
                    request_names=list(device.requests),
                    pool_name=self.node_name,
                    device_name=device.device_name,
                    cdi_device_ids=[cdi_device_id(plan.ref.uid, device.device_name)],
                    share_id=result.get("shareID"),
                    uuid=device.uuid,
                    sharing="admin" if admin else strategy,
                )
            )
        return records

    def _check_free(
        self, ref: ClaimRef, records: Sequence[DeviceRecord], held: Mapping[str, str]
    ) -> None:
        """The last line of defence against double allocation."""
        for rec in records:
            holder = held.get(rec.device_name)
            if rec.sharing == "admin" or holder in (None, ref.uid):
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
            for claim in claims:
                uid = claim.ref.uid
                done = self._data.claims.get(uid)
                if done is not None and done.state is ClaimState.PREPARE_COMPLETED:
                    out[uid] = _prepared(done)
                    continue
                try:
                    plan = self._plan(claim)
                    records = self._records(plan)
                    self._check_free(claim.ref, records, held)
                except (ClaimError, ConfigError) as exc:
                    log.warning(
                        "prepare refused", claim=str(claim.ref), claim_uid=uid, error=str(exc)
                    )
                    out[uid] = exc
                    continue
                held.update({r.device_name: uid for r in records if r.sharing != "admin"})
                self._data.claims[uid] = ClaimRecord(
                    state=ClaimState.PREPARE_STARTED,
                    namespace=claim.ref.namespace,
                    name=claim.ref.name,
                    devices=records,
                )
                plans.append(plan)
            if plans:
                checkpoint.save(self._path, self._data)
                faults.point("prepare.started-recorded")
                out.update({plan.ref.uid: self._write_spec(plan) for plan in plans})
                checkpoint.save(self._path, self._data)
                faults.point("prepare.completed-recorded")
            return out

    def _write_spec(self, plan: _Plan) -> PrepareResult:
        uid = plan.ref.uid
        try:
            mps_dir = None
            if uses_mps(plan.devices):
                self.mps_dir(uid).mkdir(parents=True, exist_ok=True)
                mps_dir = str(self.mps_dir(uid))
            spec = build_claim_spec(
                uid,
                plan.devices,
                common=self._common,
                mig_minors=self._mig_minors,
                mps_host_dir=mps_dir,
                device_nodes=self._device_nodes,
            )
            write_atomic(self.spec_path(uid), spec.to_json(), fault="cdi.before-rename")
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
                try:
                    self._remove_artifacts(ref.uid)
                except OSError as exc:
                    out[ref.uid] = ClaimError(f"claim {ref}: cannot remove CDI spec: {exc}")
                    continue
                faults.point("unprepare.cdi-removed")
                if self._data.claims.pop(ref.uid, None) is not None:
                    changed = True
                    log.info(
                        "claim unprepared", claim=str(ref), claim_uid=ref.uid, node=self.node_name
                    )
                out[ref.uid] = None
            if changed:
                checkpoint.save(self._path, self._data)
                faults.point("unprepare.recorded")
            return out


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
