"""Shared GPUs (pure): which GPUs a node shares by memory, how they are published, and what
each claim's share of one is.

``--shared-gpus`` (``DRA_SHARED_GPUS``, parsed by :mod:`selection`) picks them; empty (the
default) shares none.

A shared GPU is published with ``allowMultipleAllocations: true``: the scheduler hands it to
several claims and counts what each consumes of its capacities (DRAConsumableCapacity):

- ``memory``: the GPU's memory; a request takes at least 1Gi, in steps of 1Gi (default 1Gi).
  A selected GPU with less than 2Gi (a unified-memory GPU such as GB10 has none of its own) is
  published whole instead: the API server refuses that request policy on it.
- ``compute``: 100 (percent of the GPU's SMs); a request takes 0 (no limit, the default) to 100.
- ``multiprocessors``: stays readable for selectors but is never consumed (``validValues [0]``);
  ask for SMs through ``compute``.

Each share's memory and compute become MPS client limits (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``,
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) under one MPS daemon per GPU.

A GPU in MIG mode is not shared (its MIG devices are published instead), and with dynamic MIG a
shared GPU publishes no MIG placements: MIG would repartition the memory and SMs the shares were
counted against, and changing MIG mode needs an idle GPU, which a shared GPU rarely is.

Shares: what a claim was given, and whether it still fits.

The scheduler allocates a shared GPU to several claims and records in each allocation result a
``shareID`` and the ``consumedCapacity`` it counted (``memory``, ``compute``). The driver turns
that into MPS client limits and keeps its own sum per GPU, so that a stale or hand-made
allocation cannot promise more memory than the GPU has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from dra_driver.errors import PrepareError
from dra_driver.gpu.allocation import AllocatedDevice, Share
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.sharing.mps import daemon_for, gpu_daemon_id, to_record
from dra_driver.gpu.sharing.selection import Selection
from dra_driver.gpu.sharing.strategy import Strategy, sharable
from dra_driver.gpu.state.checkpoint import ClaimRecord
from dra_driver.quantity import QuantityError, parse_quantity

log = structlog.get_logger(__name__)

JSON = dict[str, Any]
GIB = 2**30

#: The requestPolicy of a shared GPU's ``memory``: 1Gi steps, at least 1Gi.
MEMORY_STEP = GIB
#: The least memory a shared GPU can have: the API server refuses a request policy whose
#: minimum (one step), or minimum plus one step, is more than the capacity
#: (validateRequestPolicyRange), and with it the whole slice.
MIN_SHARED_MEMORY = 2 * MEMORY_STEP
#: The ``compute`` capacity: a percentage of the GPU's SMs.
COMPUTE_TOTAL = 100


def shared_uuids(inventory: Inventory, selection: Selection) -> frozenset[str]:
    """UUIDs of the GPUs to share: selected, not in MIG mode, with at least
    :data:`MIN_SHARED_MEMORY`.

    A selected GPU with less memory (a unified-memory GPU such as GB10 is published with memory
    0) is left out, with a warning, and so published whole.
    """
    candidates = [g for g in inventory.gpus if selection.matches(g) and not g.mig_enabled]
    for gpu in candidates:
        if gpu.memory_bytes < MIN_SHARED_MEMORY:
            log.warning(
                "GPU has too little memory of its own to be shared by memory; publishing it whole",
                gpu=gpu.uuid,
                minor=gpu.minor,
                memory_bytes=gpu.memory_bytes,
                needed_bytes=MIN_SHARED_MEMORY,
            )
    return frozenset(g.uuid for g in candidates if g.memory_bytes >= MIN_SHARED_MEMORY)


def memory_policy() -> JSON:
    """``requestPolicy`` of a shared GPU's memory: at least one step, whole steps, one by
    default (the maximum is the capacity itself)."""
    step = str(MEMORY_STEP)
    return {"default": step, "validRange": {"min": step, "step": step}}


def shared_device(device: JSON) -> JSON:
    """A whole-GPU device as a shared one: multiple allocations, consumable capacities."""
    capacity = dict(device.get("capacity") or {})
    capacity["memory"] = {**capacity["memory"], "requestPolicy": memory_policy()}
    if "multiprocessors" in capacity:
        capacity["multiprocessors"] = {
            **capacity["multiprocessors"],
            "requestPolicy": {"default": "0", "validValues": ["0"]},
        }
    capacity["compute"] = {
        "value": str(COMPUTE_TOTAL),
        "requestPolicy": {
            "default": "0",
            "validRange": {"min": "0", "max": str(COMPUTE_TOTAL), "step": "1"},
        },
    }
    return {**device, "allowMultipleAllocations": True, "capacity": capacity}


MEMORY = "memory"
COMPUTE = "compute"


class ShareError(PrepareError, ValueError):
    """A share cannot be prepared; the message says why."""


def _whole(text: str, name: str) -> int:
    try:
        value = parse_quantity(str(text)).value()
    except QuantityError as exc:
        raise ShareError(f"consumed capacity {name}={text!r} is not a quantity: {exc}") from None
    if value < 0:
        raise ShareError(f"consumed capacity {name}={text!r} is negative")
    return value


def consumed(capacity: Mapping[str, Any] | None) -> dict[str, int]:
    """The consumed capacity of an allocation result, as whole numbers by unqualified name."""
    out: dict[str, int] = {}
    for name, value in (capacity or {}).items():
        out[str(name).rpartition("/")[2]] = _whole(str(value), str(name))
    return out


def share_of(share_id: str, capacity: Mapping[str, Any] | None) -> Share:
    """The share an allocation result describes; it must say how much memory it got."""
    amounts = consumed(capacity)
    if amounts.get(MEMORY, 0) <= 0:
        raise ShareError(
            f"share {share_id} has no memory in its consumed capacity "
            f"({dict(capacity or {})}); is the DRAConsumableCapacity feature on?"
        )
    compute = amounts.get(COMPUTE)
    if compute is not None and not 0 <= compute <= 100:
        raise ShareError(f"share {share_id}: compute {compute} is not a percentage")
    return Share(share_id=share_id, memory_bytes=amounts[MEMORY], compute_percent=compute)


def memory_in_use(claims: Iterable[ClaimRecord], uuid: str) -> int:
    """Memory the prepared shares on GPU ``uuid`` hold, in bytes."""
    total = 0
    for claim in claims:
        for device in claim.devices:
            if device.uuid == uuid and device.share_id and device.consumed_capacity:
                total += consumed(device.consumed_capacity).get(MEMORY, 0)
    return total


def check_fits(share: Share, in_use: int, gpu_memory: int, *, gpu: str) -> None:
    """Refuse a share that would take the GPU's prepared shares past its memory."""
    if in_use + share.memory_bytes > gpu_memory:
        gib = 2**30
        raise ShareError(
            f"share {share.share_id} asks for {share.memory_bytes / gib:.1f} GiB of GPU {gpu} "
            f"but prepared shares already hold {in_use / gib:.1f} GiB of its "
            f"{gpu_memory / gib:.1f} GiB (the allocation is stale or over-committed)"
        )


