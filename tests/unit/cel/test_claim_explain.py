"""explain-claim as pure functions over JSON: classes, slices, claims."""

from __future__ import annotations

from typing import Any

from dra_driver.cel.claim_explain import allocated_devices, explain_claim
from dra_driver.cel.render import claim_text

DRIVER = "gpu.dra.dev"
A = f'device.attributes["{DRIVER}"]'


def gpu(name: str, product: str, numa: int) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"productName": {"string": product}, "numaNode": {"int": numa}},
        "capacity": {"memory": {"value": "80Gi"}},
    }


def slice_(node: str, *devices: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-slice"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": list(devices),
        },
    }


SLICES = [
    slice_("node-a", gpu("gpu-0", "H100", 0), gpu("gpu-1", "H100", 0), gpu("gpu-2", "A100", 1)),
    slice_("node-b", gpu("gpu-0", "A100", 0), gpu("gpu-1", "L4", 1)),
]
CLASSES = [
    {
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
]


def claim(
    name: str,
    requests: list[dict[str, Any]],
    constraints: list[dict[str, Any]] | None = None,
    allocated: list[tuple[str, str, str]] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": requests, "constraints": constraints or []}},
    }
    if allocated:
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": pool, "device": dev}
                        for _, pool, dev in allocated
                    ]
                }
            }
        }
    return obj


def exactly(name: str, count: int = 1, *selectors: str, cls: str = DRIVER) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": cls,
            "count": count,
            "allocationMode": "ExactCount",
            "selectors": [{"cel": {"expression": s}} for s in selectors],
        },
    }


def product_sub(name: str, product: str) -> dict[str, Any]:
    """A firstAvailable subrequest for GPUs of one product."""
    expression = f'{A}.productName == "{product}"'
    return {
        "name": name,
        "deviceClassName": DRIVER,
        "selectors": [{"cel": {"expression": expression}}],
    }


def test_counts_per_selector_and_pool() -> None:
    c = claim("c", [exactly("gpu", 1, f'{A}.productName == "H100"')])
    report = explain_claim(c, CLASSES, SLICES, [c])
    (request,) = report.requests
    pools = {p.pool: p for p in request.pools}
    assert [n for _, _, n in pools["node-a"].steps] == [3, 2]
    assert [n for _, _, n in pools["node-b"].steps] == [2, 0]
    assert pools["node-a"].available == ["gpu-0", "gpu-1"]
    assert report.blocking == []


def test_count_larger_than_available_because_of_other_claims() -> None:
    other = claim("other", [exactly("gpu")], allocated=[("gpu", "node-a", "gpu-0")])
    c = claim("c", [exactly("gpu", 2, f'{A}.productName == "H100"')])
    report = explain_claim(c, CLASSES, SLICES, [c, other])
    pool = next(p for p in report.requests[0].pools if p.pool == "node-a")
    assert pool.busy == {"gpu-0": "ns/other"}
    assert len(report.blocking) == 1
    assert "needs 2 device(s) from one pool" in report.blocking[0]
    assert "most any pool has available is 1" in report.blocking[0]
    assert "gpu-0 -> ns/other" in claim_text(report)


def test_no_match_and_missing_class() -> None:
    c = claim(
        "c",
        [exactly("gpu", 1, f'{A}.productName == "B200"'), exactly("mig", 1, cls="mig.gpu.dra.dev")],
    )
    report = explain_claim(c, CLASSES, SLICES, [])
    assert report.blocking == [
        "request gpu: no device in any pool matches the selectors",
        "request mig: device class 'mig.gpu.dra.dev' does not exist",
    ]


def test_cel_errors_are_reported() -> None:
    c = claim("c", [exactly("gpu", 1, f"{A}.nosuch == 1")])
    report = explain_claim(c, CLASSES, SLICES, [])
    pool = report.requests[0].pools[0]
    assert "no such key: nosuch" in next(iter(pool.errors.values()))
    assert any("fail CEL evaluation" in b for b in report.blocking)


def test_match_attribute_without_common_value() -> None:
    requests = [exactly("a", 1, f"{A}.numaNode == 0"), exactly("b", 1, f"{A}.numaNode == 1")]
    c = claim("c", requests, [{"requests": ["a", "b"], "matchAttribute": f"{DRIVER}/productName"}])
    report = explain_claim(c, CLASSES, SLICES, [])
    assert len(report.constraints) == 1
    assert "matchAttribute gpu.dra.dev/productName over [a, b]" in report.constraints[0]
    ok = claim("c", requests, [{"requests": ["a", "b"], "matchAttribute": f"{DRIVER}/memory"}])
    assert explain_claim(ok, CLASSES, SLICES, []).constraints  # memory is capacity, not attribute
    same = claim(
        "c", [exactly("a", 1), exactly("b", 1)], [{"matchAttribute": f"{DRIVER}/productName"}]
    )
    assert explain_claim(same, CLASSES, SLICES, []).constraints == []


