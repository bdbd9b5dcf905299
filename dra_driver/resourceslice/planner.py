"""Decide which ResourceSlice writes turn the stored state of a pool into the desired one.

Pure: no I/O, no clock. The controller feeds it the slices it watches and executes the result.

Slice ``i`` of a pool has the deterministic name ``slice_name(node, driver, i)``. Stored slices
are matched to desired indices by that name first, then (for slices named differently, e.g. by an
older naming scheme) by content, so an old slice with the right content is kept rather than
replaced. Everything of this node and driver that matches no index is deleted.

Pool generation rules (what the scheduler needs to see a consistent pool):

* first publish: generation 1;
* nothing changed: same generation, no writes;
* exactly one slice differs or is missing, the number of slices stays the same and every other
  slice already belongs to the current generation: that one slice is written at the same
  generation, so the pool never looks incomplete or mixed;
* anything else (several slices change, slices added or removed, a mixed pool): generation + 1
  and every slice is written.

When the controller has a :class:`~dra_driver.resourceslice.publisher.Publisher`, every written
slice records it, and a pool holding a slice recorded by a newer publisher (a newer agent pod on
the same node, during a rolling update) is left to that publisher: the plan is empty and
``yielded_to`` names it.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.resourceslice.normalize import normalize_spec, strip_paths
from dra_driver.resourceslice.pool import DesiredPool, NodeOwner, render_slice, slice_name
from dra_driver.resourceslice.publisher import Publisher, recorded_publisher

JSON = dict[str, Any]


@dataclass
class Plan:
    """Writes to execute, in order: ``creates``, then ``updates``, then ``deletes``.

    New-generation slices come first and obsolete ones last, so the pool is incomplete for as
    short a time as possible.
    """

    creates: list[JSON] = field(default_factory=list)
    updates: list[JSON] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    #: The uid of each slice to delete as planned: its delete is conditional on it, so a
    #: slice of that name created since (a newer agent's) is not deleted in its place.
    delete_uids: dict[str, str] = field(default_factory=dict)
    generation: int = 0
    yielded_to: Publisher | None = None

    @property
    def empty(self) -> bool:
        """True when the stored state already matches: nothing to write."""
        return not (self.creates or self.updates or self.deletes)

    @property
    def writes(self) -> int:
        """Number of API writes executing this plan takes."""
        return len(self.creates) + len(self.updates) + len(self.deletes)


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name", ""))


def _pool_field(obj: Mapping[str, Any], key: str) -> Any:
    pool = _spec(obj).get("pool")
    return pool.get(key) if isinstance(pool, Mapping) else None


def _generation(obj: Mapping[str, Any]) -> int:
    value = _pool_field(obj, "generation")
    return value if isinstance(value, int) else 0


def _without_bookkeeping(spec: Mapping[str, Any]) -> JSON:
    """A shallow copy of ``spec`` without the pool's generation and slice count."""
    out = dict(spec)
    pool = dict(out.get("pool") or {})
    pool.pop("generation", None)
    pool.pop("resourceSliceCount", None)
    out["pool"] = pool
    return out


def _content(spec: Mapping[str, Any], ignored: Iterable[str]) -> JSON:
    """Normalised spec without the generation bookkeeping: what a slice *says*."""
    return normalize_spec(strip_paths(_without_bookkeeping(spec), ignored))


class ContentCache:
    """The contents :func:`plan` compares, kept from one plan to the next.

    Normalising a pool of a few hundred devices (every MIG placement of a GPU) takes tens of
    milliseconds, and a controller plans the same pool against the same stored slices again
    and again (each watch event, each resync). A stored slice's content is kept under its uid
    and resourceVersion, which the API server changes with every change of the object; the
    desired pool's under the pool itself. A plan keeps only what it used, so the cache holds
    one pool's worth.
    """

    def __init__(self) -> None:
        self._stored: dict[tuple[str, str, frozenset[str]], JSON] = {}
        self._previous: dict[tuple[str, str, frozenset[str]], JSON] = {}
        self._wanted: tuple[DesiredPool, frozenset[str], list[JSON]] | None = None
        self._rendered: list[JSON] = []  # the wanted specs as rendered, without bookkeeping

    def start(self) -> None:
        """Begin a plan: what the last one did not use is dropped at the end of this one."""
        self._previous, self._stored = self._stored, {}

    def wanted(self, desired: DesiredPool, ignored: frozenset[str]) -> list[JSON]:
        """The content of each slice of ``desired``."""
        if self._wanted is not None and self._wanted[:2] == (desired, ignored):
            return self._wanted[2]
        rendered = [render_slice(desired, i, 1)["spec"] for i in range(len(desired.slices))]
        content = [_content(spec, ignored) for spec in rendered]
        self._wanted = (desired, ignored, content)
        self._rendered = [_without_bookkeeping(spec) for spec in rendered]
        return content

    def stored(self, obj: Mapping[str, Any], ignored: frozenset[str]) -> JSON:
        """The content of a stored slice."""
        meta = obj.get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not (isinstance(uid, str) and uid and isinstance(version, str) and version):
            return _content(_spec(obj), ignored)  # not as stored: nothing to key it by
        key = (uid, version, ignored)
        found = self._stored.get(key)
        if found is None:
            found = self._previous.get(key)
            if found is None:
                found = self._as_rendered(obj, ignored)
                if found is None:
                    found = _content(_spec(obj), ignored)
            self._stored[key] = found
        return found

    def _as_rendered(self, obj: Mapping[str, Any], ignored: frozenset[str]) -> JSON | None:
        """The content of ``obj`` when its spec is one of the wanted specs exactly as
        rendered (the usual answer to our own write), taken without normalising it again;
        None otherwise."""
        if self._wanted is None or self._wanted[1] != ignored:
            return None
        raw = _without_bookkeeping(_spec(obj))
        for rendered, content in zip(self._rendered, self._wanted[2], strict=True):
            if rendered == raw:
                return content
        return None


