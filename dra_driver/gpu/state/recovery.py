"""Start-up: read the checkpoint (or rebuild a lost one) and undo what a reboot or a crash
left half done.

A corrupt or missing checkpoint is rebuilt from the claims' CDI specs and the API server's
claims (:mod:`.evidence`), never replaced by an empty one: an empty record would let start-up
take apart every device the node's pods use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import structlog

from dra_driver.gpu.container.claim_spec import cdi_device_id
from dra_driver.gpu.publish.catalog import Catalog
from dra_driver.gpu.sharing import mps as mpsplan
from dra_driver.gpu.sharing.backend import SharingError
from dra_driver.gpu.sharing.manager import SharingManager
from dra_driver.gpu.state import checkpoint
from dra_driver.gpu.state.carving import Carver, record_of
from dra_driver.gpu.state.checkpoint import (
    CheckpointData,
    ClaimRecord,
    ClaimState,
    CorruptCheckpoint,
    DeviceRecord,
)
from dra_driver.gpu.state.evidence import Evidence, SpecOnDisk, device_of
from dra_driver.gpu.state.planner import mig_record
from dra_driver.kubeletplugin.interfaces import ClaimRef

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Start:
    """What start-up found: the records, the corruption seen, and what was kept for want
    of proof that it is unused."""

    data: CheckpointData
    corrupt: CorruptCheckpoint | None
    kept: list[str]


def start(
    file: checkpoint.CheckpointFile,
    evidence: Evidence,
    *,
    node_name: str,
    catalog: Catalog,
    carver: Carver,
    sharing: SharingManager,
    remove_artifacts: Callable[[str], None],
) -> Start:
    """Load or rebuild the checkpoint, finish what a crash interrupted, and take apart only
    what is proven unused. The caller holds the node lock."""
    data, corrupt = load(file, node_name, evidence)
    if data is not None:
        # Specs no record names: a plain claim's prepare crashed before its only record.
        evidence = drop_gone(evidence, remove_artifacts, recorded=data.claims)
    else:
        evidence = drop_gone(evidence, remove_artifacts)
        data = rebuild(
            evidence,
            catalog=catalog,
            carver=carver,
            node_name=node_name,
            boot_id=file.boot_id,
            mps_root=sharing.mps_root,
        )
    # A reboot that leaves no claim to drop still changes the boot the records belong to.
    rebooted = data.boot_id != file.boot_id
    dropped = recover(
        data,
        file.boot_id,
        node_name=node_name,
        sharing=sharing,
        remove_artifacts=remove_artifacts,
        keep_daemons=daemons_in_specs(evidence, sharing.mps_root),
    )
    evidence = evidence.without(dropped)
    adopted = carver.enabled and carver.adopt(data.claims.values())
    if dropped or rebooted or adopted or not file.path.exists():
        # The file must name this boot: a later write that fails is undone by reading the
        # file again, and a file of another boot is never read back (memory would stay
        # ahead of the disk, answering a retry prepared for a claim nothing records).
        file.write(data)
    kept: list[str] = []
    if carver.enabled:
        remaining = [d for rec in data.claims.values() for d in rec.devices]
        for uid, rec in dropped.items():
            if rec.state is ClaimState.UNPREPARE_STARTED:
                carver.undo(ClaimRef(rec.namespace, rec.name, uid), rec.devices, remaining)
        kept = carver.destroy_orphans(data.claims.values(), catalog.placements(), evidence)
    return Start(data=data, corrupt=corrupt, kept=kept)


def load(
    file: checkpoint.CheckpointFile, node_name: str, evidence: Evidence
) -> tuple[CheckpointData | None, CorruptCheckpoint | None]:
    """The checkpoint, or ``None`` when it must be rebuilt: it is corrupt (and moved
    aside) or missing while claims' CDI specs exist."""
    try:
        if file.path.exists() or not evidence.specs:
            return file.read(), None
        log.error(
            "checkpoint missing while CDI specs exist: rebuilding it",
            specs=len(evidence.specs),
            node=node_name,
        )
        return None, None
    except CorruptCheckpoint as exc:
        log.error(
            "checkpoint corrupt: rebuilding it from the CDI specs and the API server",
            reason=exc.reason,
            moved_to=str(exc.moved_to),
            node=node_name,
        )
        return None, exc


