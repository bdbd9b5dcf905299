"""The Kubernetes 1.34 layout of a pool with counters: each counter set beside its devices."""

from __future__ import annotations

from typing import Any

from dra_driver.resourceslice.pool import (
    DesiredPool,
    SliceContent,
    contents_for,
    inline_counters,
    render_pool,
)


def _device(name: str, counter_set: str) -> dict[str, Any]:
    return {
        "name": name,
        "consumesCounters": [{"counterSet": counter_set, "counters": {"c": {"value": "1"}}}],
    }


def _set(name: str) -> dict[str, Any]:
    return {"name": name, "counters": {"c": {"value": "2"}}}


def test_each_counter_set_moves_to_the_slice_of_its_devices() -> None:
    pool = DesiredPool(
        "d",
        "n",
        "n",
        contents_for(
            [{"name": "plain"}],
            [_set("gpu-0"), _set("gpu-1")],
            [[_device("a", "gpu-0"), _device("b", "gpu-0")], [_device("c", "gpu-1")]],
        ),
    )
    assert [bool(s.shared_counters) for s in pool.slices] == [True, False, False, False]
    inline = inline_counters(pool)
    assert inline is not None
    assert [
        ([d["name"] for d in s.devices], [c["name"] for c in s.shared_counters])
        for s in inline.slices
    ] == [
        (["a", "b"], ["gpu-0"]),
        (["c"], ["gpu-1"]),
        (["plain"], []),
    ]
    specs = [s["spec"] for s in render_pool(inline)]
    assert specs[0]["sharedCounters"] == [_set("gpu-0")] and len(specs[0]["devices"]) == 2
    assert "sharedCounters" not in specs[2]


def test_a_counter_set_used_from_two_slices_cannot_be_inlined() -> None:
    pool = DesiredPool(
        "d",
        "n",
        "n",
        (
            SliceContent(shared_counters=(_set("gpu-0"),)),
            SliceContent(devices=(_device("a", "gpu-0"),)),
            SliceContent(devices=(_device("b", "gpu-0"),)),
        ),
    )
    assert inline_counters(pool) is None


def test_a_pool_without_counters_stays_as_it_is() -> None:
    pool = DesiredPool("d", "n", "n", contents_for([{"name": "x"}]))
    assert inline_counters(pool) is pool
