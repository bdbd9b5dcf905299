"""Planning a prepare (pure): look the devices up, record them, refuse conflicts.

Nothing here touches a file or a GPU; :mod:`dra_driver.gpu.state.device_state` runs the
transaction around it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.errors import PrepareError
from dra_driver.gpu.allocation import AllocatedDevice, with_share
from dra_driver.gpu.config import (
    OWN_API,
    ConfigKinds,
    check_device_keys,
    parse_allocation_config,
    resolve_config,
)
from dra_driver.gpu.container.claim_spec import cdi_device_id
from dra_driver.gpu.inventory import Placement
from dra_driver.gpu.mig.backend import overlaps
from dra_driver.gpu.publish.catalog import Catalog, Entry
from dra_driver.gpu.publish.mig_capacity import (
    NoPlacement,
    SlicesError,
    choose_placement,
    is_whole,
    profile_for,
    slices_of,
)
from dra_driver.gpu.publish.partitions import PlacementSpec
from dra_driver.gpu.sharing.shared_gpus import share_of
from dra_driver.gpu.state.checkpoint import ClaimRecord, DeviceRecord, MigRecord
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare, PreparedDevice


class ClaimError(PrepareError):
    """A claim cannot be prepared; the message tells the user what to fix."""


class GpuClaimError(ClaimError):
    """A claim failed because of the state of GPUs, which the error names."""

    def __init__(self, message: str, gpus: tuple[str, ...]) -> None:
        super().__init__(message)
        self.gpus = gpus  # UUIDs of the GPUs concerned


class NoPlacementError(GpuClaimError):
    """A share of a GPU's MIG slices fit by count, but no placement of its profile is free."""


class CarveError(GpuClaimError):
    """Creating a claim's MIG device failed: the GPU, not the claim, is the problem."""


@dataclass(frozen=True)
class Plan:
    """A claim about to be prepared: its devices and the allocation results they came from."""

    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    results: tuple[dict[str, Any], ...]
    pods: tuple[str, ...] = ()
    # Dynamic MIG: the placement to create for each device (None: the device exists).
    carve: tuple[PlacementSpec | None, ...] = ()


# A device's footprint on its GPU: the GPU's UUID and the placement it takes (None: all of it).
Footprint = tuple[str, Placement | None]


