"""The MIG steps of a claim (dynamic MIG): create its MIG devices, destroy them again.

Every step is recorded in the checkpoint before it is taken (see :mod:`.device_state`), so a
restart recognises what a crash left behind and :meth:`Carver.destroy_orphans` removes it.
Without a MIG backend (dynamic MIG off) there is nothing to carve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence

import structlog

from dra_driver import faults
from dra_driver.gpu.inventory import Gpu
from dra_driver.gpu.mig.backend import MigBackend, MigError
from dra_driver.gpu.publish.partitions import PlacementSpec
from dra_driver.gpu.state.checkpoint import ClaimRecord, DeviceRecord, MigRecord
from dra_driver.gpu.state.planner import Plan
from dra_driver.kubeletplugin.interfaces import ClaimRef

log = structlog.get_logger(__name__)


class Carver:
    """Creates and destroys the MIG devices of the node's claims."""

    def __init__(self, mig: MigBackend | None, gpus: Mapping[str, Gpu]) -> None:
        self._mig = mig
        self._gpus = gpus

    @property
    def enabled(self) -> bool:
        """Whether dynamic MIG is on (MIG devices are created for claims)."""
        return self._mig is not None

    def carve(self, plan: Plan, record: ClaimRecord) -> Plan:
        """Make the GPUs match the claim: MIG devices created, or MIG mode off for whole GPUs.

        The intent (GPU, profile, placement) is already in the checkpoint, so a crash at any
        step leaves something a restart recognises and destroys.
        """
        if self._mig is None:
            return plan
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

    def undo(self, ref: ClaimRef, records: Sequence[DeviceRecord]) -> None:
        """Best effort: destroy what a failed prepare created (a restart sweeps the rest)."""
        for rec in records:
            if rec.mig is not None:
                try:
                    self.destroy(rec.mig)
                except MigError as exc:
                    log.error("destroying MIG device failed", claim=str(ref), error=str(exc))

    def destroy(self, mig: MigRecord) -> None:
        """Destroy the MIG device recorded for a claim, if it (still) exists."""
        assert self._mig is not None
        gpu = self._gpus.get(mig.gpu_uuid)
        if gpu is None:
            return
        for inst in self._mig.list(gpu):
            if inst.profile_id == mig.profile_id and inst.placement.start == mig.start:
                self._mig.destroy(gpu, inst.gpu_instance_id)
                log.info("destroyed MIG device", gpu=gpu.uuid, profile=mig.profile, start=mig.start)

    def destroy_orphans(
        self, claims: Collection[ClaimRecord], placements: Iterable[PlacementSpec]
    ) -> None:
        """Destroy MIG devices no prepared claim uses (dynamic MIG owns the GPUs' layout).

        Covers instances left by a crash mid-prepare (their claim was just dropped) and
        MIG devices made before the driver started; a claim's devices are recognised by the
        placement recorded for them, or by the device name (claims prepared statically).
        """
        assert self._mig is not None
        kept_names = {d.device_name for rec in claims for d in rec.devices}
        kept = {
            (d.mig.gpu_uuid, d.mig.profile_id, d.mig.start)
            for rec in claims
            for d in rec.devices
            if d.mig is not None
        }
        placements = list(placements)
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
                if (gpu.uuid, inst.profile_id, inst.placement.start) in kept or name in kept_names:
                    continue
                self._mig.destroy(gpu, inst.gpu_instance_id)
                log.info(
                    "destroyed MIG device no claim uses",
                    gpu=gpu.uuid,
                    device=name or f"gi{inst.gpu_instance_id}",
                    uuid=inst.device.uuid if inst.device else None,
                )
