"""Dynamic MIG by capacity end to end: each GPU one device that claims share by MIG slices;
the real scheduler counts the slices, the agent chooses the placement and makes the MIG device
before the pod is bound (binding conditions), and a share no profile fits is refused so the
pod is not bound."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode
from tests.e2e.conftest import wait_until
from tests.e2e.gpu import (
    apply,
    claim_of,
    node_events,
    node_slices,
    published_devices,
    template_pod,
)
from tests.e2e.mig import DYNAMIC
from tests.e2e.test_binding import READY, TWO_H100
from tests.e2e.test_dynamic_mig import instances, prepared, referenced

pytestmark = pytest.mark.e2e

DRIVER = "gpu.dra.dev"
CAPACITY = [*DYNAMIC, "--mig-layout=capacity", "--mig-binding-conditions=true"]


def slices_pod(name: str, node: str, compute: int = 0, memory: int = 0) -> str:
    """A pod with one claim for a GPU of this driver: its MIG slices, or (none) all of it."""
    capacity = (
        f", capacity: {{requests: {{computeSlices: '{compute}', memorySlices: '{memory}'}}}}"
        if compute
        else ""
    )
    devices = f"{{requests: [{{name: dev, exactly: {{deviceClassName: {DRIVER}{capacity}}}}}]}}"
    return template_pod(name, node, devices)


@pytest.fixture
def capacity_node(
    gpu_node: Callable[..., GpuNode],
    device_classes: None,
    cluster: LocalCluster,
    kube_api: Any,
    tmp_path: Path,
) -> GpuNode:
    """A node with two H100s published by MIG capacity, with binding conditions."""
    for gate in ("DRAConsumableCapacity", "DRADeviceBindingConditions"):
        if why := cluster.feature_off(gate):
            pytest.skip(f"no dynamic MIG by capacity: {why}")
    if cluster.minor < 36:
        # Seen on 1.34 (alpha): a claim without a capacity request did not allocate on such
        # a device, so whole GPUs are not served; the layout needs the beta of 1.36.
        pytest.skip(
            f"the capacity layout needs DRAConsumableCapacity as of 1.36 ({cluster.version})"
        )
    profile = tmp_path / "two-h100.yaml"
    profile.write_text(TWO_H100)
    node = gpu_node(str(profile), prefix="cap", extra=CAPACITY)
    wait_until(lambda: len(published_devices(kube_api, node.name)) == 2, 30, "devices published")
    return node


def _status(kube_api: Any, namespace: str, pod: str) -> tuple[dict[str, Any], dict[str, Any]]:
    claim = claim_of(kube_api, namespace, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    (status,) = claim["status"]["devices"]
    return result, status


def test_shares_of_mig_slices_and_a_whole_gpu_run_side_by_side(
    capacity_node: GpuNode, kube_api: Any, namespace: str
) -> None:
    node = capacity_node
    (slice_,) = node_slices(kube_api, node.name)
    devices = slice_["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    assert all(d["allowMultipleAllocations"] and d["bindingConditions"] == [READY] for d in devices)

    # One after the other: each MIG share takes the highest placement free when it is
    # prepared, so the order decides where they go (asserted below).
    apply(kube_api, namespace, slices_pod("small", node.name, 1, 1))
    prepared(node, namespace, "small")
    apply(kube_api, namespace, slices_pod("three", node.name, 3, 4))
    apply(kube_api, namespace, slices_pod("whole", node.name))
    for pod in ("three", "whole"):
        prepared(node, namespace, pod)
    gpus: dict[str, str] = {}
    for pod in ("small", "three", "whole"):
        result, status = _status(kube_api, namespace, pod)
        # The status names the share, or the API server would not have taken it.
        assert result["shareID"] and status["shareID"] == result["shareID"]
        assert {c["type"]: c["status"] for c in status["conditions"]} == {
            "Ready": "True",
            READY: "True",
        }
        gpus[pod] = result["device"]
    # The scheduler counted: the whole GPU is the one the MIG shares are not on.
    assert gpus["small"] == gpus["three"] != gpus["whole"]
    _, whole = _status(kube_api, namespace, "whole")
    assert whole["data"]["uuid"].startswith("GPU-")
    made = sorted((i["start"], i["size"]) for i in instances(node))
    assert made == [(0, 4), (6, 1)]  # 3g.40gb low, 1g.10gb from the top
    assert len(referenced(node)) == 2


def test_slices_no_profile_has_keep_the_pod_unbound_with_the_reason(
    capacity_node: GpuNode, kube_api: Any, namespace: str
) -> None:
    from kubernetes import client as k

    node = capacity_node
    apply(kube_api, namespace, slices_pod("odd", node.name, 1, 4))

    def refused() -> list[str]:
        events = k.CoreV1Api(kube_api).list_namespaced_event(namespace).items
        return [e.message for e in events if e.reason == "PrepareFailed"]

    (message, *_) = wait_until(refused, 90, "PrepareFailed event")
    assert "match no MIG profile" in message and "1g.10gb (1 and 1)" in message
    pod = k.CoreV1Api(kube_api).read_namespaced_pod("odd", namespace)
    assert not pod.spec.node_name
    assert instances(node) == []


def test_a_share_that_fits_by_count_but_not_by_position_is_placed_on_another_gpu(
    capacity_node: GpuNode, kube_api: Any, namespace: str
) -> None:
    node = capacity_node
    # First fit: both 2g.20gb land on gpu-0, at slices 4 and 2; its 3 compute and 4 memory
    # slices left fit a 3g.40gb by count, but neither 3g.40gb placement (0 or 4) is free.
    for pod in ("two-a", "two-b"):
        apply(kube_api, namespace, slices_pod(pod, node.name, 2, 2))
        prepared(node, namespace, pod)
    assert {_status(kube_api, namespace, p)[0]["device"] for p in ("two-a", "two-b")} == {"gpu-0"}
    apply(kube_api, namespace, slices_pod("three", node.name, 3, 4))
    (event,) = wait_until(
        lambda: node_events(kube_api, node.name, "MIGNoPlacement"), 90, "MIGNoPlacement event"
    )
    assert "no placement of 3g.40gb is free" in event

    def taints() -> list[str]:
        (slice_,) = node_slices(kube_api, node.name)
        gpu0 = next(d for d in slice_["spec"]["devices"] if d["name"] == "gpu-0")
        return [t["key"] for t in gpu0.get("taints", [])]

    assert wait_until(taints, 30, "gpu-0 tainted") == [f"{DRIVER}/mig-fragmented"]
    # The scheduler deallocated the claim on the binding failure and, gpu-0 tainted, took
    # gpu-1 (back-off and the 5 s binding poll take a while).
    record = node.node.wait_pod_record(
        namespace, "three", lambda r: bool(r.get("containers")), timeout=180
    )
    assert "prepareError" not in record, record
    result, _ = _status(kube_api, namespace, "three")
    assert result["device"] == "gpu-1"
    # On the empty gpu-1 the 3g.40gb takes the high placement, as a 1g would.
    assert sorted((i["start"], i["size"]) for i in instances(node)) == [(2, 2), (4, 2), (4, 4)]
    # The taint is short: gpu-0's free slices are offered again.
    assert wait_until(lambda: not taints(), 90, "gpu-0 untainted")
