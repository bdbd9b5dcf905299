"""Table of planner cases: stored slices + desired pool -> writes and generation."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.resourceslice import planner
from dra_driver.resourceslice.planner import ContentCache, Plan, plan
from dra_driver.resourceslice.pool import (
    DesiredPool,
    NodeOwner,
    SliceContent,
    contents_for,
    render_pool,
    slice_name,
)

JSON = dict[str, Any]
DRIVER = "gpu.dra.dev"
NODE = "node-a"
OWNER = NodeOwner(name=NODE, uid="uid-node-a")
_rv = itertools.count(100)


def device(i: int, memory: str = "80Gi") -> JSON:
    return {
        "name": f"gpu-{i}",
        "attributes": {"index": {"int": i}, "model": {"string": "H100"}},
        "capacity": {"memory": {"value": memory}},
    }


def pool_of(*groups: Sequence[JSON], node: str = NODE, driver: str = DRIVER) -> DesiredPool:
    return DesiredPool(
        driver=driver,
        pool_name=node,
        node_name=node,
        slices=tuple(SliceContent(devices=tuple(g)) for g in groups),
    )


def stored(obj: JSON) -> JSON:
    """What the API server would return for ``obj``: identity fields and canonical forms added."""
    out = copy.deepcopy(obj)
    meta = out["metadata"]
    meta.setdefault("uid", f"uid-{meta['name']}")
    meta["resourceVersion"] = str(next(_rv))
    meta.setdefault("creationTimestamp", "2025-01-01T00:00:00Z")
    meta["managedFields"] = [{"manager": "dra-driver", "operation": "Update"}]
    for dev in out["spec"].get("devices", []):
        for cap in dev.get("capacity", {}).values():
            if cap["value"] == "81920Mi":
                cap["value"] = "80Gi"  # the server re-serialises quantities canonically
        for taint in dev.get("taints", []):
            taint.setdefault("timeAdded", "2025-01-01T00:00:00Z")
    return out


def published(
    pool: DesiredPool, generation: int = 1, owner: NodeOwner | None = OWNER
) -> list[JSON]:
    return [stored(s) for s in render_pool(pool, generation, owner)]


def foreign(name: str, driver: str, node: str) -> JSON:
    return stored(render_pool(pool_of([device(0)], node=node, driver=driver), 1, None)[0]) | {
        "metadata": {"name": name, "resourceVersion": "1"}
    }


def names(objs: Sequence[JSON]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


def gens(objs: Sequence[JSON]) -> set[int]:
    return {o["spec"]["pool"]["generation"] for o in objs}


def sname(i: int) -> str:
    return slice_name(NODE, DRIVER, i)


@dataclass
class Case:
    id: str
    existing: Callable[[], list[JSON]]
    desired: DesiredPool
    creates: list[str] = field(default_factory=list)
    updates: list[str] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    generation: int = 1
    owner: NodeOwner | None = OWNER
    ignored: frozenset[str] = frozenset()


THREE = pool_of([device(0)], [device(1)], [device(2)])
BIG = [device(i) for i in range(128)]


def _edited_slice() -> list[JSON]:
    objs = published(THREE, 4)
    objs[0]["spec"]["devices"][0]["attributes"]["model"] = {"string": "hacked"}
    return objs


def _stale_generation_leftover() -> list[JSON]:
    old = stored(render_pool(pool_of([device(9)]), 1, OWNER)[0])
    old["metadata"]["name"] = f"{NODE}-{DRIVER}-old-x7k2p"
    return [*published(THREE, 2), old]


def _duplicate_of_canonical() -> list[JSON]:
    objs = published(THREE, 2)
    dup = copy.deepcopy(objs[1])
    dup["metadata"] = {"name": f"{NODE}-{DRIVER}-q9zzt", "resourceVersion": "7"}
    return [*objs, dup]


def _duplicates_without_canonical() -> list[JSON]:
    objs = published(THREE, 2)
    first = copy.deepcopy(objs[1])
    first["metadata"]["name"] = f"{NODE}-{DRIVER}-aaaaa"
    second = copy.deepcopy(objs[1])
    second["metadata"]["name"] = f"{NODE}-{DRIVER}-bbbbb"
    return [objs[0], objs[2], first, second]


def _with_foreign() -> list[JSON]:
    return [
        *published(THREE, 1),
        foreign("node-a-other.dev-0", "other.dev", NODE),
        foreign("node-b-gpu.dra.dev-0", DRIVER, "node-b"),
    ]


def _without_owner() -> list[JSON]:
    return published(THREE, 3, owner=None)


def _hand_deleted() -> list[JSON]:
    objs = published(THREE, 5)
    return [objs[0], objs[2]]


def _renamed_pool() -> list[JSON]:
    other = DesiredPool(DRIVER, "old-pool", NODE, THREE.slices)
    return [stored(s) for s in render_pool(other, 3, OWNER)]


def _dropped_counters() -> list[JSON]:
    objs = published(COUNTED, 1)
    for obj in objs:
        obj["spec"].pop("sharedCounters", None)
        for dev in obj["spec"].get("devices", []):
            dev.pop("consumesCounters", None)
    return objs


ONE = {"value": "1"}
COUNTED = DesiredPool(
    DRIVER,
    NODE,
    NODE,
    contents_for(
        [device(0) | {"consumesCounters": [{"counterSet": "gpu-0", "counters": {"sm": ONE}}]}],
        counter_sets=[{"name": "gpu-0", "counters": {"sm": {"value": "7"}}}],
    ),
)

CASES = [
    Case("first publish", list, THREE, creates=[sname(0), sname(1), sname(2)]),
    Case("empty desired, nothing stored", list, pool_of(), generation=0),
    Case("unchanged", lambda: published(THREE, 3), THREE, generation=3),
    Case(
        "quantities and server fields ignored",
        lambda: published(pool_of([device(0, "81920Mi")]), 2),
        pool_of([device(0, "81920Mi")]),
        generation=2,
    ),
    Case(
        "one device changed: in place, same generation",
        lambda: published(THREE, 3),
        pool_of([device(0)], [device(1, "40Gi")], [device(2)]),
        updates=[sname(1)],
        generation=3,
    ),
    Case(
        "two slices changed: new generation",
        lambda: published(THREE, 3),
        pool_of([device(0, "1Gi")], [device(1, "40Gi")], [device(2)]),
        updates=[sname(0), sname(1), sname(2)],
        generation=4,
    ),
    Case(
        "devices added past the per-slice limit",
        lambda: published(DesiredPool(DRIVER, NODE, NODE, contents_for(BIG)), 1),
        DesiredPool(DRIVER, NODE, NODE, contents_for([*BIG, device(128)])),
        creates=[sname(1)],
        updates=[sname(0)],
        generation=2,
    ),
    Case(
        "shrink to fewer slices",
        lambda: published(THREE, 2),
        pool_of([device(0), device(1), device(2)]),
        updates=[sname(0)],
        deletes=[sname(1), sname(2)],
        generation=3,
    ),
    Case(
        "leftover of an older generation",
        _stale_generation_leftover,
        THREE,
        deletes=[f"{NODE}-{DRIVER}-old-x7k2p"],
        generation=2,
    ),
    Case(
        "duplicate of a canonical slice",
        _duplicate_of_canonical,
        THREE,
        deletes=[f"{NODE}-{DRIVER}-q9zzt"],
        generation=2,
    ),
    Case(
        "duplicates under other names: keep one, delete the rest",
        _duplicates_without_canonical,
        THREE,
        deletes=[f"{NODE}-{DRIVER}-bbbbb"],
        generation=2,
    ),
    Case(
        "slices of another driver or node are untouched",
        _with_foreign,
        THREE,
        generation=1,
    ),
    Case(
        "owner reference set without a new generation",
        _without_owner,
        THREE,
        updates=[sname(0), sname(1), sname(2)],
        generation=3,
    ),
    Case(
        "no owner known: existing references are left alone",
        lambda: published(THREE, 3),
        THREE,
        generation=3,
        owner=None,
    ),
    Case(
        "hand-edited slice restored",
        _edited_slice,
        THREE,
        updates=[sname(0)],
        generation=4,
    ),
    Case(
        "hand-deleted slice recreated at the same generation",
        _hand_deleted,
        THREE,
        creates=[sname(1)],
        generation=5,
    ),
    Case(
        "pool renamed: immutable pool name, delete first and create later",
        _renamed_pool,
        THREE,
        deletes=[sname(0), sname(1), sname(2)],
        generation=1,
    ),
    Case(
        "fields the server drops are not fought over",
        _dropped_counters,
        COUNTED,
        generation=1,
        ignored=frozenset({"sharedCounters", "devices[].consumesCounters"}),
    ),
    Case(
        "dropped fields noticed only when ignored",
        _dropped_counters,
        COUNTED,
        updates=[sname(0), sname(1)],
        generation=2,
    ),
    Case(
        "everything deleted when the pool becomes empty",
        lambda: published(THREE, 2),
        pool_of(),
        deletes=[sname(0), sname(1), sname(2)],
        generation=2,
    ),
]


def same_plan(a: Plan, b: Plan) -> bool:
    return (a.creates, a.updates, a.deletes, a.generation, a.yielded_to) == (
        b.creates,
        b.updates,
        b.deletes,
        b.generation,
        b.yielded_to,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan(case: Case) -> None:
    existing = case.existing()
    result = plan(existing, case.desired, case.owner, case.ignored)
    # A cache that planned this state and another pool before changes nothing.
    cache = ContentCache()
    plan(existing, case.desired, case.owner, case.ignored, cache=cache)
    plan(existing, THREE, case.owner, frozenset({"devices[].capacity"}), cache=cache)
    assert same_plan(plan(existing, case.desired, case.owner, case.ignored, cache=cache), result)
    assert names(result.creates) == case.creates
    assert names(result.updates) == case.updates
    assert result.deletes == case.deletes
    assert result.generation == case.generation
    written = result.creates + result.updates
    if written:
        assert gens(written) == {case.generation}
        assert {o["spec"]["pool"]["resourceSliceCount"] for o in written} == {
            len(case.desired.slices)
        }
    for obj in result.updates:
        # Updates are conditional on the version that was observed.
        original = next(e for e in existing if e["metadata"]["name"] == obj["metadata"]["name"])
        assert obj["metadata"]["resourceVersion"] == original["metadata"]["resourceVersion"]
        assert "managedFields" not in obj["metadata"]


OWNER_REFS = [
    {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": OWNER.uid, "controller": True}
]


def test_owner_reference_is_the_node_controller() -> None:
    result = plan([], THREE, OWNER)
    assert result.creates[0]["metadata"]["ownerReferences"] == OWNER_REFS


def test_update_keeps_foreign_metadata_and_replaces_stale_node_owner() -> None:
    objs = published(THREE, 3, NodeOwner(NODE, "old-uid"))
    objs[0]["metadata"]["labels"] = {"team": "x"}
    objs[0]["metadata"]["annotations"] = {"note": "y"}
    result = plan(objs, THREE, OWNER)
    assert result.generation == 3
    body = next(u for u in result.updates if u["metadata"]["name"] == sname(0))
    assert body["metadata"]["labels"] == {"team": "x"}
    assert body["metadata"]["annotations"] == {"note": "y"}
    assert [r["uid"] for r in body["metadata"]["ownerReferences"]] == [OWNER.uid]


def test_update_keeps_another_controller_as_an_owner_only() -> None:
    """Someone made another object the slices' controller (ours gone): the update puts ours
    back as the one controller the API server allows and keeps theirs as a plain owner."""
    objs = published(THREE, 3, OWNER)
    theirs = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u"}
    objs[0]["metadata"]["ownerReferences"] = [{**theirs, "controller": True}]
    result = plan(objs, THREE, OWNER)
    body = next(u for u in result.updates if u["metadata"]["name"] == sname(0))
    refs = body["metadata"]["ownerReferences"]
    assert refs == [{**theirs, "controller": False}, *OWNER_REFS]
    assert [r["uid"] for r in refs if r.get("controller")] == [OWNER.uid]


def apply(state: dict[str, JSON], result: Plan) -> None:
    """Execute a plan against an in-memory 'server'."""
    for obj in result.creates:
        assert obj["metadata"]["name"] not in state, "create would conflict"
        state[obj["metadata"]["name"]] = stored(obj)
    for obj in result.updates:
        assert obj["metadata"]["name"] in state
        state[obj["metadata"]["name"]] = stored(obj)
    for name in result.deletes:
        # Conditional on the slice the plan saw, as the controller sends it.
        assert result.delete_uids[name] == state[name]["metadata"]["uid"]
        del state[name]


def converge(existing: list[JSON], desired: DesiredPool) -> tuple[dict[str, JSON], int]:
    state = {o["metadata"]["name"]: o for o in existing}
    rounds = 0
    cache = ContentCache()  # one for every round, as a controller keeps it
    while not (result := plan(list(state.values()), desired, OWNER, cache=cache)).empty:
        assert same_plan(result, plan(list(state.values()), desired, OWNER))
        apply(state, result)
        rounds += 1
        assert rounds <= 2, "the planner does not converge"
    return state, result.generation


def _counting_contents(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first device of every spec the planner normalises from now on."""
    computed: list[str] = []
    content = planner._content

    def counting(spec: Any, ignored: Any) -> JSON:
        computed.append(spec.get("devices", [{}])[0].get("name", ""))
        return content(spec, ignored)

    monkeypatch.setattr(planner, "_content", counting)
    return computed