def test_distinct_attribute() -> None:
    c = claim("c", [exactly("gpu", 3)], [{"distinctAttribute": f"{DRIVER}/numaNode"}])
    report = explain_claim(c, CLASSES, SLICES, [])
    assert report.constraints and "needs 3 distinct values" in report.constraints[0]
    ok = claim("c", [exactly("gpu", 2)], [{"distinctAttribute": f"{DRIVER}/numaNode"}])
    assert explain_claim(ok, CLASSES, SLICES, []).constraints == []


def test_list_attributes_match_by_a_shared_element() -> None:
    # DRAListTypeAttributes: matchAttribute holds when one value is in every device's list (a
    # scalar counts as a list of one); a list and a scalar of another kind never match.
    def nic(name: str, numa: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "attributes": {"numa": numa}}

    slices = [
        slice_(
            "node-a",
            nic("wide", {"ints": [0, 1]}),
            nic("one", {"int": 1}),
            nic("text", {"strings": ["0", "1"]}),
        )
    ]
    requests = [
        exactly("a", 1, f'device.attributes["{DRIVER}"].numa.includes(0)'),
        exactly("b", 1, f'"text" != "{DRIVER}" && device.attributes["{DRIVER}"].numa == 1'),
    ]
    c = claim("c", requests, [{"requests": ["a", "b"], "matchAttribute": f"{DRIVER}/numa"}])
    report = explain_claim(c, CLASSES, slices, [])
    assert report.requests[0].pools[0].available == ["wide"]
    assert report.requests[1].pools[0].available == ["one"]
    assert report.constraints == []  # 1 is in [0, 1] and is the other device's value

    strings_only = [
        exactly("a", 1, f'device.attributes["{DRIVER}"].numa.includes("0")'),
        requests[1],
    ]
    c = claim("c", strings_only, [{"requests": ["a", "b"], "matchAttribute": f"{DRIVER}/numa"}])
    report = explain_claim(c, CLASSES, slices, [])
    assert report.requests[0].pools[0].available == ["text"]
    assert report.constraints and "matchAttribute gpu.dra.dev/numa" in report.constraints[0]


def test_all_mode_blocked_by_busy_device() -> None:
    other = claim("other", [exactly("gpu")], allocated=[("gpu", "node-b", "gpu-1")])
    req = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "allocationMode": "All"}}
    report = explain_claim(claim("c", [req]), CLASSES, [SLICES[1]], [other])
    assert any("allocationMode All" in b for b in report.blocking)


def test_first_available_subrequests_and_json() -> None:
    req = {
        "name": "gpu",
        "firstAvailable": [
            product_sub("h100", "H100"),
            {"name": "any", "deviceClassName": DRIVER},
        ],
    }
    report = explain_claim(claim("c", [req]), CLASSES, SLICES, [])
    assert [r.name for r in report.requests] == ["gpu/h100", "gpu/any"]
    data = report.to_json()
    assert data["firstAvailable"] == {"gpu": ["gpu/h100", "gpu/any"]}
    assert data["requests"][0]["pools"][0]["selectors"][1]["remaining"] == 2
    assert "firstAvailable list" in claim_text(report)


def test_allocated_devices_skips_the_claim_itself() -> None:
    mine = claim("c", [exactly("gpu")], allocated=[("gpu", "node-a", "gpu-0")])
    other = claim("o", [exactly("gpu")], allocated=[("gpu", "node-a", "gpu-1")])
    assert allocated_devices([mine, other], skip="ns/c") == {f"{DRIVER}/node-a/gpu-1": "ns/o"}
    report = explain_claim(mine, CLASSES, SLICES, [mine, other])
    assert report.allocated == [f"gpu: {DRIVER}/node-a/gpu-0"]
    assert claim_text(report).startswith("claim ns/c: allocated")


def test_untolerated_taint_makes_a_device_unavailable() -> None:
    # The agent taints a GPU with an Xid error NoSchedule; the scheduler does not allocate it
    # to a request without a matching toleration.
    taint = {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}
    slices = [slice_("node-b", {**gpu("gpu-0", "A100", 0), "taints": [taint]})]
    report = explain_claim(claim("c", [exactly("gpu")]), CLASSES, slices, [])
    assert report.requests[0].pools[0].available == []
    assert report.blocking and "tainted" in report.blocking[0]
    assert "gpu.dra.dev/xid=79:NoSchedule" in claim_text(report)
    tolerant = exactly("gpu")
    tolerant["exactly"]["tolerations"] = [{"key": f"{DRIVER}/xid", "operator": "Exists"}]
    assert explain_claim(claim("c", [tolerant]), CLASSES, slices, []).blocking == []
    untainted = {**gpu("gpu-0", "A100", 0), "taints": [{**taint, "effect": "None"}]}
    informational = [slice_("node-b", untainted)]
    assert explain_claim(claim("c", [exactly("gpu")]), CLASSES, informational, []).blocking == []


