"""The MIG steps of a claim (dynamic MIG): create its MIG devices, destroy them again.

Every step is recorded in the checkpoint before it is taken (see :mod:`.device_state`), so a
restart recognises what a crash left behind and :meth:`Carver.destroy_orphans` removes it.
Without a MIG backend (dynamic MIG off) there is nothing to carve.

A MIG device is destroyed by the GPU instance id recorded when it was made, never by its
placement alone, and only when no other claim's record names it: an admin-access claim and a
regular claim on one placement share one device, whichever came first. A record without an id
(a crash came between creating and recording) destroys only a GPU instance at its placement
that has no compute instance: that is what such a crash leaves, and it runs nothing. A create
that fails destroys what it made itself (see the backends), so any other instance there is
someone else's; start-up judges those with evidence (:meth:`Carver.destroy_orphans`).

A claim uses a MIG device that already exists at its placement when a record may name it
(another claim's, or the claim's own from before a crash) or start-up kept it for want of
proof that it is unused (an interrupted prepare's, which the scheduler has since allocated to
this claim). One that appeared since start-up without a record was made by hand: a process
may run on it, and the claim's unprepare would destroy it, so the claim fails instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence

import structlog

from dra_driver import faults
from dra_driver.gpu.inventory import Gpu, MigDevice
from dra_driver.gpu.mig.backend import Instance, MigBackend, MigError
from dra_driver.gpu.publish.partitions import PlacementSpec
from dra_driver.gpu.state.checkpoint import ClaimRecord, DeviceRecord, MigRecord
from dra_driver.gpu.state.evidence import Evidence
from dra_driver.gpu.state.planner import Plan
from dra_driver.kubeletplugin.interfaces import ClaimRef

log = structlog.get_logger(__name__)


class Carver:
    """Creates and destroys the MIG devices of the node's claims."""

    def __init__(self, mig: MigBackend | None, gpus: Mapping[str, Gpu]) -> None:
        self._mig = mig
        self._gpus = gpus
        # MIG devices (UUIDs) start-up found without a record and kept.
        self._kept: set[str] = set()

    @property
    def enabled(self) -> bool:
        """Whether dynamic MIG is on (MIG devices are created for claims)."""
        return self._mig is not None

    def carve(self, plan: Plan, record: ClaimRecord, adoptable: Collection[DeviceRecord]) -> Plan:
        """Make the GPUs match the claim: MIG devices created, or MIG mode off for whole GPUs.

        The intent (GPU, profile, placement) is already in the checkpoint, so a crash at any
        step leaves something a restart recognises and destroys. A MIG device already at a
        placement is used if one of ``adoptable`` (the other claims' records and the claim's
        own earlier ones) may name it or start-up kept it; any other is a :class:`MigError`.
        """
        if self._mig is None:
            return plan
        devices = list(plan.devices)
        for i, (device, rec, spec) in enumerate(
            zip(plan.devices, record.devices, plan.carve, strict=True)
        ):
            if spec is None:
                # Admin access (monitoring) takes the GPU as it is: MIG devices other pods use
                # stay, and MIG mode does not change under them.
                if (
                    device.mig is None
                    and rec.sharing != "admin"
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
            existing = self._existing(spec, adoptable)
            created = existing or self._mig.create(spec.gpu, spec.profile, spec.placement.start)
            faults.point("prepare.mig-created")
            assert rec.mig is not None
            rec.mig.gpu_instance_id = created.gpu_instance_id
            rec.mig.compute_instance_id = created.compute_instance_id
            rec.uuid = created.uuid
            devices[i] = dataclasses.replace(device, mig=created)
            log.info(
                "using existing MIG device" if existing else "created MIG device",
                claim=str(plan.ref),
                device=device.device_name,
                uuid=created.uuid,
                gpu_instance=created.gpu_instance_id,
            )
        return dataclasses.replace(plan, devices=tuple(devices))

    def _existing(
        self, spec: PlacementSpec, adoptable: Collection[DeviceRecord]
    ) -> MigDevice | None:
        """The MIG device that already exists at the placement, if a record may name it or
        start-up kept it (see the module): used, never created twice."""
        assert self._mig is not None
        for inst in self._mig.list(spec.gpu):
            if (
                inst.device is None
                or inst.profile_id != spec.profile.profile_id
                or inst.placement.start != spec.placement.start
            ):
                continue
            if referenced(inst, spec.gpu.uuid, adoptable) or inst.device.uuid in self._kept:
                self._kept.discard(inst.device.uuid)
                return inst.device
            gi = inst.gpu_instance_id
            raise MigError(
                f"GPU {spec.gpu.uuid}: {spec.profile.name} at {spec.placement.start} is taken "
                f"by MIG device {inst.device.uuid} (GPU instance {gi}), which no claim of "
                "this driver made (made by hand: with dynamic MIG the driver owns the GPU's "
                "MIG layout); once nothing runs on it, destroy it (nvidia-smi mig -i "
                f"{spec.gpu.uuid} -dci -gi {gi}, then nvidia-smi mig -i {spec.gpu.uuid} -dgi "
                f"-gi {gi})"
            )
        return None

    def adopt(self, claims: Iterable[ClaimRecord]) -> bool:
        """Make the MIG devices that claims prepared without dynamic MIG hold (the GPU's
        layout before it was turned on) dynamic MIG's: their records name them by GPU
        instance from now on, so the last claim's unprepare destroys them, as it does those
        dynamic MIG made. Left with no record, they would block their placements, the ones
        overlapping them and the whole GPU until a restart. Whether a record changed."""
        assert self._mig is not None
        # MIG device UUIDs start with "MIG-" (whole GPUs' with "GPU-"): no NVML call for
        # a node whose claims hold no MIG device without a record of it.
        plain = [
            d for rec in claims for d in rec.devices if d.mig is None and d.uuid.startswith("MIG-")
        ]
        if not plain:
            return False
        found = {
            inst.device.uuid: (gpu, inst)
            for gpu in self._gpus.values()
            if gpu.mig.capable
            for inst in self._mig.list(gpu)
            if inst.device is not None
        }
        changed = False
        for rec in plain:
            if rec.uuid not in found:
                continue  # a whole GPU, or a MIG device gone since
            gpu, inst = found[rec.uuid]
            rec.mig = record_of(gpu.uuid, inst)
            log.info(
                "MIG device held since before dynamic MIG: it goes with its last claim",
                gpu=gpu.uuid,
                uuid=rec.uuid,
                gpu_instance=inst.gpu_instance_id,
            )
            changed = True
        return changed

    def find(self, gpu: Gpu, uuid: str) -> Instance | None:
        """The GPU instance whose MIG device has ``uuid``, if it exists."""
        if self._mig is None:
            return None
        return next((i for i in self._mig.list(gpu) if i.device and i.device.uuid == uuid), None)

    def undo(
        self, ref: ClaimRef, records: Sequence[DeviceRecord], others: Collection[DeviceRecord]
    ) -> None:
        """Best effort: destroy what a failed prepare created (a restart sweeps the rest)."""
        for rec in records:
            if rec.mig is not None:
                try:
                    self.destroy(rec.mig, others)
                except MigError as exc:
                    log.error("destroying MIG device failed", claim=str(ref), error=str(exc))

    def destroy(self, mig: MigRecord, others: Collection[DeviceRecord]) -> None:
        """Destroy the MIG device ``mig`` records, if it still exists and none of ``others``
        (the other claims' records) names it. With dynamic MIG turned off since the claim was
        prepared, the device stays (as a MIG device of the GPU's static layout) and the
        unprepare goes ahead."""
        gpu = self._gpus.get(mig.gpu_uuid)
        if self._mig is None:
            log.warning(
                "dynamic MIG is off: the claim's MIG device stays",
                gpu=mig.gpu_uuid,
                profile=mig.profile,
                start=mig.start,
            )
            return
        if gpu is None:
            return
        for inst in self._mig.list(gpu):
            if not names(mig, inst):
                continue
            if referenced(inst, gpu.uuid, others):
                log.info("MIG device stays: another claim uses it", gpu=gpu.uuid)
                continue
            self._mig.destroy(gpu, inst.gpu_instance_id)
            log.info(
                "destroyed MIG device",
                gpu=gpu.uuid,
                profile=mig.profile,
                start=mig.start,
                gpu_instance=inst.gpu_instance_id,
            )

    def destroy_orphans(
        self,
        claims: Collection[ClaimRecord],
        placements: Iterable[PlacementSpec],
        evidence: Evidence,
    ) -> list[str]:
        """Destroy MIG devices nothing uses (dynamic MIG owns the GPUs' layout); return those
        kept because nothing proves them unused (a claim allocated one's placement uses it).

        Covers instances left by a crash mid-prepare and MIG devices made before the driver
        started. An instance a record names is kept; any other is destroyed only when the
        API server and the CDI specs prove it unused (:meth:`Evidence.may_destroy`).
        """
        assert self._mig is not None
        records = [d for rec in claims for d in rec.devices]
        names_held = {d.device_name for d in records}
        placements = list(placements)
        kept: list[str] = []
        for gpu in self._gpus.values():
            if not gpu.mig.capable:
                continue
            for inst in self._mig.list(gpu):
                spec = next(
                    (
                        s
                        for s in placements
                        if s.gpu.uuid == gpu.uuid
                        and s.profile.profile_id == inst.profile_id
                        and s.placement.start == inst.placement.start
                    ),
                    None,
                )
                name = spec.device_name if spec else ""
                if name in names_held or referenced(inst, gpu.uuid, records):
                    continue
                device = name or f"gi{inst.gpu_instance_id}"
                uuid = inst.device.uuid if inst.device else None
                if not evidence.may_destroy(name, uuid):
                    kept.append(f"MIG device {device} on GPU {gpu.uuid}")
                    if uuid is not None:
                        self._kept.add(uuid)
                    log.warning(
                        "kept MIG device no record names: cannot prove it unused",
                        gpu=gpu.uuid,
                        device=device,
                        uuid=uuid,
                        api_answered=evidence.api is not None,
                    )
                    continue
                self._mig.destroy(gpu, inst.gpu_instance_id)
                log.info(
                    "destroyed MIG device no claim uses", gpu=gpu.uuid, device=device, uuid=uuid
                )
        return kept


def record_of(gpu_uuid: str, inst: Instance) -> MigRecord:
    """The record naming a GPU instance of GPU ``gpu_uuid`` and its MIG device."""
    return MigRecord(
        gpu_uuid=gpu_uuid,
        profile_id=inst.profile_id,
        profile=inst.device.profile_name if inst.device else "",
        start=inst.placement.start,
        size=inst.placement.size,
        gpu_instance_id=inst.gpu_instance_id,
        compute_instance_id=inst.device.compute_instance_id if inst.device else None,
    )


def names(mig: MigRecord, inst: Instance) -> bool:
    """Whether a record names this GPU instance, so that it may destroy it: by the id recorded
    when it was created (and its placement), or, with no id recorded, at its placement with no
    compute instance (what a crash between creating and recording leaves; nothing runs on a
    GPU instance without one)."""
    same_place = mig.profile_id == inst.profile_id and mig.start == inst.placement.start
    if mig.gpu_instance_id is None:
        return same_place and inst.device is None
    return same_place and mig.gpu_instance_id == inst.gpu_instance_id


def may_name(mig: MigRecord, inst: Instance) -> bool:
    """Whether a record may name this GPU instance: :func:`names` it, or has no id yet and
    the same placement (a crash between creating and recording, or a record rebuilt from a
    CDI spec whose device was not found). Such an instance is kept, never destroyed."""
    same_place = mig.profile_id == inst.profile_id and mig.start == inst.placement.start
    return names(mig, inst) or (same_place and mig.gpu_instance_id is None)


def referenced(inst: Instance, gpu_uuid: str, records: Iterable[DeviceRecord]) -> bool:
    """Whether any of ``records`` may name this instance of GPU ``gpu_uuid`` (so it stays)."""
    return any(
        r.mig is not None and r.mig.gpu_uuid == gpu_uuid and may_name(r.mig, inst) for r in records
    )
