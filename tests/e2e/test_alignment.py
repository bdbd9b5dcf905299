"""Cross-driver alignment end to end: one claim asks for a GPU of this driver and a NIC of
another driver on the same NUMA node, through the standard ``resource.kubernetes.io/numaNode``
attribute both publish; the real scheduler picks a GPU next to the NIC and the kubelet
prepares both drivers' devices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devenv.simnode import GpuNode
from tests.e2e.conftest import raw, wait_until
from tests.e2e.gpu import DRIVER, apply, claim_of, node_slices, template_pod

pytestmark = pytest.mark.e2e

NUMA = "resource.kubernetes.io/numaNode"


def _aligned(nic_class: str) -> str:
    return (
        f"{{requests: [{{name: gpu, exactly: {{deviceClassName: {DRIVER}}}}}, "
        f"{{name: nic, exactly: {{deviceClassName: {nic_class}}}}}], "
        f"constraints: [{{requests: [gpu, nic], matchAttribute: {NUMA}}}]}}"
    )


def test_gpu_and_nic_of_another_driver_on_one_numa_node(
    gpu_node: Callable[..., GpuNode],
    gpu_class: str,
    start_testplugin: Callable[..., Any],
    unique_name: Callable[[str], str],
    kube_api: Any,
    namespace: str,
) -> None:
    from kubernetes import client as k

    node = gpu_node("dgx-h100")  # gpu-0..3 on NUMA node 0, gpu-4..7 on NUMA node 1
    nic_driver = f"{unique_name('nic')}.dra.test"
    # Two NICs, both on NUMA node 1: only gpu-4..7 can go with one.
    nics = start_testplugin(node.node, nic_driver, 2, "--numa-nodes=1,1")
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": nic_driver},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{nic_driver}"'}}]},
    }
    k.ResourceV1Api(kube_api).create_device_class(body)

    def published() -> dict[str, dict[str, Any]]:
        devices = {
            (s["spec"]["driver"], d["name"]): d
            for s in node_slices(kube_api, node.name)
            for d in s["spec"].get("devices", [])
        }
        return devices if len(devices) == 10 else {}

    devices = wait_until(published, 60, "GPUs and NICs published")
    # Both drivers publish the same standard attribute.
    assert devices[(DRIVER, "gpu-5")]["attributes"][NUMA] == {"int": 1}
    assert devices[(nic_driver, "dev-0")]["attributes"][NUMA] == {"int": 1}

    apply(kube_api, namespace, template_pod("aligned", node.name, _aligned(nic_driver)))
    node.node.wait_pod_record(namespace, "aligned", lambda r: bool(r.get("containers")), timeout=60)
    claim = claim_of(kube_api, namespace, "aligned")
    got = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
    assert got["gpu"]["driver"] == DRIVER and got["gpu"]["device"] in {
        f"gpu-{i}" for i in range(4, 8)
    }
    assert got["nic"]["driver"] == nic_driver
    # Each driver was asked to prepare its own device of the claim.
    (call,) = wait_until(
        lambda: [c for c in nics.calls() if c.get("method") == "prepare"],
        30,
        "the NIC driver's prepare",
    )
    assert call["claimUID"] == claim["metadata"]["uid"]
    assert got["nic"]["device"] in str(call["devices"])
    pod = raw(k.CoreV1Api(kube_api).read_namespaced_pod, "aligned", namespace)
    assert pod["spec"]["nodeName"] == node.name
