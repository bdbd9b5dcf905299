"""Every example on the demo cluster (a dgx-h100 and a mixed node, each with the driver):
the real scheduler places it on the devices its README names, or leaves it pending with the
message its README quotes, and the kubelet's DRA code prepares what was allocated."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode, start_gpu_node
from tests.e2e.conftest import ensure_default_service_account, raw, wait_until
from tests.e2e.test_manifests_e2e import (
    BASE,
    EXAMPLES,
    EXAMPLES_DIR,
    Expect,
    by_kind,
    example_objects,
)

pytestmark = pytest.mark.e2e

LABEL = "e2e-examples"


@pytest.fixture(scope="module")
def demo_nodes(cluster: LocalCluster, kube_api: Any) -> Iterator[dict[str, GpuNode]]:
    """profile -> node, both labelled so example pods land only here."""
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(kube_api)
    for doc in [d for d in yaml.safe_load_all((BASE / "deviceclasses.yaml").read_text()) if d]:
        try:
            dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"]).create(body=doc)
        except Exception as exc:  # already there from another test
            if "AlreadyExists" not in str(exc) and "already exists" not in str(exc):
                raise
    suffix = uuid.uuid4().hex[:5]
    nodes = {
        profile: start_gpu_node(cluster, f"{profile}-{suffix}", profile, labels={LABEL: suffix})
        for profile in ("dgx-h100", "mixed")
    }

    def published() -> bool:
        items = raw(k.ResourceV1Api(kube_api).list_resource_slice)["items"]
        return {s["spec"].get("nodeName") for s in items} >= {n.name for n in nodes.values()}

    wait_until(published, 60, "both nodes published")
    yield nodes
    for node in nodes.values():
        cluster.stop_process(f"driver-{node.name}")
        cluster.stop_node(node.name)
        k.CoreV1Api(kube_api).delete_node(node.name)


def _pin(objects: list[dict[str, Any]], value: str) -> None:
    for pod in by_kind(objects, "Pod"):
        pod["spec"].setdefault("nodeSelector", {})[LABEL] = value


def _claims_of(kube_api: Any, namespace: str, pod: dict[str, Any]) -> list[dict[str, Any]]:
    names = {s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses", [])}
    names |= {r.get("resourceClaimName") for r in pod["spec"].get("resourceClaims", [])}
    items = raw(k.ResourceV1Api(kube_api).list_namespaced_resource_claim, namespace)["items"]
    return [c for c in items if c["metadata"]["name"] in names]


def _scheduling_message(kube_api: Any, namespace: str, name: str) -> str:
    pod = raw(k.CoreV1Api(kube_api).read_namespaced_pod, name, namespace)
    conds = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
    return str(conds[0].get("message", "")) if conds and conds[0]["status"] == "False" else ""


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example(
    example: str, cluster: LocalCluster, demo_nodes: dict[str, GpuNode], kube_api: Any
) -> None:
    from kubernetes.dynamic import DynamicClient

    expect: Expect = EXAMPLES[example]
    for gate in expect.gates:
        if why := cluster.feature_off(gate):
            pytest.skip(f"example {example} needs {gate}: {why}")
    core = k.CoreV1Api(kube_api)
    namespace = f"ex-{example}-{uuid.uuid4().hex[:5]}"[:63]
    core.create_namespace({"metadata": {"name": namespace, "labels": expect.namespace_labels}})
    ensure_default_service_account(core, namespace)
    label = next(iter(demo_nodes.values())).node.labels[LABEL]
    objects = example_objects(EXAMPLES_DIR / example)
    _pin(objects, label)
    try:
        dyn = DynamicClient(kube_api)
        for obj in sorted(objects, key=lambda o: o["kind"] == "Pod"):
            dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).create(body=obj, namespace=namespace)
        pods = [p["metadata"]["name"] for p in by_kind(objects, "Pod")]
        if not expect.scheduled:
            for pod in pods:
                message = wait_until(lambda p=pod: expect.message in _scheduling_message(kube_api, namespace, p), 60, f"{pod} unschedulable")
                assert message
            return
        profiles = {n.name: profile for profile, n in demo_nodes.items()}
        for pod_name in pods:
            def placed(p: str = pod_name) -> dict[str, Any] | None:
                pod = raw(core.read_namespaced_pod, p, namespace)
                return pod if pod["status"].get("phase") == "Running" else None

            pod = wait_until(placed, 90, f"{pod_name} Running")
            node = pod["spec"]["nodeName"]
            profile = profiles[node]
            assert profile in expect.devices, f"{pod_name} landed on {profile}"
            record = demo_nodes[profile].node.pod_record(namespace, pod_name)
            assert record and "prepareError" not in record, record
            for cname, container in record["containers"].items():
                assert "cdiError" not in container, (cname, container)
            for claim in _claims_of(kube_api, namespace, pod):
                results = claim["status"]["allocation"]["devices"]["results"]
                if expect.count is not None:
                    assert len(results) == expect.count, results
                for result in results:
                    assert result["pool"] == node
                    assert re.fullmatch(expect.devices[profile], result["device"]), result
    finally:
        _release(kube_api, namespace)


def _release(kube_api: Any, namespace: str) -> None:
    """Give the example's devices back before the next example runs.

    Pods are deleted gracefully (the kubelet unprepares first), then the claims, which frees
    their allocations; the namespace itself is left to the namespace controller, whose
    clean-up of every API group takes longer than the devices need.
    """
    core = k.CoreV1Api(kube_api)
    resource = k.ResourceV1Api(kube_api)
    core.delete_collection_namespaced_pod(namespace)
    wait_until(lambda: not raw(core.list_namespaced_pod, namespace)["items"], 90, f"pods of {namespace} gone")
    resource.delete_collection_namespaced_resource_claim(namespace)
    wait_until(
        lambda: not raw(resource.list_namespaced_resource_claim, namespace)["items"], 60, f"claims of {namespace} gone"
    )
    core.delete_namespace(namespace)
