"""Node-allocatable resources end to end: GPUs declare the host memory each pod using one costs
the node (``--node-overhead``), and the real scheduler counts it: the node runs out of memory
before it runs out of GPUs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode
from tests.e2e.conftest import raw, wait_until
from tests.e2e.gpu import apply, gpu_pod, node_slices

pytestmark = pytest.mark.e2e


def test_gpu_overhead_is_counted_against_node_memory(
    gpu_node: Callable[..., GpuNode],
    gpu_class: str,
    cluster: LocalCluster,
    kube_api: Any,
    namespace: str,
) -> None:
    if why := cluster.feature_off("DRANodeAllocatableResources"):
        pytest.skip(f"no node-allocatable resources: {why}")
    if cluster.minor < 37:
        pytest.skip(
            f"Kubernetes {cluster.version} has node-allocatable resources in its alpha shape "
            "(nodeAllocatableResourceMappings); the driver publishes the 1.37 one"
        )
    from kubernetes import client as k

    # The test nodes have 32Gi of memory: three pods with a GPU each fit, a fourth does not,
    # although the node has eight GPUs.
    node = gpu_node("dgx-h100", extra=["--node-overhead=memory=10Gi"])

    def declared() -> list[Any]:
        devices = [
            d for s in node_slices(kube_api, node.name) for d in s["spec"].get("devices", [])
        ]
        return [d.get("nodeAllocatableResources") for d in devices] if len(devices) == 8 else []

    assert (
        wait_until(declared, 30, "devices published")
        == [{"memory": {"overhead": {"perPod": "10Gi"}}}] * 8
    )
    core = k.CoreV1Api(kube_api)
    for i in range(4):
        apply(kube_api, namespace, gpu_pod(f"p{i}", node.name, f"p{i}-gpu"))

    def phases() -> dict[str, str]:
        pods = raw(core.list_namespaced_pod, namespace)["items"]
        return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}

    wait_until(lambda: sum(bool(n) for n in phases().values()) == 3, 60, "three pods scheduled")

    def unschedulable() -> str:
        for name, bound in phases().items():
            if bound:
                continue
            pod = raw(core.read_namespaced_pod, name, namespace)
            conds = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
            if conds and conds[0]["status"] == "False":
                return str(conds[0].get("message", ""))
        return ""

    assert "memory" in wait_until(unschedulable, 30, "the fourth pod unschedulable").lower()
    assert sum(bool(n) for n in phases().values()) == 3
