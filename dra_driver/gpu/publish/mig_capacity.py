"""Dynamic MIG by capacity (``--mig-layout capacity``): one device per GPU, carved on demand.

The placement layout (:mod:`.partitions`) publishes every placement of every profile, 26
devices per H100, and the scheduler converts and evaluates each of them on every candidate
node for every pod. Here a MIG-capable GPU is one device that several claims share
(``allowMultipleAllocations``, DRAConsumableCapacity) by two capacities:

- ``computeSlices``: the GPU's compute slices (7 on A100 and H100);
- ``memorySlices``: its memory slices (8).

A claim without a capacity request takes all of both (the request policy's default): the
whole GPU. A MIG claim requests its profile's slices (1g.10gb: 1 and 1; 3g.40gb: 3 and 4);
the scheduler only counts, and the agent chooses the placement when it creates the MIG
device (:func:`choose_placement`), before the pod is bound when binding conditions are on.
Counting cannot see placement: a mix of sizes that fits by count may not fit on the GPU, and
then creating the device fails and the pod is scheduled again (binding failure condition).

Profiles with the same slices as another (``1g.10gb+me`` beside ``1g.10gb``) and the
full-GPU profile (``7g.80gb``; the whole GPU is what a claim for all slices gets) are not
offered. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.errors import PrepareError
from dra_driver.gpu.inventory import Gpu, MigProfile, Placement
from dra_driver.gpu.mig.backend import overlaps
from dra_driver.gpu.publish.partitions import PlacementSpec, memory_slices, publish_order
from dra_driver.quantity import QuantityError, parse_quantity

JSON = dict[str, Any]

COMPUTE = "computeSlices"
MEMORY = "memorySlices"


class SlicesError(PrepareError, ValueError):
    """An allocation's slices name no MIG profile, or no placement of it is free."""


class NoPlacement(SlicesError):
    """The slices fit the GPU by count, but no placement of the profile is free."""


def offered(gpu: Gpu) -> dict[tuple[int, int], MigProfile]:
    """(compute, memory slices) -> the profile a share of that size becomes.

    Of profiles with equal slices the plain one wins (``1g.10gb`` over ``1g.10gb+me``); the
    full size is the whole GPU, not a profile.
    """
    full = totals(gpu)
    out: dict[tuple[int, int], MigProfile] = {}
    for profile in sorted(gpu.mig_profiles, key=lambda p: ("+" in p.name, p.name)):
        if not profile.placements:
            continue
        key = (profile.slice_count, profile.placements[0].size)
        if Slices(*key) != full:
            out.setdefault(key, profile)
    return out


def _valid(total: int, values: Iterable[int]) -> list[int]:
    """The sizes a request of one capacity is rounded up to: the profiles' and all of it."""
    return sorted({*values, total})


def _policy(total: int, values: Iterable[int]) -> JSON:
    valid = _valid(total, values)
    return {
        "value": str(total),
        "requestPolicy": {"default": str(total), "validValues": [str(v) for v in valid]},
    }


def capacity_device(device: JSON, gpu: Gpu) -> JSON:
    """A whole-GPU device as the GPU's MIG capacity.

    Its ``memory`` and ``multiprocessors`` stay readable for selectors but are never
    consumed (``validValues [0]``): what a share takes is counted in slices.
    """
    sizes, whole = offered(gpu), totals(gpu)
    capacity = {
        name: {**value, "requestPolicy": {"default": "0", "validValues": ["0"]}}
        for name, value in (device.get("capacity") or {}).items()
    }
    capacity[COMPUTE] = _policy(whole.compute, (c for c, _ in sizes))
    capacity[MEMORY] = _policy(whole.memory, (m for _, m in sizes))
    return {**device, "allowMultipleAllocations": True, "capacity": capacity}


def _count(capacity: Mapping[str, Any], name: str) -> int:
    text = capacity.get(name)
    if text is None:
        raise SlicesError(f"its consumed capacity has no {name}")
    try:
        value = parse_quantity(str(text)).value()
    except QuantityError as exc:
        raise SlicesError(f"consumed capacity {name}={text!r} is not a quantity: {exc}") from None
    if value <= 0:
        raise SlicesError(f"consumed capacity {name}={text!r} is not positive")
    return value


