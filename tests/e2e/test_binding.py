"""Binding conditions for dynamic MIG end to end: the real scheduler waits until the agent made
the MIG device, and when making it fails the pod is scheduled again, on another GPU, instead
of failing to start."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode
from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE
from tests.e2e.conftest import wait_until
from tests.e2e.gpu import (
    apply,
    claim_of,
    deep_claim,
    gpu_pod,
    node_events,
    node_slices,
    post_json,
    published_devices,
    resourceapi_path,
)
from tests.e2e.mig import DYNAMIC, SINGLE_H100
from tests.e2e.test_dynamic_mig import (
    allocated_device,
    delete_pods,
    instances,
    mig_pod,
    prepared,
    referenced,
)

pytestmark = pytest.mark.e2e

DRIVER = "gpu.dra.dev"
READY, FAILED = "MIGDeviceReady", "MIGDeviceFailed"
TWO_H100 = (
    SINGLE_H100
    + '  - {product: NVIDIA H100 80GB HBM3, pciBusId: "0000:9b:00.0", pcieRoot: pci0000:95, '
    "numaNode: 1}\n"
)
BINDING = [
    *DYNAMIC,
    "--mig-binding-conditions=true",
    "--mig-profiles=1g.10gb",
    "--mig-failure-hold=600",
]


def _devices(kube_api: Any, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in node_slices(kube_api, node) for d in s["spec"].get("devices", [])}


def _fail_mig_creation(node: GpuNode, gpu_uuid: str, message: str) -> None:
    """Make creating GPU instances on one simulated GPU fail, as a GPU in a bad state does."""
    path = node.node.plugin_dir(DRIVER) / SIMULATED_STATE_FILE
    state = json.loads(path.read_text())
    state["gpus"][gpu_uuid]["failCreate"] = message
    path.write_text(json.dumps(state))


@pytest.fixture
def binding_node(
    gpu_node: Callable[..., GpuNode],
    device_classes: None,
    cluster: LocalCluster,
    kube_api: Any,
    tmp_path: Path,
) -> tuple[GpuNode, dict[str, dict[str, Any]]]:
    """A node with two H100s in dynamic MIG mode with binding conditions, and its devices."""
    for gate in ("DRADeviceBindingConditions", "DRAPartitionableDevices"):
        if why := cluster.feature_off(gate):
            pytest.skip(f"no binding conditions for MIG placements: {why}")
    profile = tmp_path / "two-h100.yaml"
    profile.write_text(TWO_H100)
    node = gpu_node(str(profile), prefix="bind", extra=BINDING)
    # Two whole GPUs and seven 1g.10gb placements on each.
    wait_until(lambda: len(published_devices(kube_api, node.name)) == 16, 30, "devices published")
    return node, _devices(kube_api, node.name)


def test_mig_device_is_made_before_the_pod_is_bound(
    binding_node: tuple[GpuNode, dict[str, dict[str, Any]]], kube_api: Any, namespace: str
) -> None:
    node, devices = binding_node
    placement = devices["gpu-0-mig-1g10gb-19-0"]
    assert placement["bindingConditions"] == [READY]
    assert placement["bindingFailureConditions"] == [FAILED]
    assert "bindingConditions" not in devices["gpu-0"]

    apply(kube_api, namespace, mig_pod("early", node.name, "1g.10gb"))
    record = prepared(node, namespace, "early")
    claim = claim_of(kube_api, namespace, "early")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["bindingConditions"] == [READY]
    (status,) = claim["status"]["devices"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Ready": "True", READY: "True"}
    # The MIG device the container got is the one made before binding: one instance only.
    assert [i["uuid"] for i in instances(node)] == referenced(node) == [status["data"]["uuid"]]
    assert record["containers"]


def test_failed_mig_creation_sends_the_pod_to_another_gpu(
    binding_node: tuple[GpuNode, dict[str, dict[str, Any]]], kube_api: Any, namespace: str
) -> None:
    node, devices = binding_node
    first = devices["gpu-0"]["attributes"]["uuid"]["string"]
    second = devices["gpu-1"]["attributes"]["uuid"]["string"]
    _fail_mig_creation(node, first, "Insufficient Resources (injected)")
    # gpu-1 is taken whole for now, so the scheduler's only choice is a placement on gpu-0.
    blocker = f'device.attributes["{DRIVER}"].uuid == "{second}"'
    apply(kube_api, namespace, gpu_pod("blocker", node.name, "blocker-gpu", blocker))
    prepared(node, namespace, "blocker")

    # The agent fails to make the MIG device on gpu-0: failure condition, gpu-0 tainted.
    apply(kube_api, namespace, mig_pod("moved", node.name, "1g.10gb"))
    (event,) = wait_until(
        lambda: node_events(kube_api, node.name, "MIGCreateFailed"), 90, "MIGCreateFailed event"
    )
    assert first in event and "Insufficient Resources (injected)" in event

    def tainted() -> list[str]:
        taints = _devices(kube_api, node.name)["gpu-0-mig-1g10gb-19-0"].get("taints", [])
        return [t["key"] for t in taints]

    assert wait_until(tainted, 30, "gpu-0 tainted") == [f"{DRIVER}/mig-failed"]
    # gpu-1 free again: the scheduler, which deallocated the failed claim, places it there.
    delete_pods(kube_api, namespace, ["blocker"])
    # Rescheduling goes through the scheduler's back-off and its 5 s binding poll: give it time.
    record = node.node.wait_pod_record(
        namespace, "moved", lambda r: bool(r.get("containers")), timeout=180
    )
    assert "prepareError" not in record, record
    device = allocated_device(kube_api, namespace, "moved")
    assert device is not None and device.startswith("gpu-1-mig-1g10gb-"), device
    assert tainted() == [f"{DRIVER}/mig-failed"]
    # Nothing was left on the failing GPU; the pod's MIG device is on the other.
    made = instances(node)
    assert len(made) == 1 and made[0]["uuid"] == referenced(node)[0]
    claim = claim_of(kube_api, namespace, "moved")
    (status,) = claim["status"]["devices"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True",
        READY: "True",
    }


def test_a_claim_nested_thousands_deep_does_not_stop_binding(
    binding_node: tuple[GpuNode, dict[str, dict[str, Any]]], kube_api: Any, namespace: str
) -> None:
    """The agent watches every claim of the cluster for binding conditions; one nested
    deeper than Python's decoder goes by default (the API server allows it) is read, and
    the next MIG claim is still made before its pod binds."""
    node, _ = binding_node
    post_json(
        kube_api, resourceapi_path("resourceclaims", namespace), deep_claim("ResourceClaim", "deep")
    )
    apply(kube_api, namespace, mig_pod("after-deep", node.name, "1g.10gb"))
    record = prepared(node, namespace, "after-deep")
    assert record["containers"]
    assert node.driver.alive()
