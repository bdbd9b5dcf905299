"""Which agent publishes a pool when two run on one node (a rolling update with surge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.resourceslice.planner import plan
from dra_driver.resourceslice.pool import DesiredPool, render_pool
from dra_driver.resourceslice.publisher import (
    PUBLISHERS_FILE,
    Publisher,
    annotation_key,
    rank_pod,
    recorded_publisher,
    register_publisher,
)
from tests.unit.resourceslice.test_planner import DRIVER, JSON, OWNER, device, pool_of, stored

OLD = Publisher(10, "pod-old")
NEW = Publisher(20, "pod-new")
POOL_A = pool_of([device(0), device(1)])
POOL_B = pool_of([device(0)], [device(1, memory="40Gi")])


def published_by(pool: DesiredPool, publisher: Publisher, generation: int = 1) -> list[JSON]:
    return [stored(s) for s in render_pool(pool, generation, OWNER, publisher)]


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("20/pod-new", NEW),
        ("10/pod-old", OLD),
        ("x/pod", None),
        ("20/", None),
        ("", None),
        (20, None),
        (None, None),
    ],
)
def test_annotation_round_trip(value: object, parsed: Publisher | None) -> None:
    assert Publisher.parse(value) == parsed
    if parsed is not None:
        assert Publisher.parse(parsed.annotation()) == parsed


def test_rank_pod_orders_new_pods_after_every_pod_seen() -> None:
    rank, seen = rank_pod({}, "a", now_ns=100)
    assert rank == 100 and seen == {"a": 100}
    # A clock that went backwards still ranks a new pod after the known ones.
    rank_b, seen = rank_pod(seen, "b", now_ns=50)
    assert rank_b == 101
    # A pod seen before (its container restarted) keeps its place.
    again, seen2 = rank_pod(seen, "a", now_ns=10_000)
    assert again == 100 and seen2 == seen


def test_rank_pod_forgets_the_oldest_pods() -> None:
    seen: dict[str, int] = {}
    for i in range(40):
        _, seen = rank_pod(seen, f"pod-{i}", now_ns=i)
    assert len(seen) == 16
    assert "pod-39" in seen and "pod-0" not in seen


def test_register_publisher_survives_a_container_restart(tmp_path: Path) -> None:
    old = register_publisher(tmp_path, "pod-old")
    new = register_publisher(tmp_path, "pod-new")
    assert old is not None and new is not None and new.rank > old.rank
    assert register_publisher(tmp_path, "pod-old") == old  # restarted old container
    assert set(json.loads((tmp_path / PUBLISHERS_FILE).read_text())) == {"pod-old", "pod-new"}


def test_register_publisher_with_an_unreadable_file_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / PUBLISHERS_FILE).write_text("{not json")
    publisher = register_publisher(tmp_path, "pod")
    assert publisher is not None and publisher.id == "pod"


def test_without_a_pod_uid_there_is_no_publisher(tmp_path: Path) -> None:
    assert register_publisher(tmp_path, None) is None
    assert not (tmp_path / PUBLISHERS_FILE).exists()


def test_every_written_slice_names_its_publisher() -> None:
    result = plan([], POOL_A, OWNER, publisher=NEW)
    assert result.creates
    for body in result.creates:
        assert recorded_publisher(body, DRIVER) == NEW


def test_the_older_agent_leaves_a_pool_the_newer_one_published() -> None:
    existing = published_by(POOL_B, NEW, generation=5)
    result = plan(existing, POOL_A, OWNER, publisher=OLD)
    assert result.empty
    assert result.yielded_to == NEW
    assert result.generation == 5


def test_one_newer_slice_is_enough_to_yield() -> None:
    existing = published_by(POOL_A, OLD, generation=3)
    existing[0]["metadata"]["annotations"][annotation_key(DRIVER)] = NEW.annotation()
    assert plan(existing, POOL_A, OWNER, publisher=OLD).yielded_to == NEW


def test_the_newer_agent_replaces_the_older_ones_pool() -> None:
    existing = published_by(POOL_A, OLD, generation=3)
    result = plan(existing, POOL_B, OWNER, publisher=NEW)
    assert result.yielded_to is None
    assert result.generation == 4
    for body in result.creates + result.updates:
        assert recorded_publisher(body, DRIVER) == NEW


def test_same_content_from_an_older_agent_is_restamped_at_the_same_generation() -> None:
    existing = published_by(POOL_A, OLD, generation=3)
    existing[0]["metadata"]["annotations"]["example.com/keep"] = "yes"
    result = plan(existing, POOL_A, OWNER, publisher=NEW)
    assert not result.creates and not result.deletes
    assert [u["spec"]["pool"]["generation"] for u in result.updates] == [3]
    annotations = result.updates[0]["metadata"]["annotations"]
    assert annotations == {annotation_key(DRIVER): NEW.annotation(), "example.com/keep": "yes"}


def test_the_same_agent_after_a_restart_writes_nothing() -> None:
    assert plan(published_by(POOL_A, NEW, generation=2), POOL_A, OWNER, publisher=NEW).empty


def test_an_agent_without_a_publisher_ignores_the_annotation() -> None:
    result = plan(published_by(POOL_B, NEW, generation=2), POOL_A, OWNER)
    assert result.yielded_to is None and not result.empty


def test_a_newer_publisher_that_runs_no_more_is_not_yielded_to() -> None:
    # A surge update rolled back: the new pod was removed, its stamp stays on the slices.
    existing = published_by(POOL_A, NEW, generation=4)
    result = plan(existing, POOL_A, OWNER, publisher=OLD, gone={NEW.id})
    assert result.yielded_to is None
    assert result.updates and not result.creates and not result.deletes
    for body in result.updates:
        assert recorded_publisher(body, DRIVER) == OLD
    # Another newer publisher still running is yielded to.
    newest = Publisher(30, "pod-newest")
    existing[0]["metadata"]["annotations"][annotation_key(DRIVER)] = newest.annotation()
    assert plan(existing, POOL_A, OWNER, publisher=OLD, gone={NEW.id}).yielded_to == newest