# The server re-serialises this quantity (as "80Gi"), so its slices differ from ours as sent.
RESERIALISED = pool_of([device(0, "81920Mi")], [device(1, "81920Mi")], [device(2, "81920Mi")])


def test_the_cache_compares_a_stored_slice_again_only_once_it_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    computed = _counting_contents(monkeypatch)
    cache = ContentCache()
    objs = published(RESERIALISED)
    assert plan(objs, RESERIALISED, OWNER, cache=cache).empty
    assert sorted(computed) == ["gpu-0", "gpu-0", "gpu-1", "gpu-1", "gpu-2", "gpu-2"]
    computed.clear()
    assert plan(objs, RESERIALISED, OWNER, cache=cache).empty
    assert computed == []  # the pool and every stored slice as before
    changed = stored(objs[1])  # the same slice at a new resourceVersion
    changed["spec"]["devices"][0]["capacity"]["memory"]["value"] = "40Gi"
    result = plan([objs[0], changed, objs[2]], RESERIALISED, OWNER, cache=cache)
    assert names(result.updates) == [sname(1)]
    assert computed == ["gpu-1"]
    computed.clear()
    other = published(pool_of([device(5, "81920Mi")]))
    plan(other, RESERIALISED, OWNER, cache=cache)
    computed.clear()
    # What the last plan did not compare was dropped: the first slices are new to it again.
    assert plan(objs, RESERIALISED, OWNER, cache=cache).empty
    assert sorted(computed) == ["gpu-0", "gpu-1", "gpu-2"]