def test_admin_access_may_use_devices_of_other_claims() -> None:
    other = claim("other", [exactly("gpu")], allocated=[("gpu", "node-b", "gpu-0")])
    admin = exactly("gpu")
    admin["exactly"]["adminAccess"] = True
    slices = [slice_("node-b", gpu("gpu-0", "A100", 0))]
    assert explain_claim(claim("c", [exactly("gpu")]), CLASSES, slices, [other]).blocking
    assert explain_claim(claim("c", [admin]), CLASSES, slices, [other]).blocking == []


def test_first_available_blocks_only_when_no_subrequest_fits() -> None:
    req = {
        "name": "gpu",
        "firstAvailable": [
            product_sub("b200", "B200"),
            {"name": "any", "deviceClassName": DRIVER},
        ],
    }
    report = explain_claim(claim("c", [req]), CLASSES, SLICES, [])
    assert report.requests[0].blocking  # the first choice alone cannot be satisfied ...
    assert report.blocking == []  # ... but the scheduler falls back to the second
    only_b200 = {**req, "firstAvailable": req["firstAvailable"][:1]}
    assert explain_claim(claim("c", [only_b200]), CLASSES, SLICES, []).blocking


def test_constraint_over_first_available_uses_one_subrequest() -> None:
    req = {
        "name": "gpu",
        "firstAvailable": [product_sub("h100", "H100"), product_sub("a100", "A100")],
    }
    # gpu/h100 -> node-a gpu-0 and b -> node-a gpu-1 share productName H100.
    constraint = {"requests": ["gpu", "b"], "matchAttribute": f"{DRIVER}/productName"}
    report = explain_claim(claim("c", [req, exactly("b")], [constraint]), CLASSES, SLICES, [])
    assert report.constraints == []
    assert report.blocking == []


def test_admin_access_results_do_not_make_devices_busy() -> None:
    # The scheduler does not count a device allocated with adminAccess as in use: a monitoring
    # claim holding it does not keep a normal request off it.
    monitor = claim("monitor", [exactly("gpu")], allocated=[("gpu", "node-b", "gpu-0")])
    monitor["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    slices = [slice_("node-b", gpu("gpu-0", "A100", 0))]
    assert allocated_devices([monitor]) == {}
    assert explain_claim(claim("c", [exactly("gpu")]), CLASSES, slices, [monitor]).blocking == []


def pooled(node: str, generation: int, count: int, *devices: dict[str, Any]) -> dict[str, Any]:
    obj = slice_(node, *devices)
    obj["metadata"]["name"] = f"{node}-{generation}-{len(devices)}"
    obj["spec"]["pool"].update(generation=generation, resourceSliceCount=count)
    return obj


def test_only_the_newest_complete_generation_of_a_pool_counts() -> None:
    # While the driver replaces generation 1 by 2, the old slice is still listed: the
    # scheduler uses generation 2 only, so the H100 of generation 1 is gone.
    old = pooled("node-a", 1, 1, gpu("gpu-0", "H100", 0), gpu("gpu-1", "H100", 0))
    new = pooled("node-a", 2, 1, gpu("gpu-0", "A100", 0))
    c = claim("c", [exactly("gpu", 1, f'{A}.productName == "H100"')])
    report = explain_claim(c, CLASSES, [old, new], [])
    (pool,) = report.requests[0].pools
    assert pool.devices == 1
    assert pool.available == []
    assert report.blocking == ["request gpu: no device in any pool matches the selectors"]
    # A pool with fewer slices of its generation than resourceSliceCount is ignored.
    partial = pooled("node-a", 3, 2, gpu("gpu-0", "H100", 0))
    report = explain_claim(c, CLASSES, [old, new, partial], [])
    (pool,) = report.requests[0].pools
    assert pool.matching == ["gpu-0"]
    assert pool.available == []
    assert "the pool is incomplete" in report.blocking[0]
    assert "pool node-a is incomplete: 1 of 2" in report.blocking[1]
    assert "incomplete" in claim_text(report)


def counter_slice(node: str) -> dict[str, Any]:
    obj = pooled(node, 1, 2)
    obj["metadata"]["name"] = f"{node}-counters"
    del obj["spec"]["devices"]
    obj["spec"]["sharedCounters"] = [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]
    return obj


def partition(name: str, memory: str) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"productName": {"string": "H100"}},
        "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": memory}}}],
    }