class SharedGpus(Strategy):
    """Shares of shared GPUs: one MPS daemon per GPU, each share limited by what it was given."""

    def check(
        self, claim: str, devices: Sequence[AllocatedDevice], prepared: Sequence[ClaimRecord]
    ) -> None:
        """Refuse sharing settings on a share (MPS already shares it) and shares beyond a
        GPU's memory."""
        added: dict[str, int] = {}
        for device in devices:
            if device.share is None:
                continue
            if device.strategy is not None:
                raise ShareError(
                    f"claim {claim}: device {device.device_name} is a share of a shared GPU, "
                    f"which MPS already shares; remove the {device.strategy} config"
                )
            uuid = device.gpu.uuid
            in_use = memory_in_use(prepared, uuid) + added.get(uuid, 0)
            try:
                check_fits(device.share, in_use, device.gpu.memory_bytes, gpu=uuid)
            except ShareError as exc:
                raise ShareError(f"claim {claim}: device {device.device_name}: {exc}") from None
            added[uuid] = added.get(uuid, 0) + device.share.memory_bytes

    def daemons(self, devices: Sequence[AllocatedDevice]) -> set[str]:
        """The daemons of the GPUs the claim holds shares of."""
        return {gpu_daemon_id(d.gpu.minor) for d in devices if d.share is not None}

    def annotate(
        self,
        claim_uid: str,
        devices: Sequence[AllocatedDevice],
        record: ClaimRecord,
        mps_root: Path,
    ) -> None:
        """Record each share's consumed capacity and its GPU's daemon."""
        for device, rec in sharable(devices, record):
            if device.share is None:
                continue
            rec.consumed_capacity = {
                MEMORY: str(device.share.memory_bytes),
                **(
                    {COMPUTE: str(device.share.compute_percent)}
                    if device.share.compute_percent is not None
                    else {}
                ),
            }
            daemon = daemon_for(mps_root, gpu_daemon_id(device.gpu.minor), [device.gpu.uuid])
            rec.mps = to_record(daemon)
