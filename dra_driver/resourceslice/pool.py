"""The desired state of one driver's pool on one node, and how it becomes ResourceSlice objects.

Devices and counter sets are plain ``resource.k8s.io/v1`` JSON dicts (camelCase field names),
so this package stays independent of any particular driver and of the generated API models.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver import resourceapi
from dra_driver.resourceslice.publisher import Publisher, annotation_key

KIND = "ResourceSlice"

#: Validation limits of resource.k8s.io/v1 (see the ResourceSlice validation code).
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_EXTRAS = 64
MAX_COUNTER_SETS_PER_SLICE = 8

_NAME_MAX = 253

JSON = dict[str, Any]


@dataclass(frozen=True)
class SliceContent:
    """What one slice carries: devices or shared counter sets (since Kubernetes 1.35 a slice
    has one or the other; 1.34 wants each counter set in the slice of the devices that
    consume it, see :func:`inline_counters`)."""

    devices: tuple[JSON, ...] = ()
    shared_counters: tuple[JSON, ...] = ()


@dataclass(frozen=True)
class NodeOwner:
    """The Node a pool belongs to; slices point at it so deleting the node removes them."""

    name: str
    uid: str


@dataclass(frozen=True)
class DesiredPool:
    """Everything one node agent wants the API server to hold for its pool."""

    driver: str
    pool_name: str
    node_name: str
    slices: tuple[SliceContent, ...] = field(default_factory=tuple)


def _device_needs_small_slice(device: Mapping[str, Any]) -> bool:
    """Devices with taints, counters or list attributes lower the per-slice limit to 64."""
    if device.get("taints") or device.get("consumesCounters"):
        return True
    attrs = device.get("attributes") or {}
    lists = resourceapi.LIST_KINDS
    return any(isinstance(v, Mapping) and any(k in v for k in lists) for v in attrs.values())


def pack_devices(devices: Sequence[JSON]) -> list[tuple[JSON, ...]]:
    """Split devices into as few slices as the API's per-slice limits allow, keeping order.

    A slice may hold 128 devices, or 64 when any device in it has taints, consumes counters or
    has list attributes; packing is greedy so that a change to one device moves as few devices
    between slices as possible.
    """
    chunks: list[tuple[JSON, ...]] = []
    current: list[JSON] = []
    small = False
    for device in devices:
        needs_small = small or _device_needs_small_slice(device)
        limit = MAX_DEVICES_PER_SLICE_WITH_EXTRAS if needs_small else MAX_DEVICES_PER_SLICE
        if len(current) + 1 > limit:
            chunks.append(tuple(current))
            current, small = [], _device_needs_small_slice(device)
        else:
            small = needs_small
        current.append(device)
    if current:
        chunks.append(tuple(current))
    return chunks


def pack_counter_sets(counter_sets: Sequence[JSON]) -> list[tuple[JSON, ...]]:
    """Split counter sets into slices of at most eight sets each."""
    step = MAX_COUNTER_SETS_PER_SLICE
    return [tuple(counter_sets[i : i + step]) for i in range(0, len(counter_sets), step)]


def contents_for(
    devices: Sequence[JSON],
    counter_sets: Sequence[JSON] = (),
    groups: Iterable[Sequence[JSON]] = (),
) -> tuple[SliceContent, ...]:
    """Build slice contents: counter sets first, then explicit device groups, then the rest.

    ``groups`` lets a driver keep related devices together (for example one GPU and its
    partitions per slice); each group is packed on its own.
    """
    out = [SliceContent(shared_counters=c) for c in pack_counter_sets(counter_sets)]
    for group in groups:
        out.extend(SliceContent(devices=c) for c in pack_devices(group))
    out.extend(SliceContent(devices=c) for c in pack_devices(devices))
    return tuple(out)


def inline_counters(pool: DesiredPool) -> DesiredPool | None:
    """The pool laid out as Kubernetes 1.34 wants it: each counter set in the one slice whose
    devices consume it, no counter-only slices. None when a counter set is consumed from
    several slices (1.34 cannot express that pool)."""
    sets = {str(c["name"]): c for content in pool.slices for c in content.shared_counters}
    if not sets:
        return pool
    owner: dict[str, int] = {}
    out: list[SliceContent] = []
    for content in pool.slices:
        if not content.devices:
            continue
        used = {
            str(c["counterSet"]) for d in content.devices for c in d.get("consumesCounters") or ()
        }
        if any(owner.setdefault(name, len(out)) != len(out) for name in used):
            return None
        mine = tuple(sets[name] for name in sorted(used) if name in sets)
        out.append(SliceContent(devices=content.devices, shared_counters=mine))
    return DesiredPool(pool.driver, pool.pool_name, pool.node_name, tuple(out))


def slice_name(node_name: str, driver: str, index: int) -> str:
    """Deterministic slice name ``<node>-<driver>-<index>``, hashed down when too long.

    Deterministic names make creates idempotent (a retried create finds its own slice) and let
    an operator see at a glance which node and driver a slice belongs to.
    """
    name = f"{node_name}-{driver}-{index}"
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(f"{node_name}/{driver}".encode()).hexdigest()[:16]
    suffix = f"-{digest}-{index}"
    return node_name[: _NAME_MAX - len(suffix)].rstrip(".-") + suffix


def render_slice(
    pool: DesiredPool,
    index: int,
    generation: int,
    owner: NodeOwner | None = None,
    publisher: Publisher | None = None,
) -> JSON:
    """Render slice ``index`` of ``pool`` as a complete ResourceSlice object.

    ``publisher``, when given, is recorded in an annotation (see :mod:`.publisher`).
    """
    content = pool.slices[index]
    spec: JSON = {
        "driver": pool.driver,
        "pool": {
            "name": pool.pool_name,
            "generation": generation,
            "resourceSliceCount": len(pool.slices),
        },
        "nodeName": pool.node_name,
    }
    if content.shared_counters:
        spec["sharedCounters"] = [dict(c) for c in content.shared_counters]
        # A counter-only slice still names its node; the API requires exactly one node selector.
    if content.devices or not content.shared_counters:
        spec["devices"] = [dict(d) for d in content.devices]
    metadata: JSON = {"name": slice_name(pool.node_name, pool.driver, index)}
    if publisher is not None:
        metadata["annotations"] = {annotation_key(pool.driver): publisher.annotation()}
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
            }
        ]
    return {"apiVersion": resourceapi.API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def render_pool(
    pool: DesiredPool,
    generation: int = 1,
    owner: NodeOwner | None = None,
    publisher: Publisher | None = None,
) -> list[JSON]:
    """Render every slice of ``pool`` for one generation."""
    return [render_slice(pool, i, generation, owner, publisher) for i in range(len(pool.slices))]
