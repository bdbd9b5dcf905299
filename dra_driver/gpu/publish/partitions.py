"""Dynamic MIG publishing: every possible MIG placement as a device that consumes counters.

With partitionable devices (resource.k8s.io/v1 ``sharedCounters`` / ``consumesCounters``) the
scheduler itself keeps allocations of one GPU consistent: each MIG-capable GPU gets a counter
set ``gpu-<minor>-counter-set``; every placement of every GPU-instance profile is a device that
consumes its share, and the whole GPU consumes everything. Two placements that share a memory
slice both consume that slice's ``memory-slice-<i>`` counter (capacity 1), so they can never be
allocated together; nothing is created on the GPU until a claim is prepared.

Everything here is pure: inventory in, JSON out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from dra_driver.gpu.inventory import Gpu, Inventory, MigProfile, Placement
from dra_driver.gpu.publish.devices import (
    gpu_device,
    mig_device,
    mig_device_name,
    quantity,
)

JSON = dict[str, Any]

#: Engine counters: counter name -> the MigProfile field it counts.
ENGINE_COUNTERS: tuple[tuple[str, str], ...] = (
    ("multiprocessors", "multiprocessors"),
    ("copy-engines", "copy_engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpeg-engines", "jpeg_engines"),
    ("ofa-engines", "ofa_engines"),
    ("memory", "memory_bytes"),
)


def counter_set_name(gpu: Gpu) -> str:
    """``gpu-<minor>-counter-set``."""
    return f"gpu-{gpu.minor}-counter-set"


def memory_slice_counter(index: int) -> str:
    """``memory-slice-<i>``: capacity 1, taken by every placement covering slice ``i``."""
    return f"memory-slice-{index}"


def memory_slices(gpu: Gpu) -> int:
    """How many memory slices the GPU's placements span (8 on A100 and H100)."""
    return max((p.start + p.size for prof in gpu.mig_profiles for p in prof.placements), default=0)


@dataclass(frozen=True)
class PlacementSpec:
    """One possible MIG device: a profile at a placement on a GPU."""

    gpu: Gpu
    profile: MigProfile
    placement: Placement

    @property
    def device_name(self) -> str:
        """The published device name (as for a MIG device that exists)."""
        return mig_device_name(
            self.gpu.minor, self.profile.name, self.profile.profile_id, self.placement.start
        )


def placements(gpu: Gpu) -> list[PlacementSpec]:
    """Every placement of every GPU-instance profile of ``gpu``, in profile order."""
    return [PlacementSpec(gpu, prof, p) for prof in gpu.mig_profiles for p in prof.placements]


def publish_order(gpu: Gpu) -> list[PlacementSpec]:
    """Placements in the order the scheduler should try them: highest start first.

    The scheduler takes the first device that fits and does not look ahead. Large profiles
    can only start at slice 0 (4g, 7g), so small ones are offered from the top down, which
    leaves the low slices free: a 3g.40gb lands at 4 and a 4g.40gb still fits beside it.
    """
    return sorted(placements(gpu), key=lambda s: -s.placement.start)


def consumption(spec: PlacementSpec) -> dict[str, int]:
    """What one placement takes from its GPU's counter set."""
    used = {name: int(getattr(spec.profile, field)) for name, field in ENGINE_COUNTERS}
    for index in range(spec.placement.start, spec.placement.start + spec.placement.size):
        used[memory_slice_counter(index)] = 1
    return used


def _overlap(a: Placement, b: Placement) -> bool:
    return a.start < b.start + b.size and b.start < a.start + a.size


#: Engines a GPU instance holds for itself (its slices already bound SMs and memory).
PARTITIONED_ENGINES: tuple[str, ...] = (
    "copy-engines",
    "decoders",
    "encoders",
    "jpeg-engines",
    "ofa-engines",
)


def full_profile(gpu: Gpu) -> MigProfile | None:
    """The MIG profile whose GPU instance spans every memory slice (``7g.80gb``): the widest
    such in ``gpu.mig_profiles``, else the one --mig-profiles left out (``mig_full_profile``).
    """
    span = gpu.mig_memory_slices or memory_slices(gpu)
    full = [
        p for p in gpu.mig_profiles if any(x.start == 0 and x.size >= span for x in p.placements)
    ]
    return max(full, key=lambda p: p.slice_count) if full else gpu.mig_full_profile


def engine_totals(gpu: Gpu) -> dict[str, int] | None:
    """The engines MIG can hand out on ``gpu``: those of the GPU instance that spans every
    memory slice (:func:`full_profile`); None when the GPU lists no such profile.

    Media extension profiles of different sizes (an A30's ``1g.6gb+me`` and ``2g.12gb+me``,
    or ``+me.all`` beside ``1g``) each allow one instance, yet exclude each other only
    because the GPU has one JPEG or OFA engine, or so many decoders: this is that limit.
    """
    widest = full_profile(gpu)
    if widest is None:
        return None
    fields = dict(ENGINE_COUNTERS)
    return {name: int(getattr(widest, fields[name])) for name in PARTITIONED_ENGINES}


