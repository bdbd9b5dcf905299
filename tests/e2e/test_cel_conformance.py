"""Our CEL evaluator against the real scheduler: a table of selectors x devices.

Each device sits alone in the ResourceSlice of its own node. For every (selector, device) pair a
claim with that selector requests one device and a pod that uses the claim is pinned to the
device's node; the scheduler then either allocates the device (match), reports a CEL runtime
error, or leaves the pod unschedulable (no match). Our evaluator must agree on every pair.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.cel import Verdict, device_variables, evaluate_expression

pytestmark = pytest.mark.e2e

GROUP, VERSION = "resource.k8s.io", "v1"
CLASS_SELECTOR = 'device.driver == "{driver}"'
STABLE_SECONDS = 4.0


def devices(driver: str) -> dict[str, dict[str, Any]]:
    """Three devices: attributes of every type, one lacking attributes, one with another domain."""
    return {
        "h100": {
            "name": "gpu-0",
            "attributes": {
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "architecture": {"string": "Hopper"},
                "cudaComputeCapability": {"version": "9.0.0"},
                "numaNode": {"int": 0},
                "migEnabled": {"bool": False},
                "example.com/rack": {"int": 1},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        },
        "a100": {
            "name": "gpu-0",
            "attributes": {
                "productName": {"string": "NVIDIA A100-SXM4-40GB"},
                "architecture": {"string": "Ampere"},
                "cudaComputeCapability": {"version": "8.0.0"},
                "numaNode": {"int": 1},
                "migEnabled": {"bool": True},
            },
            "capacity": {"memory": {"value": "40Gi"}},
        },
        "l4": {  # no numaNode, no migEnabled
            "name": "gpu-0",
            "attributes": {
                "productName": {"string": "NVIDIA L4"},
                "architecture": {"string": "Ada Lovelace"},
                "cudaComputeCapability": {"version": "8.9.0"},
            },
            "capacity": {"memory": {"value": "24146534Ki"}},
        },
    }


def selectors(driver: str) -> list[str]:
    """The rows of the table."""
    a = f'device.attributes["{driver}"]'
    c = f'device.capacity["{driver}"]'
    return [
        f'{c}.memory.compareTo(quantity("40Gi")) >= 0',
        f'{c}.memory.isGreaterThan(quantity("24G"))',
        f'{a}.architecture == "Hopper"',
        f'{a}.cudaComputeCapability.compareTo(semver("8.0.0")) >= 0',
        f'{a}.cudaComputeCapability.isGreaterThan(semver("8.0.0"))',
        f"!{a}.migEnabled && {a}.numaNode == 0",
        f"has({a}.numaNode) && {a}.numaNode == 0",
        f"{a}.numaNode == 0 || true",
        f'{a}.productName.matches("A100|L4$")',
        f'{a}.productName.lowerAscii().split(" ")[1] == "h100"',
        'device.attributes["example.com"].rack == 1',
        '"example.com" in device.attributes',
        f'sets.contains(["Hopper", "Ampere"], [{a}.architecture])',
        f"{a}.numaNode",
    ]


def _create_slice(kube_api: Any, driver: str, node: str, device: dict[str, Any]) -> None:
    from kubernetes import client as k

    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"[:253]},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [device],
        },
    }
    k.CustomObjectsApi(kube_api).create_cluster_custom_object(
        GROUP, VERSION, "resourceslices", body
    )


def _claim_and_pod(
    kube_api: Any, namespace: str, name: str, device_class: str, node: str, expression: str
) -> None:
    from kubernetes import client as k

    claim = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }
    k.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", claim
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [node]}
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }
    k.CoreV1Api(kube_api).create_namespaced_pod(namespace, pod)


def _scheduler_verdict(kube_api: Any, namespace: str, name: str) -> tuple[Verdict, str] | None:
    from kubernetes import client as k

    claim = k.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", name
    )
    if (claim.get("status") or {}).get("allocation"):
        return Verdict.MATCH, ""
    pod = k.CoreV1Api(kube_api).read_namespaced_pod(name, namespace)
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            message = condition.message or ""
            if "CEL runtime error" in message:
                return Verdict.ERROR, message
            if "cannot allocate all claims" in message:
                return Verdict.NO_MATCH, message
    return None


def _row_verdicts(
    kube_api: Any, namespace: str, names: list[str]
) -> dict[str, tuple[Verdict, str]]:
    # Allocation and CEL errors are final at once; "cannot allocate" only when it persists,
    # since the scheduler may not yet have seen the previous row's claims go away.
    final: dict[str, tuple[Verdict, str]] = {}
    since: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while len(final) < len(names):
        assert time.monotonic() < deadline, f"no scheduler verdict for {set(names) - set(final)}"
        for name in names:
            if name in final:
                continue
            verdict = _scheduler_verdict(kube_api, namespace, name)
            if verdict is None or verdict[0] is not Verdict.NO_MATCH:
                since.pop(name, None)
                if verdict is not None:
                    final[name] = verdict
            elif time.monotonic() - since.setdefault(name, time.monotonic()) > STABLE_SECONDS:
                final[name] = verdict
        time.sleep(0.3)
    return final


def _delete_row(kube_api: Any, namespace: str, names: list[str]) -> None:
    from kubernetes import client as k

    core, custom = k.CoreV1Api(kube_api), k.CustomObjectsApi(kube_api)
    for name in names:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    for name in names:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        claims = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")
        if not {c["metadata"]["name"] for c in claims["items"]} & set(names):
            return
        time.sleep(0.3)
    pytest.fail(f"claims {names} were not deleted")


def test_evaluator_agrees_with_scheduler(
    kube_api: Any,
    namespace: str,
    make_node: Callable[..., Any],
    unique_name: Callable[[str], str],
) -> None:
    from kubernetes import client as k

    driver = f"{unique_name('cel')}.example.com"
    class_name = unique_name("cel-class")
    try:
        _run_table(kube_api, namespace, make_node, driver, class_name)
    finally:
        custom = k.CustomObjectsApi(kube_api)
        for obj in custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]:
            if obj["spec"]["driver"] == driver:
                custom.delete_cluster_custom_object(
                    GROUP, VERSION, "resourceslices", obj["metadata"]["name"]
                )
        with contextlib.suppress(k.ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", class_name)


def _run_table(
    kube_api: Any, namespace: str, make_node: Callable[..., Any], driver: str, class_name: str
) -> None:
    from kubernetes import client as k

    table = devices(driver)
    nodes = {key: make_node().name for key in table}
    for key, device in table.items():
        _create_slice(kube_api, driver, nodes[key], device)
    class_expression = CLASS_SELECTOR.format(driver=driver)
    k.CustomObjectsApi(kube_api).create_cluster_custom_object(
        GROUP,
        VERSION,
        "deviceclasses",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DeviceClass",
            "metadata": {"name": class_name},
            "spec": {"selectors": [{"cel": {"expression": class_expression}}]},
        },
    )

    # Let the scheduler's informers see the slices and the class before the first pod arrives;
    # otherwise a first "cannot allocate" only means "not seen yet".
    time.sleep(5)
    # Each node has one device, and a matching claim takes it: run the table one row at a
    # time (the three devices in parallel), freeing the devices before the next row.
    observed: dict[str, tuple[Verdict, str]] = {}
    pending: dict[str, tuple[str, str]] = {}
    for i, expression in enumerate(selectors(driver)):
        row = {f"row{i}-{key}": (expression, key) for key in table}
        for name, (_, key) in row.items():
            _claim_and_pod(kube_api, namespace, name, class_name, nodes[key], expression)
        observed.update(_row_verdicts(kube_api, namespace, list(row)))
        pending.update(row)
        _delete_row(kube_api, namespace, list(row))

    disagreements = []
    for name, (expression, key) in pending.items():
        variables = device_variables(table[key], driver)
        ours = evaluate_expression(class_expression, variables)
        if ours.verdict is Verdict.MATCH:
            ours = evaluate_expression(expression, variables)
        theirs, message = observed[name]
        if ours.verdict is not theirs:
            disagreements.append(
                f"{key}: {expression}: scheduler {theirs.value} ({message}), "
                f"ours {ours.verdict.value} ({ours.error})"
            )
    assert not disagreements, "\n".join(disagreements)
    # The table must exercise every verdict, or it proves little.
    assert {v for v, _ in observed.values()} == {Verdict.MATCH, Verdict.NO_MATCH, Verdict.ERROR}