@dataclass(frozen=True)
class Slices:
    """What one share of a GPU's MIG capacity was counted as."""

    compute: int
    memory: int

    def __str__(self) -> str:
        return f"{COMPUTE} {self.compute}, {MEMORY} {self.memory}"


def totals(gpu: Gpu) -> Slices:
    """All the GPU's slices: compute those of its largest profile, memory those its
    placements span (7 and 8 on A100 and H100). A share of all of them is the whole GPU.

    ``--mig-profiles`` narrows the GPU's profiles before the catalogue is built, and those left
    need not span the GPU (``1g.10gb`` alone spans 1 compute and 7 memory slices of an H100):
    published as totals they would let the scheduler fit one 1g.10gb share per GPU where seven
    fit. So :func:`~dra_driver.gpu.publish.profiles.restrict_profiles` keeps the totals of the
    full list on the GPU (``mig_compute_slices``, ``mig_memory_slices``), used here, and the
    narrowed list only narrows the sizes offered. Publishing (:func:`capacity_device`) and
    prepare (:func:`is_whole`, :func:`profile_for`) both count with these totals.
    """
    compute = gpu.mig_compute_slices
    if compute is None:
        compute = max((p.slice_count for p in gpu.mig_profiles), default=0)
    memory = gpu.mig_memory_slices
    return Slices(compute, memory_slices(gpu) if memory is None else memory)


def slices_of(capacity: Mapping[str, Any] | None) -> Slices:
    """The slices an allocation result's ``consumedCapacity`` counted (unqualified names)."""
    plain = {str(k).rpartition("/")[2]: v for k, v in (capacity or {}).items()}
    return Slices(_count(plain, COMPUTE), _count(plain, MEMORY))


def is_whole(gpu: Gpu, slices: Slices) -> bool:
    """Whether a share counted as every slice of the GPU (the whole GPU)."""
    return slices == totals(gpu)


def profile_for(gpu: Gpu, slices: Slices) -> MigProfile:
    """The profile a share of ``slices`` becomes; refuses sizes no profile has."""
    sizes = offered(gpu)
    profile = sizes.get((slices.compute, slices.memory))
    if profile is None:
        # The scheduler cannot refuse such a pair (each capacity's requestPolicy stands
        # alone), so it allocates it again after every failure: this message is all the user
        # gets, and the pair counted is often not the one written (defaults, rounding).
        whole = totals(gpu)
        pairs = ", ".join(f"{p.name} ({c} and {m})" for (c, m), p in sorted(sizes.items()))
        compute = ", ".join(str(v) for v in _valid(whole.compute, (c for c, _ in sizes)))
        memory = ", ".join(str(v) for v in _valid(whole.memory, (m for _, m in sizes)))
        raise SlicesError(
            f"{slices} match no MIG profile of GPU {gpu.uuid}: request {COMPUTE} and "
            f"{MEMORY} together as one of: {pairs}, or neither for the whole GPU; a "
            f"capacity not requested counts as all of its slices, and each is rounded up "
            f"to its next valid size ({COMPUTE} {compute}; {MEMORY} {memory})"
        )
    return profile


def choose_placement(
    gpu: Gpu, profile: MigProfile, taken: Iterable[Placement | None], same: int = 0
) -> PlacementSpec:
    """Where a new MIG device of ``profile`` goes, beside the parts of ``gpu`` already
    ``taken`` (None: the whole GPU), ``same`` of them of ``profile``: the highest free
    placement, as the placement layout orders them, which keeps the low slices free for the
    large profiles."""
    held = list(taken)
    if any(p is None for p in held):
        raise SlicesError(f"GPU {gpu.uuid} is held whole by another claim")
    if same >= profile.instance_count:
        # Counting cannot see it either: 1g.10gb+me exists once per GPU.
        raise NoPlacement(
            f"GPU {gpu.uuid} holds {same} {profile.name} MIG device(s), as many as it allows "
            "(the slices fit by count but not by instance limit); the pod is scheduled again"
        )
    for spec in publish_order(gpu):
        if spec.profile.profile_id != profile.profile_id:
            continue
        if not any(p is not None and overlaps(spec.placement, p) for p in held):
            return spec
    raise NoPlacement(
        f"no placement of {profile.name} is free on GPU {gpu.uuid} beside the MIG devices "
        "there (the slices fit by count but not by position); the pod is scheduled again"
    )
