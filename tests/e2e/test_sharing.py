"""Sharing settings applied on the node end to end: a time-sliced claim and an MPS claim get
their hardware steps (recorded by the simulated sharing backend) and the environment and mounts
the CDI library resolves for their containers; both are undone when the pods go."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devenv.simnode import GpuNode
from dra_driver.gpu.sharing.simulated import SIMULATED_STATE_FILE
from dra_driver.gpu.state.checkpoint import stored_claims
from dra_driver.gpu.state.device_state import CHECKPOINT_FILE
from tests.e2e.conftest import gone, raw, wait_until
from tests.e2e.gpu import DRIVER, apply, claim_of, gpu_pod, published_devices

pytestmark = pytest.mark.e2e


def _with_config(pod_yaml: str, sharing: str) -> str:
    config = (
        "    devices:\n      config:\n      - requests: [gpu]\n        opaque:\n"
        f"          driver: {DRIVER}\n          parameters: {{apiVersion: gpu.dra.dev/v1alpha1, "
        f"kind: GpuConfig, sharing: {sharing}}}\n      requests:"
    )
    return pod_yaml.replace("    devices:\n      requests:", config)


def _sharing_state(node: GpuNode) -> dict[str, Any]:
    path: Path = node.node.plugin_dir(DRIVER) / SIMULATED_STATE_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data


def _device_uuid(kube_api: Any, namespace: str, pod: str, node: GpuNode) -> tuple[str, str]:
    claim = claim_of(kube_api, namespace, pod)
    uid = claim["metadata"]["uid"]
    claims = stored_claims(node.node.plugin_dir(DRIVER) / CHECKPOINT_FILE)
    return uid, claims[uid]["devices"][0]["uuid"]


def test_time_slicing_and_mps_are_applied_and_undone(
    gpu_node: Callable[..., GpuNode], gpu_class: str, kube_api: Any, namespace: str
) -> None:
    from kubernetes import client as k

    node = gpu_node("l4x4")
    wait_until(lambda: published_devices(kube_api, node.name), 30, "slices published")
    sliced = "{strategy: TimeSlicing, timeSlicingConfig: {interval: Long}}"
    mps = (
        "{strategy: MPS, mpsConfig: {defaultActiveThreadPercentage: 50, "
        "defaultPinnedDeviceMemoryLimit: 4Gi}}"
    )
    apply(kube_api, namespace, _with_config(gpu_pod("sliced", node.name, "sliced"), sliced))
    apply(kube_api, namespace, _with_config(gpu_pod("mps", node.name, "mps"), mps))
    records = {
        pod: node.node.wait_pod_record(
            namespace, pod, lambda r: bool(r.get("containers")) or "prepareError" in r, timeout=60
        )
        for pod in ("sliced", "mps")
    }
    for record in records.values():
        assert "prepareError" not in record, record

    # Time-slicing: the GPU's compute policy, no MPS in the container.
    _, sliced_uuid = _device_uuid(kube_api, namespace, "sliced", node)
    state = _sharing_state(node)
    assert state["gpus"][sliced_uuid]["timeslice"] == "Long"
    main = records["sliced"]["containers"]["main"]
    assert "cdiError" not in main, main
    assert not [e for e in main["env"] if e.startswith("CUDA_MPS_")]

    # MPS: one daemon for the claim, its pipe and shm directories in the container.
    mps_uid, mps_uuid = _device_uuid(kube_api, namespace, "mps", node)
    daemon = state["mps"][mps_uid]
    assert daemon["state"] == "running" and daemon["uuids"] == [mps_uuid]
    assert daemon["activeThreadPercentage"] == 50 and daemon["pinnedMemory"] == {"0": "4096M"}
    main = records["mps"]["containers"]["main"]
    assert "cdiError" not in main, main
    env = set(main["env"])
    assert {
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M",
    } <= env
    mounts = {m["containerPath"]: m["hostPath"] for m in main["mounts"]}
    assert mounts["/tmp/nvidia-mps"] == daemon["pipeDir"]
    assert mounts["/dev/shm"] == daemon["shmDir"]
    assert Path(daemon["pipeDir"], "control").exists()

    core = k.CoreV1Api(kube_api)
    for pod in ("sliced", "mps"):
        core.delete_namespaced_pod(pod, namespace)
    for pod in ("sliced", "mps"):
        wait_until(
            lambda p=pod: gone(lambda: core.read_namespaced_pod(p, namespace)), 60, f"{pod} gone"
        )
    state = _sharing_state(node)
    assert state["gpus"][sliced_uuid]["timeslice"] == "Default"
    assert state["mps"][mps_uid]["state"] == "stopped"
    assert not Path(daemon["pipeDir"]).exists()
    ops = [(e["op"], e.get("daemon") or e.get("uuid")) for e in state["log"]]
    assert ops.index(("start-mps", mps_uid)) < ops.index(("stop-mps", mps_uid))
    assert ops.index(("set-timeslice", sliced_uuid)) < ops.index(("reset-timeslice", sliced_uuid))
    assert not list(node.node.cdi_dir.glob("k8s.gpu.dra.dev-claim_*.json"))
    claims = raw(k.ResourceV1Api(kube_api).list_namespaced_resource_claim, namespace)["items"]
    assert all(not c.get("status", {}).get("reservedFor") for c in claims)