def plan_claim(
    claim: ClaimToPrepare,
    catalog: Catalog,
    driver_name: str,
    apis: ConfigKinds = OWN_API,
    taken: Sequence[tuple[str, DeviceRecord]] = (),
) -> Plan:
    """What preparing ``claim`` means: its devices looked up in the catalogue, with their
    configs (of the config ``apis`` accepted), shares and the MIG devices to create. Raises
    :class:`ClaimError` and the config and share errors, all meant for the claim's user.

    ``taken``: the other claims' device records (claim UID, record), where a share of a GPU's
    MIG slices finds the placements already in use."""
    ref = claim.ref
    configs = parse_allocation_config(claim.config, driver=driver_name, claim=str(ref), apis=apis)
    devices: list[AllocatedDevice] = []
    carve: list[PlacementSpec | None] = []
    # GPU UUID -> the parts of it in use (None: all of it), this claim's own choices included;
    # worked out for the first share of a GPU's MIG slices (it costs a look at every record).
    used: dict[str, list[Placement | None]] | None = None
    # GPU UUID -> the profile ids of the MIG devices on it (the instance limits)
    kinds: dict[str, list[int]] = {}
    for result in claim.results:
        name = str(result.get("device", ""))
        entry = catalog.get(name)
        if entry is None:
            named = (n for n, e in catalog.entries.items() if e.placement is None)
            known = ", ".join(sorted(named)) or "none"
            raise ClaimError(
                f"claim {ref}: device {name!r} is not published by this node "
                f"(devices: {known}); the allocation is stale, delete the pod so the "
                "claim is allocated again"
            )
        request = str(result.get("request", ""))
        spec, slices_share = entry.placement, None
        if entry.partitioned and not result.get("adminAccess"):
            if used is None:
                used, kinds = _in_use(ref, catalog, taken)
            spec = _share_placement(
                ref, entry, result, used, _recorded(ref, name, result, taken), kinds
            )
            slices_share = str(result["shareID"])
            used.setdefault(entry.gpu.uuid, []).append(spec.placement if spec else None)
            if spec is not None:
                kinds.setdefault(entry.gpu.uuid, []).append(spec.profile.profile_id)
        carve.append(spec)
        kind = "mig" if spec is not None else entry.kind
        config = resolve_config(configs, request, kind, claim=str(ref))
        device = AllocatedDevice(
            requests=(request,),
            device_name=name,
            gpu=entry.gpu,
            mig=entry.mig,
            config=config,
            slices_share=slices_share,
        )
        if entry.shared and not result.get("adminAccess"):
            # A shared GPU: the scheduler counted this claim's share of it.
            if not result.get("shareID"):
                raise ClaimError(
                    f"claim {ref}: device {name} is a shared GPU but its allocation has no "
                    "shareID; is the DRAConsumableCapacity feature on in the scheduler?"
                )
            share = share_of(str(result["shareID"]), result.get("consumedCapacity"))
            device = with_share(device, share)
        devices.append(device)
    # A MIG device made on demand has no UUID yet (its GPU's is not its own): only an
    # index names it, else a key naming its GPU passes here and then limits nothing.
    uuids = [d.uuid for d, spec in zip(devices, carve, strict=True) if spec is None]
    for device in devices:
        where = f"claim {ref}, request {device.requests[0]}"
        check_device_keys(device.config, devices=len(devices), uuids=uuids, where=where)
    return Plan(
        ref=ref,
        devices=tuple(devices),
        results=claim.results,
        pods=claim.pods,
        carve=tuple(carve),
    )


def _in_use(
    ref: ClaimRef, catalog: Catalog, taken: Sequence[tuple[str, DeviceRecord]]
) -> tuple[dict[str, list[Placement | None]], dict[str, list[int]]]:
    """GPU UUID -> the parts of it the other claims' records take (None: all of it), and
    GPU UUID -> the profile ids of the MIG devices they record on it."""
    used: dict[str, list[Placement | None]] = {}
    kinds: dict[str, list[int]] = {}
    for uid, rec in taken:
        part = footprint(rec, catalog) if uid != ref.uid and rec.sharing != "admin" else None
        if part is not None and not memory_share(rec, catalog):
            used.setdefault(part[0], []).append(part[1])
            if rec.mig is not None:
                kinds.setdefault(rec.mig.gpu_uuid, []).append(rec.mig.profile_id)
    return used, kinds


def _recorded(
    ref: ClaimRef, name: str, result: Mapping[str, Any], taken: Sequence[tuple[str, DeviceRecord]]
) -> MigRecord | None:
    """The MIG device this claim's own record already names for this share (the claim is
    prepared again: its spec was lost, or a restart came mid-prepare)."""
    share = result.get("shareID")
    return next(
        (
            rec.mig
            for uid, rec in taken
            if uid == ref.uid
            and rec.mig is not None
            and rec.device_name == name
            and rec.share_id == share
        ),
        None,
    )