def _owned_by(obj: Mapping[str, Any], owner: NodeOwner) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(
        ref.get("kind") == "Node"
        and ref.get("name") == owner.name
        and ref.get("uid") == owner.uid
        and ref.get("controller") is True
        for ref in refs
    )


def _metadata_current(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    meta = existing.get("metadata") or {}
    wanted_meta = wanted.get("metadata") or {}
    for key in ("labels", "annotations"):
        have = meta.get(key) or {}
        if any(have.get(k) != v for k, v in (wanted_meta.get(key) or {}).items()):
            return False
    return True


def _update_body(existing: Mapping[str, Any], wanted: JSON, owner: NodeOwner | None) -> JSON:
    """A PUT body: the wanted object carrying the stored object's identity and foreign metadata.

    Labels, annotations and owner references set by others are kept; ``resourceVersion`` makes
    the update fail with a conflict if the slice changed since it was observed.
    """
    old = existing.get("metadata") or {}
    new_meta = wanted["metadata"]
    meta: JSON = {"name": new_meta["name"]}
    for key in ("resourceVersion", "uid", "finalizers"):
        if key in old:
            meta[key] = copy.deepcopy(old[key])
    for key in ("labels", "annotations"):
        merged = dict(old.get(key) or {})
        merged.update(new_meta.get(key) or {})
        if merged:
            meta[key] = merged
    refs = [dict(r) for r in old.get("ownerReferences") or []]
    if owner is not None:
        # Replace any stale controller reference to the node (e.g. a recreated Node) with ours.
        refs = [r for r in refs if not (r.get("kind") == "Node" and r.get("controller"))]
        # The API server allows one controller: another object's stays an owner, no longer
        # the controller, or every update of the slice would be refused.
        refs = [{**r, "controller": False} if r.get("controller") else r for r in refs]
        refs.extend(new_meta.get("ownerReferences") or [])
    if refs:
        meta["ownerReferences"] = refs
    return {**wanted, "metadata": meta}


TaintKey = tuple[str, str, str, str]  # device name, taint key, value, effect


def _taint_key(device: Mapping[str, Any], taint: Mapping[str, Any]) -> TaintKey:
    return (
        str(device.get("name") or ""),
        str(taint.get("key") or ""),
        str(taint.get("value") or ""),
        str(taint.get("effect") or ""),
    )


def _taint_times(objs: Iterable[Mapping[str, Any]]) -> dict[TaintKey, Any]:
    """The ``timeAdded`` of every taint the stored slices carry, by device and taint (the
    newest generation's where a leftover of an older one holds the same device)."""
    times: dict[TaintKey, Any] = {}
    for obj in sorted(objs, key=_generation):
        for device in _spec(obj).get("devices") or ():
            if not isinstance(device, Mapping):
                continue
            for taint in device.get("taints") or ():
                if isinstance(taint, Mapping) and taint.get("timeAdded"):
                    times[_taint_key(device, taint)] = taint["timeAdded"]
    return times


def _keep_taint_times(wanted: JSON, times: Mapping[TaintKey, Any]) -> None:
    """Send taints that have no ``timeAdded`` of their own with the one already stored.

    The API server stamps the current time on a taint written without one, on every create
    and update: rewriting a slice for another device's sake (or a new generation) would make
    every taint in it look newly added, and restart the time NoExecute tolerations count from.
    """
    if not times:
        return
    for device in wanted["spec"].get("devices") or ():
        taints = device.get("taints")
        if not taints or all(t.get("timeAdded") for t in taints):
            continue
        # ``device`` is the rendered copy, its taints still the desired pool's: replace them.
        device["taints"] = [
            {**t, "timeAdded": times[_taint_key(device, t)]}
            if not t.get("timeAdded") and _taint_key(device, t) in times
            else t
            for t in taints
        ]


def _is_ours(obj: Mapping[str, Any], desired: DesiredPool) -> bool:
    spec = _spec(obj)
    return spec.get("driver") == desired.driver and spec.get("nodeName") == desired.node_name


def _match(
    ours: Sequence[Mapping[str, Any]],
    desired: DesiredPool,
    wanted_content: Sequence[JSON],
    ignored: frozenset[str],
    cache: ContentCache,
) -> dict[int, Mapping[str, Any]]:
    """Assign stored slices to desired indices; unassigned stored slices are leftovers."""
    canonical = {
        slice_name(desired.node_name, desired.driver, i): i for i in range(len(wanted_content))
    }
    assigned: dict[int, Mapping[str, Any]] = {}
    used: set[int] = set()
    for pos, obj in enumerate(ours):
        index = canonical.get(_name(obj))
        if index is not None and _pool_field(obj, "name") == desired.pool_name:
            assigned[index] = obj
            used.add(pos)
    # Adopt differently named slices whose content is already right (older naming, duplicates):
    # keeping one costs nothing, replacing it would cost a create and a delete.
    by_generation = sorted(
        (pos for pos in range(len(ours)) if pos not in used and _name(ours[pos]) not in canonical),
        key=lambda pos: -_generation(ours[pos]),
    )
    for index, content in enumerate(wanted_content):
        if index in assigned:
            continue
        for pos in by_generation:
            if pos not in used and cache.stored(ours[pos], ignored) == content:
                assigned[index] = ours[pos]
                used.add(pos)
                break
    return assigned


def plan(
    existing: Sequence[Mapping[str, Any]],
    desired: DesiredPool,
    owner: NodeOwner | None,
    ignored_fields: Iterable[str] = (),
    publisher: Publisher | None = None,
    cache: ContentCache | None = None,
    gone: Collection[str] = (),
) -> Plan:
    """Compute the writes that make ``existing`` match ``desired``.

    ``existing`` is what the API server holds; slices of other drivers or nodes are ignored.
    ``owner``, when given, must be the controller owner reference of every slice.
    ``ignored_fields`` are spec paths the API server is known to drop (see
    :mod:`dra_driver.resourceslice.dropped`); they are left out of every comparison so a pool
    the server cannot store exactly does not cause endless updates. ``publisher``, when given,
    is recorded on every slice written, and the plan yields to any newer publisher but the
    ``gone`` ones (ids of newer publishers known to run no more: their slices are taken over).
    ``cache`` keeps what was compared for the next plan of the same pool (see
    :class:`ContentCache`); the plan is the same with or without it.
    """
    ignored = frozenset(ignored_fields)
    cache = cache if cache is not None else ContentCache()
    cache.start()
    ours = sorted((obj for obj in existing if _is_ours(obj, desired)), key=_name)
    if publisher is not None:
        newer = [
            p
            for p in (recorded_publisher(obj, desired.driver) for obj in ours)
            if p is not None and p.rank > publisher.rank and p.id not in gone
        ]
        if newer:
            return Plan(generation=max(map(_generation, ours)), yielded_to=max(newer))
    same_pool = [obj for obj in ours if _pool_field(obj, "name") == desired.pool_name]
    current = max((_generation(obj) for obj in same_pool), default=0)
    count = len(desired.slices)

    wanted_content = cache.wanted(desired, ignored)
    assigned = _match(ours, desired, wanted_content, ignored, cache)
    unassigned = [obj for obj in ours if all(obj is not a for a in assigned.values())]
    leftovers = sorted(_name(obj) for obj in unassigned)

    def consistent(obj: Mapping[str, Any]) -> bool:
        return _generation(obj) == current and _pool_field(obj, "resourceSliceCount") == count

    changed = [
        i
        for i in range(count)
        if i not in assigned or cache.stored(assigned[i], ignored) != wanted_content[i]
    ]
    others_consistent = all(consistent(obj) for i, obj in assigned.items() if i not in changed)
    # Adding or removing slices changes resourceSliceCount, which every slice carries.
    same_size = {
        _pool_field(obj, "resourceSliceCount") for obj in same_pool if _generation(obj) == current
    } == {count}

    if not same_pool and not ours:
        generation = 1 if count else 0
    elif current > 0 and len(changed) <= 1 and others_consistent and same_size:
        generation = current
    else:
        generation = current + 1
    result = Plan(generation=generation if count else current)
    times = _taint_times(same_pool)

    for i in range(count):
        wanted = render_slice(desired, i, generation, owner, publisher)
        _keep_taint_times(wanted, times)
        obj = assigned.get(i)
        if obj is None:
            if wanted["metadata"]["name"] not in leftovers:
                result.creates.append(wanted)
            # else: a slice of that name must go first (its pool name cannot be changed); the
            # create follows on the next reconcile, once the delete has been observed.
            continue
        needs_write = (
            i in changed
            or not consistent(obj)
            or generation != current
            or (owner is not None and not _owned_by(obj, owner))
            or not _metadata_current(obj, wanted)
        )
        if needs_write:
            # An adopted slice keeps its own name: renaming would be a create plus a delete.
            wanted["metadata"]["name"] = _name(obj)
            result.updates.append(_update_body(obj, wanted, owner))
    result.deletes = leftovers
    result.delete_uids = {
        _name(obj): str(uid)
        for obj in unassigned
        if (uid := (obj.get("metadata") or {}).get("uid"))
    }
    return result