def test_a_slice_stored_as_rendered_is_not_normalised_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    computed = _counting_contents(monkeypatch)
    cache = ContentCache()
    assert plan(published(THREE), THREE, OWNER, cache=cache).empty
    assert sorted(computed) == ["gpu-0", "gpu-1", "gpu-2"]  # the wanted slices only
    computed.clear()
    # Stored as rendered but for another pool's content: compared as what it holds.
    objs = published(THREE)
    objs[2]["spec"]["devices"][0]["attributes"]["model"] = {"string": "A100"}
    assert names(plan(objs, THREE, OWNER, cache=cache).updates) == [sname(2)]
    assert computed == ["gpu-2"]


sizes = st.lists(st.integers(min_value=0, max_value=3), min_size=0, max_size=4)


@settings(max_examples=150, deadline=None)
@given(before=sizes, after=sizes, gen=st.integers(1, 5), drop=st.integers(0, 5))
def test_any_state_converges_to_a_consistent_pool(
    before: list[int], after: list[int], gen: int, drop: int
) -> None:
    def build(groups: list[int], variant: str) -> DesiredPool:
        counter = itertools.count()
        return pool_of(*[[device(next(counter), variant) for _ in range(n)] for n in groups])

    old = build(before, "80Gi")
    existing = published(old, gen)
    if existing and drop < len(existing):
        existing.pop(drop)  # something deleted one of the slices
    desired = build(after, "40Gi" if drop % 2 else "80Gi")
    state, generation = converge(existing, desired)
    ours = list(state.values())
    assert len(ours) == len(desired.slices)
    if ours:
        assert gens(ours) == {generation}
        assert {o["spec"]["pool"]["resourceSliceCount"] for o in ours} == {len(ours)}
        got = sorted(d["name"] for o in ours for d in o["spec"]["devices"])
        want = sorted(d["name"] for c in desired.slices for d in c.devices)
        assert got == want