def drop_gone(
    evidence: Evidence,
    remove_artifacts: Callable[[str], None],
    recorded: Collection[str] = (),
) -> Evidence:
    """Remove the CDI specs of claims the API server proves gone, except the ``recorded``
    claims' (whose unprepare the kubelet still owes); the evidence without them. A spec whose
    claim may still exist stays: the kubelet prepares or unprepares that claim again."""
    gone = [uid for uid in evidence.specs if uid not in recorded and evidence.claim_gone(uid)]
    for uid in gone:
        log.info("removing CDI spec of a claim that no longer exists", claim_uid=uid)
        with contextlib.suppress(OSError):
            remove_artifacts(uid)
    return evidence.without(gone)


def rebuild(
    evidence: Evidence,
    *,
    catalog: Catalog,
    carver: Carver,
    node_name: str,
    boot_id: str,
    mps_root: Path | None = None,
) -> CheckpointData:
    """A checkpoint with a prepared record for every claim whose CDI spec exists."""
    data = CheckpointData(boot_id=boot_id)
    for uid, spec in evidence.specs.items():
        api = evidence.api.get(uid) if evidence.api is not None else None
        devices = _device_records(uid, spec, evidence, catalog, carver, node_name)
        data.claims[uid] = ClaimRecord(
            state=ClaimState.PREPARE_COMPLETED,
            namespace=api.namespace if api else "",
            name=api.name if api else "",
            devices=devices,
        )
        if mps_root is not None:
            _mps_records(uid, spec, data.claims[uid], catalog, mps_root)
        log.warning(
            "claim recovered from its CDI spec",
            claim=f"{api.namespace}/{api.name}" if api else "",
            claim_uid=uid,
            devices=[d.device_name for d in devices],
        )
    return data


def _device_records(
    uid: str,
    spec: SpecOnDisk,
    evidence: Evidence,
    catalog: Catalog,
    carver: Carver,
    node_name: str,
) -> list[DeviceRecord]:
    api = evidence.api.get(uid) if evidence.api is not None else None
    records = []
    for i, cdi_name in enumerate(spec.cdi_names):
        found = device_of(cdi_name, uid, catalog.entries)
        if found is None:
            continue
        name, share_id = found
        entry = catalog.entries[name]
        alloc = next((r for r in api.results if r.device == name), None) if api else None
        uuid = spec.uuids[i] if i < len(spec.uuids) else ""
        mig = mig_record(entry.placement) if entry.placement else None
        inst = carver.find(entry.gpu, uuid) if mig or entry.partitioned else None
        if mig is not None and inst is not None and inst.device is not None:
            mig.gpu_instance_id = inst.gpu_instance_id
            mig.compute_instance_id = inst.device.compute_instance_id
        # A share of a GPU's MIG slices names the GPU, its spec the MIG device it became:
        # without this record of it, the share would hold the whole GPU and its unprepare
        # would leave the MIG device behind.
        shared_slices = entry.partitioned and share_id is not None
        if shared_slices and inst is not None and inst.device is not None:
            mig = record_of(entry.gpu.uuid, inst)
        records.append(
            DeviceRecord(
                request_names=[alloc.request] if alloc else [],
                pool_name=node_name,
                device_name=name,
                cdi_device_ids=[cdi_device_id(uid, name, share_id)],
                share_id=share_id,
                uuid=uuid,
                sharing="admin" if alloc and alloc.admin else None,
                mig=mig,
                # A share, as its spec says; what the scheduler counted is not known here.
                consumed_capacity={} if shared_slices else None,
            )
        )
    return records


