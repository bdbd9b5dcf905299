"""One GPU shared among pods by memory end to end: the real scheduler counts each claim's memory
against a shared H100 (consumable capacity), the driver runs one MPS daemon for the GPU and
gives every container its own limit, and a pod that does not fit waits for memory to free up."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.simnode import GpuNode
from dra_driver.gpu.sharing.shared_gpus import consumed
from dra_driver.gpu.sharing.simulated import SIMULATED_STATE_FILE
from dra_driver.gpu.state.checkpoint import stored_claims
from dra_driver.gpu.state.device_state import CHECKPOINT_FILE
from tests.e2e.conftest import gone, raw, wait_until
from tests.e2e.gpu import DRIVER, claim_of, published_devices, wait_running

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "shared-gpu-memory" / "shared-gpu-memory.yaml"
SHARED_CLASS = f"shared.{DRIVER}"
MEMORY = {"small": "10Gi", "medium": "20Gi", "large": "40Gi", "extra": "20Gi"}
GIB = 2**30


def _create_shared_class(kube_api: Any) -> None:
    from kubernetes import client as k

    docs = yaml.safe_load_all((ROOT / "manifests" / "base" / "deviceclasses.yaml").read_text())
    body = next(d for d in docs if d and d["metadata"]["name"] == SHARED_CLASS)
    try:
        k.ResourceV1Api(kube_api).create_device_class(body)
    except k.exceptions.ApiException as exc:
        if exc.status != 409:
            raise


def _gib(text: str) -> int:
    return int(text.removesuffix("Gi"))


def _sharing_state(node: GpuNode) -> dict[str, Any]:
    path = node.node.plugin_dir(DRIVER) / SIMULATED_STATE_FILE
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _phase(kube_api: Any, namespace: str, pod: str) -> str:
    from kubernetes import client as k

    body = raw(k.CoreV1Api(kube_api).read_namespaced_pod, pod, namespace)
    return str(body["status"].get("phase", ""))


def _env(record: dict[str, Any]) -> set[str]:
    return set(record["containers"]["app"]["env"])


def test_three_pods_share_one_gpu_by_memory(
    gpu_node: Callable[..., GpuNode], kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client as k
    from kubernetes.dynamic import DynamicClient

    profile = tmp_path / "single-h100.yaml"
    shutil.copy(ROOT / "tests" / "data" / "single-h100.yaml", profile)
    node = gpu_node(str(profile), extra=["--shared-gpus=all"])
    _create_shared_class(kube_api)
    wait_until(lambda: published_devices(kube_api, node.name) == ["gpu-0"], 30, "slice published")

    objects = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    dyn = DynamicClient(kube_api)
    for obj in sorted(objects, key=lambda o: o["kind"] == "Pod"):
        if obj["kind"] == "Pod":
            obj["spec"]["nodeSelector"] = {"e2e-node": node.name}
            obj["spec"]["terminationGracePeriodSeconds"] = 1
            if obj["metadata"]["name"] == "extra":
                continue  # created once the other three hold their shares
        dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).create(
            body=obj, namespace=namespace
        )
    three = ("small", "medium", "large")
    for pod in three:
        wait_running(kube_api, namespace, pod, 90)

    # One GPU, three shares, each with what its claim asked for.
    share_ids = set()
    for pod in three:
        result = claim_of(kube_api, namespace, pod)["status"]["allocation"]["devices"]["results"][0]
        assert result["device"] == "gpu-0" and result["pool"] == node.name
        # The scheduler rounds to the policy's step and writes the sum in the step's format.
        assert consumed(result["consumedCapacity"])["memory"] == _gib(MEMORY[pod]) * GIB
        share_ids.add(result["shareID"])
    assert len(share_ids) == 3

    state = _sharing_state(node)
    (daemon_id,) = [d for d, rec in state["mps"].items() if rec["state"] == "running"]
    daemon = state["mps"][daemon_id]
    for pod in three:
        record = node.node.pod_record(namespace, pod)
        assert record and "prepareError" not in record, record
        container = record["containers"]["app"]
        assert "cdiError" not in container, container
        limit = _gib(MEMORY[pod]) * 1024
        assert {
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={limit}M",
        } <= _env(record)
        mounts = {m["containerPath"]: m["hostPath"] for m in container["mounts"]}
        assert mounts["/tmp/nvidia-mps"] == daemon["pipeDir"]
        (cdi,) = container["cdiDevices"]
        claim = claim_of(kube_api, namespace, pod)
        share = claim["status"]["allocation"]["devices"]["results"][0]["shareID"]
        assert cdi == f"k8s.gpu.dra.dev/claim={claim['metadata']['uid']}-gpu-0-{share}"

    # 70Gi of 79.6 GiB are taken: the fourth pod's 20Gi do not fit.
    extra = next(o for o in objects if o["kind"] == "Pod" and o["metadata"]["name"] == "extra")
    dyn.resources.get(api_version="v1", kind="Pod").create(body=extra, namespace=namespace)

    def unschedulable() -> bool:
        body = raw(k.CoreV1Api(kube_api).read_namespaced_pod, "extra", namespace)
        conditions = body["status"].get("conditions", [])
        return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)

    wait_until(unschedulable, 60, "extra unschedulable")
    assert _phase(kube_api, namespace, "extra") == "Pending"

    core = k.CoreV1Api(kube_api)
    core.delete_namespaced_pod("large", namespace)
    wait_until(lambda: gone(lambda: core.read_namespaced_pod("large", namespace)), 60, "large gone")
    wait_running(kube_api, namespace, "extra", 90)
    record = node.node.pod_record(namespace, "extra")
    assert record and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in _env(record)
    assert _sharing_state(node)["mps"][daemon_id]["starts"] == 1  # joined, not restarted

    for pod in ("small", "medium", "extra"):
        core.delete_namespaced_pod(pod, namespace)
    for pod in ("small", "medium", "extra"):
        wait_until(
            lambda p=pod: gone(lambda: core.read_namespaced_pod(p, namespace)), 60, f"{pod} gone"
        )
    state = _sharing_state(node)
    assert state["mps"][daemon_id]["state"] == "stopped"
    lifecycle = [e["op"] for e in state["log"] if e.get("daemon") == daemon_id]
    assert lifecycle == ["start-mps", "stop-mps"]
    assert not Path(daemon["pipeDir"]).exists()
    assert not list(node.node.cdi_dir.glob("k8s.gpu.dra.dev-claim_*.json"))
    assert stored_claims(node.node.plugin_dir(DRIVER) / CHECKPOINT_FILE) == {}