STAMPED = "2025-01-01T00:00:00Z"  # what ``stored`` stamps, as the API server would


def test_a_rewritten_slice_keeps_the_time_the_server_stamped_on_its_taints() -> None:
    """The API server stamps ``timeAdded`` on a taint written without one, on every create
    and update. A slice rewritten for another device's sake, or moved to a new generation,
    must send the stored stamp back: else its taints look newly added, and the time a
    NoExecute toleration counts from starts over with each unrelated change."""
    taint = {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoExecute"}
    fresh = {"key": f"{DRIVER}/gpu-lost", "effect": "NoExecute"}
    objs = published(pool_of([device(0) | {"taints": [taint]}, device(1)], [device(2)]), 3)

    # Another device of the slice changes: one update at the same generation.
    in_place = pool_of([device(0) | {"taints": [taint, fresh]}, device(1, "40Gi")], [device(2)])
    (body,) = plan(objs, in_place, OWNER).updates
    assert body["spec"]["devices"][0]["taints"] == [taint | {"timeAdded": STAMPED}, fresh]

    # The tainted device moves to the other slice of a new generation.
    moved = pool_of([device(1)], [device(0) | {"taints": [taint]}, device(2)])
    result = plan(objs, moved, OWNER)
    assert result.generation == 4
    (gpu0,) = [
        d
        for o in result.creates + result.updates
        for d in o["spec"]["devices"]
        if d["name"] == "gpu-0"
    ]
    assert gpu0["taints"] == [taint | {"timeAdded": STAMPED}]
    assert "timeAdded" not in taint  # the desired pool is left as it was