def _share_placement(
    ref: ClaimRef,
    entry: Entry,
    result: Mapping[str, Any],
    used: Mapping[str, Sequence[Placement | None]],
    recorded: MigRecord | None = None,
    kinds: Mapping[str, Sequence[int]] | None = None,
) -> PlacementSpec | None:
    """The MIG device a share of a GPU's MIG slices becomes (None: the whole GPU); the one
    ``recorded`` for it before, if it still fits."""
    name = result.get("device")
    if not result.get("shareID"):
        raise ClaimError(
            f"claim {ref}: device {name} is shared by MIG slices but its allocation has no "
            "shareID; is the DRAConsumableCapacity feature on in the scheduler?"
        )
    try:
        slices = slices_of(result.get("consumedCapacity"))
        if is_whole(entry.gpu, slices):
            return None
        profile = profile_for(entry.gpu, slices)
        held = used.get(entry.gpu.uuid, ())
        same = list((kinds or {}).get(entry.gpu.uuid, ())).count(profile.profile_id)
        if recorded is not None and recorded.profile_id == profile.profile_id:
            before = Placement(start=recorded.start, size=recorded.size)
            fits = same < profile.instance_count
            if fits and not any(p is None or overlaps(before, p) for p in held):
                return PlacementSpec(entry.gpu, profile, before)
        return choose_placement(entry.gpu, profile, held, same)
    except NoPlacement as exc:
        raise NoPlacementError(f"claim {ref}: device {name}: {exc}", (entry.gpu.uuid,)) from None
    except SlicesError as exc:
        raise ClaimError(f"claim {ref}: device {name}: {exc}") from None


def device_records(plan: Plan, node_name: str) -> list[DeviceRecord]:
    """The checkpoint records of a planned claim's devices (before any step is taken)."""
    records = []
    for device, result, spec in zip(plan.devices, plan.results, plan.carve, strict=True):
        admin = bool(result.get("adminAccess"))
        strategy = (
            device.config.sharing.strategy if device.config and device.config.sharing else None
        )
        records.append(
            DeviceRecord(
                request_names=list(device.requests),
                pool_name=node_name,
                device_name=device.device_name,
                cdi_device_ids=[cdi_device_id(plan.ref.uid, device.device_name, device.share_id)],
                share_id=result.get("shareID"),
                uuid="" if spec else device.uuid,
                sharing="admin" if admin else strategy,
                mig=mig_record(spec) if spec else None,
                consumed_capacity=(
                    {str(k): str(v) for k, v in (result.get("consumedCapacity") or {}).items()}
                    if device.slices_share
                    else None
                ),
            )
        )
    return records


def holders(claims: Mapping[str, ClaimRecord]) -> dict[str, str]:
    """Device name -> UID of the claim holding it exclusively, or of a share of it."""
    held: dict[str, str] = {}
    for uid, rec in claims.items():
        for dev in rec.devices:
            if dev.sharing != "admin":
                held[dev.device_name] = uid
    return held


def shared_devices(claims: Mapping[str, ClaimRecord]) -> set[str]:
    """Devices held by shares (several claims may hold a share of a shared GPU)."""
    return {d.device_name for r in claims.values() for d in r.devices if is_share(d)}


def footprint(rec: DeviceRecord, catalog: Catalog) -> Footprint | None:
    """Which part of which GPU a recorded device occupies."""
    if rec.mig is not None:
        return rec.mig.gpu_uuid, Placement(start=rec.mig.start, size=rec.mig.size)
    entry = catalog.get(rec.device_name)
    if entry is None:
        return None
    if entry.placement is not None:
        return entry.gpu.uuid, entry.placement.placement
    return entry.gpu.uuid, entry.mig.placement if entry.mig else None


def check_within(ref: ClaimRef, records: Sequence[DeviceRecord], catalog: Catalog) -> None:
    """One claim holds no device twice, nor a whole GPU beside a MIG device of it, nor
    overlapping MIG devices: the API server accepts such a status, the GPU cannot."""
    for i, rec in enumerate(records):
        for other in records[:i]:
            two_shares = is_share(rec) and is_share(other) and rec.share_id != other.share_id
            if two_shares and memory_share(rec, catalog) and memory_share(other, catalog):
                continue  # two shares of one shared GPU: distinct CDI devices, by design
            if rec.device_name == other.device_name and not two_shares:
                raise ClaimError(
                    f"claim {ref}: device {rec.device_name} is allocated to it twice; a device "
                    "can be prepared once per claim: delete the pod so the claim is allocated "
                    "again"
                )
            mine, theirs = footprint(rec, catalog), footprint(other, catalog)
            if _clash(mine, theirs):
                raise ClaimError(
                    f"claim {ref}: devices {other.device_name} and {rec.device_name} are parts "
                    f"of the same GPU {mine[0] if mine else ''} and cannot be used together (a "
                    "whole GPU and its MIG devices exclude each other)"
                )