def _mps_records(
    uid: str, spec: SpecOnDisk, record: ClaimRecord, catalog: Catalog, mps_root: Path
) -> None:
    """Name in a rebuilt record the MPS daemon its spec mounts, and mark shares of shared
    GPUs as shares: the daemon is then stopped with its last claim and other shares may join
    the GPU. The limits set through the daemon's pipe are not known any more."""
    mounted = {
        Path(p).parent.name
        for p in spec.host_paths
        if Path(p).parent.parent == mps_root and Path(p).name == "pipe"
    }
    for device in record.devices:
        entry = catalog.entries.get(device.device_name)
        if device.share_id and entry is not None and entry.shared:
            device.consumed_capacity = device.consumed_capacity or {}
            daemon_id = mpsplan.gpu_daemon_id(entry.gpu.minor)
            if daemon_id in mounted:
                daemon = mpsplan.daemon_for(mps_root, daemon_id, [entry.gpu.uuid])
                device.mps = mpsplan.to_record(daemon)
    own = mpsplan.claim_daemon_id(uid)
    if own in mounted:
        # The daemon serves the devices that asked for MPS: those whose CDI devices mount its
        # pipe (any but admin access where the spec mounted it claim-wide).
        clients = spec.mounting(str(mpsplan.daemon_for(mps_root, own, []).pipe_dir))
        uuids = [
            d.uuid
            for d in record.devices
            if d.uuid
            and d.sharing != "admin"
            and (clients is None or d.cdi_device_ids[0].partition("=")[2] in clients)
        ]
        record.mps = mpsplan.to_record(mpsplan.daemon_for(mps_root, own, uuids))


def daemons_in_specs(evidence: Evidence, mps_root: Path) -> frozenset[str]:
    """MPS daemons whose pipe directory (``<mps_root>/<daemon>/pipe``) a claim's CDI spec
    mounts into containers."""
    return frozenset(
        Path(path).parent.name
        for path in evidence.paths_in_specs()
        if Path(path).parent.parent == mps_root
    )


def recover(
    data: CheckpointData,
    boot_id: str,
    *,
    node_name: str,
    sharing: SharingManager,
    remove_artifacts: Callable[[str], None],
    keep_daemons: Collection[str] = (),
) -> dict[str, ClaimRecord]:
    """Drop what a reboot made stale and undo prepares a crash interrupted (in ``data``);
    return the dropped claims' records. ``keep_daemons`` are never stopped.

    MIG devices are left to the caller: an interrupted unprepare's go (the kubelet asked for
    it), an interrupted prepare's stay while the API server says the claim holds them.
    """
    stale: list[str] = []
    if data.boot_id != boot_id:
        stale = list(data.claims)
        log.info("node rebooted: dropping prepared claims", count=len(stale), node=node_name)
    else:
        stale = [
            uid for uid, rec in data.claims.items() if rec.state is not ClaimState.PREPARE_COMPLETED
        ]
    dropped = [data.claims.pop(uid) for uid in stale]
    try:
        # Daemons first: their pipe directories go with the claims' artifacts.
        sharing.release(dropped, data.claims.values())
    except SharingError as exc:
        log.error("undoing sharing of dropped claims failed", error=str(exc))
    sharing.sweep(data.claims.values(), keep=keep_daemons)
    for uid, rec in zip(stale, dropped, strict=True):
        remove_artifacts(uid)
        # An interrupted unprepare is finished, an interrupted prepare undone: either way
        # the claim goes, and its MIG devices with it (see Carver.destroy_orphans).
        log.info(
            "finished interrupted unprepare"
            if rec.state is ClaimState.UNPREPARE_STARTED
            else "undid interrupted prepare",
            claim=f"{rec.namespace}/{rec.name}",
            claim_uid=uid,
        )
    data.boot_id = boot_id
    return dict(zip(stale, dropped, strict=True))