def valid_layouts(gpu: Gpu) -> Iterator[tuple[PlacementSpec, ...]]:
    """Every set of placements the GPU can hold at once: no overlap, per-profile limits,
    and no more of an engine than the GPU has (:func:`engine_totals`).

    A GPU has at most a few dozen placements on 8 memory slices, so a depth-first search
    over them is small (a few hundred layouts for A100 and H100).
    """
    specs = placements(gpu)
    limits = engine_totals(gpu) or {}
    fields = dict(ENGINE_COUNTERS)

    def engines_fit(chosen: tuple[PlacementSpec, ...], cand: PlacementSpec) -> bool:
        return all(
            sum(int(getattr(s.profile, fields[name])) for s in (*chosen, cand)) <= limit
            for name, limit in limits.items()
        )

    def extend(i: int, chosen: tuple[PlacementSpec, ...]) -> Iterator[tuple[PlacementSpec, ...]]:
        yield chosen
        for j in range(i, len(specs)):
            cand = specs[j]
            same = sum(1 for c in chosen if c.profile.profile_id == cand.profile.profile_id)
            if same >= cand.profile.instance_count:
                continue
            if any(_overlap(c.placement, cand.placement) for c in chosen):
                continue
            if not engines_fit(chosen, cand):
                continue
            yield from extend(j + 1, (*chosen, cand))

    return extend(0, ())


def counter_capacity(gpu: Gpu) -> dict[str, int]:
    """The GPU's counter set: enough of every engine for any layout the GPU can hold.

    Engine capacities are the most any valid layout uses (at least the whole GPU's own
    multiprocessors and memory), so the counters never refuse a layout the hardware accepts.
    Valid layouts hold no more of an engine than the GPU has, so where a profile's extra
    engines exist only once (the OFA of ``+me`` profiles), the capacity is that one engine,
    which makes a second ``+me`` instance impossible, of the same profile or another.
    """
    shape = gpu.model_copy(
        update={
            "uuid": "",
            "minor": 0,
            "index": 0,
            "pci_bus_id": "",
            "pcie_root": None,
            "numa_node": None,
            "mig_devices": (),
        }
    )
    capacity = dict(_layout_maxima(shape))
    capacity["multiprocessors"] = max(capacity["multiprocessors"], gpu.multiprocessors)
    capacity["memory"] = max(capacity["memory"], gpu.memory_bytes)
    for index in range(memory_slices(gpu)):
        capacity[memory_slice_counter(index)] = 1
    return capacity


@cache
def _layout_maxima(shape: Gpu) -> tuple[tuple[str, int], ...]:
    # Keyed on the GPU with its identity and placement on the node blanked out: identical
    # products share one search.
    maxima = {name: 0 for name, _ in ENGINE_COUNTERS}
    for layout in valid_layouts(shape):
        for name, _ in ENGINE_COUNTERS:
            maxima[name] = max(maxima[name], sum(consumption(s)[name] for s in layout))
    return tuple(maxima.items())


def _counters(values: Mapping[str, int]) -> JSON:
    return {name: {"value": quantity(v)} for name, v in values.items()}


def counter_set(gpu: Gpu) -> JSON:
    """The GPU's ``sharedCounters`` entry."""
    return {"name": counter_set_name(gpu), "counters": _counters(counter_capacity(gpu))}


def _consumes(gpu: Gpu, values: Mapping[str, int]) -> list[JSON]:
    used = {k: v for k, v in values.items() if v}
    return [{"counterSet": counter_set_name(gpu), "counters": _counters(used)}]


def placement_device(spec: PlacementSpec, inventory: Inventory) -> JSON:
    """The DRA device for a placement: a MIG device's attributes, minus the UUID.

    The MIG device does not exist until a claim for it is prepared, so it has no UUID yet.
    """
    shape = spec.profile.device(spec.placement, uuid="", gi_id=0)
    device = mig_device(spec.gpu, shape, inventory)
    del device["attributes"]["uuid"]
    device["consumesCounters"] = _consumes(spec.gpu, consumption(spec))
    return device


def whole_gpu_device(gpu: Gpu, inventory: Inventory) -> JSON:
    """The whole GPU, consuming its entire counter set (so no MIG device fits beside it)."""
    device = gpu_device(gpu, inventory)
    device["consumesCounters"] = _consumes(gpu, counter_capacity(gpu))
    return device


@dataclass(frozen=True)
class DynamicLayout:
    """What a node publishes with dynamic MIG: counter sets, per-GPU groups, the rest."""

    counter_sets: tuple[JSON, ...]
    groups: tuple[tuple[JSON, ...], ...]
    devices: tuple[JSON, ...]


def dynamic_layout(inventory: Inventory, shared: Collection[str] = ()) -> DynamicLayout:
    """Counter sets and devices for every GPU; MIG-capable GPUs get one slice group each.

    GPUs in ``shared`` (UUIDs of GPUs shared by memory) are published whole, without
    placements: see :mod:`dra_driver.gpu.sharing.shared_gpus`.

    One GPU's group holds its whole-GPU device plus all its placements (25 on an H100),
    well within the 64-device limit for slices whose devices consume counters.
    """
    sets: list[JSON] = []
    groups: list[tuple[JSON, ...]] = []
    plain: list[JSON] = []
    for gpu in inventory.gpus:
        if not gpu.mig.capable or not gpu.mig_profiles or gpu.uuid in shared:
            plain.append(gpu_device(gpu, inventory))
            continue
        sets.append(counter_set(gpu))
        group = [whole_gpu_device(gpu, inventory)]
        group += [placement_device(s, inventory) for s in publish_order(gpu)]
        groups.append(tuple(group))
    return DynamicLayout(tuple(sets), tuple(groups), tuple(plain))