def test_exhausted_shared_counters_make_partitions_unavailable() -> None:
    # The whole GPU is allocated to another claim: its MIG partitions consume the same
    # counters, so the scheduler cannot allocate any of them.
    devices = pooled("node-a", 1, 2, partition("whole", "80Gi"), partition("mig-1g", "10Gi"))
    slices = [counter_slice("node-a"), devices]
    other = claim("other", [exactly("gpu")], allocated=[("gpu", "node-a", "whole")])
    c = claim("c", [exactly("gpu")])
    report = explain_claim(c, CLASSES, slices, [other])
    (pool,) = report.requests[0].pools
    assert pool.busy == {"whole": "ns/other"}
    assert pool.available == []
    assert "mig-1g" in pool.counters
    assert report.blocking and "counter" in report.blocking[0]
    assert "shared counters" in claim_text(report)
    small = claim("other", [exactly("gpu")], allocated=[("gpu", "node-a", "mig-1g")])
    report = explain_claim(c, CLASSES, slices, [small])
    assert report.requests[0].pools[0].available == []  # 80Gi do not fit in the 70Gi left
    assert explain_claim(c, CLASSES, slices, []).blocking == []


def shared_gpu(name: str, memory: str) -> dict[str, Any]:
    return {
        "name": name,
        "allowMultipleAllocations": True,
        "attributes": {"productName": {"string": "H100"}},
        "capacity": {"memory": {"value": memory}},
    }


def test_capacity_requests_must_fit_the_device() -> None:
    slices = [slice_("node-a", shared_gpu("gpu-0", "80Gi"))]
    big = exactly("gpu")
    big["exactly"]["capacity"] = {"requests": {"memory": "100Gi"}}
    report = explain_claim(claim("c", [big]), CLASSES, slices, [])
    assert report.requests[0].pools[0].available == []
    assert report.blocking and "capacity" in report.blocking[0]
    fits = exactly("gpu")
    fits["exactly"]["capacity"] = {"requests": {"memory": "40Gi"}}
    assert explain_claim(claim("c", [fits]), CLASSES, slices, []).blocking == []
    unknown = exactly("gpu")
    unknown["exactly"]["capacity"] = {"requests": {"cores": "1"}}
    assert explain_claim(claim("c", [unknown]), CLASSES, slices, []).blocking
    # Another claim already took 60Gi of the shared GPU: 40Gi no longer fit.
    other = claim("other", [exactly("gpu")], allocated=[("gpu", "node-a", "gpu-0")])
    result = other["status"]["allocation"]["devices"]["results"][0]
    result.update(shareID="abc", consumedCapacity={"memory": "60Gi"})
    report = explain_claim(claim("c", [fits]), CLASSES, slices, [other])
    assert report.requests[0].pools[0].available == []
    assert report.blocking


def test_equal_toleration_without_key_matches_any_key_with_that_value() -> None:
    # An Equal toleration with no key tolerates every taint with its value (and effect).
    taint = {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}
    slices = [slice_("node-b", {**gpu("gpu-0", "A100", 0), "taints": [taint]})]
    tolerant = exactly("gpu")
    tolerant["exactly"]["tolerations"] = [{"operator": "Equal", "value": "79"}]
    assert explain_claim(claim("c", [tolerant]), CLASSES, slices, []).blocking == []
    other_value = exactly("gpu")
    other_value["exactly"]["tolerations"] = [{"operator": "Equal", "value": "48"}]
    assert explain_claim(claim("c", [other_value]), CLASSES, slices, []).blocking


def test_match_attribute_over_an_all_request_needs_every_device_to_share_the_value() -> None:
    # allocationMode All takes every matching device of node-a (two H100, one A100): they do
    # not share one productName, so the scheduler cannot satisfy the constraint.
    every = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "allocationMode": "All"}}
    constraint = {"requests": ["gpu"], "matchAttribute": f"{DRIVER}/productName"}
    report = explain_claim(claim("c", [every], [constraint]), CLASSES, SLICES[:1], [])
    assert report.constraints and "matchAttribute" in report.constraints[0]
    h100 = {
        "name": "gpu",
        "exactly": {
            **every["exactly"],
            "selectors": [{"cel": {"expression": f'{A}.productName == "H100"'}}],
        },
    }
    assert explain_claim(claim("c", [h100], [constraint]), CLASSES, SLICES[:1], []).blocking == []
    distinct = {"requests": ["gpu"], "distinctAttribute": f"{DRIVER}/numaNode"}
    report = explain_claim(claim("c", [every], [distinct]), CLASSES, SLICES[:1], [])
    assert report.constraints and "needs 3 distinct values" in report.constraints[0]