def _clash(mine: Footprint | None, theirs: Footprint | None) -> bool:
    """Whether two footprints take the same part of one GPU."""
    if mine is None or theirs is None or mine[0] != theirs[0]:
        return False
    return mine[1] is None or theirs[1] is None or overlaps(mine[1], theirs[1])


def check_gpu_free(
    ref: ClaimRef,
    records: Sequence[DeviceRecord],
    others: Sequence[tuple[str, DeviceRecord]],
    catalog: Catalog,
    claims: Mapping[str, ClaimRecord],
) -> None:
    """Dynamic MIG: a whole GPU and MIG devices of it (or overlapping ones) exclude each other.

    The scheduler's counters already prevent such allocations; this double-checks, and
    it is what keeps MIG mode from changing under a claim that holds the whole GPU.
    """
    # Shares of a shared GPU are whole-GPU users that coexist by design (a shared GPU has
    # no MIG placements published).
    taken = [
        (uid, r, footprint(r, catalog))
        for uid, r in others
        if r.sharing != "admin" and not memory_share(r, catalog)
    ]
    for rec in records:
        mine = footprint(rec, catalog)
        if mine is None or rec.sharing == "admin" or memory_share(rec, catalog):
            continue
        for uid, other, theirs in taken:
            if uid != ref.uid and _clash(mine, theirs):
                holder = claims.get(uid)
                owner = f"{holder.namespace}/{holder.name}" if holder else uid
                raise ClaimError(
                    f"claim {ref}: device {rec.device_name} cannot be prepared while claim "
                    f"{owner} holds {other.device_name} on the same GPU {mine[0]} (a whole "
                    "GPU and its MIG devices exclude each other; MIG mode can only change "
                    "on an idle GPU)"
                )


def check_free(
    ref: ClaimRef,
    records: Sequence[DeviceRecord],
    held: Mapping[str, str],
    shared: set[str],
    claims: Mapping[str, ClaimRecord],
) -> None:
    """The last line of defence against double allocation.

    Shares of a shared GPU may hold it together (``shared``: devices held by shares); an
    exclusive claim and a share may not.
    """
    for rec in records:
        holder = held.get(rec.device_name)
        if rec.sharing == "admin" or holder in (None, ref.uid):
            continue
        if is_share(rec) and rec.device_name in shared:
            continue
        other = claims.get(holder) if holder else None
        owner = f"{other.namespace}/{other.name}" if other else holder
        raise ClaimError(
            f"claim {ref}: device {rec.device_name} is already prepared for claim {owner}"
        )


def is_share(rec: DeviceRecord) -> bool:
    """Whether the record is one of several allocations of one device (a share of a shared
    GPU or of a GPU's MIG slices): it records what the share consumed."""
    return rec.consumed_capacity is not None


def memory_share(rec: DeviceRecord, catalog: Catalog) -> bool:
    """Whether the record is a share of a shared GPU (MPS limits, no part of the GPU its own)."""
    entry = catalog.get(rec.device_name)
    return is_share(rec) and entry is not None and entry.shared


def mig_record(spec: PlacementSpec) -> MigRecord:
    """The checkpoint record of a MIG device to create, written before it is created."""
    return MigRecord(
        gpu_uuid=spec.gpu.uuid,
        profile_id=spec.profile.profile_id,
        profile=spec.profile.name,
        start=spec.placement.start,
        size=spec.placement.size,
    )


def prepared_devices(record: ClaimRecord) -> list[PreparedDevice]:
    """What the kubelet is told about a prepared claim."""
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
