"""The node agent end to end: the real scheduler allocates from its slices, the kubelet's own
DRA code prepares through its sockets, and the CDI library resolves what it returns."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode
from dra_driver.gpu.state.checkpoint import stored_claims
from dra_driver.gpu.state.device_state import CHECKPOINT_FILE
from tests.e2e.conftest import gone, raw, wait_until
from tests.e2e.gpu import (
    DRIVER,
    apply,
    claim_of,
    deep_claim,
    gpu_pod,
    node_slices,
    post_json,
    published_devices,
    resourceapi_path,
)

pytestmark = pytest.mark.e2e


def test_driver_publishes_every_gpu(gpu_node: Callable[..., GpuNode], kube_api: Any) -> None:
    node = gpu_node("dgx-h100")
    names = wait_until(lambda: published_devices(kube_api, node.name), 30, "slices published")
    assert sorted(names) == sorted(f"gpu-{i}" for i in range(8))
    slices = node_slices(kube_api, node.name)
    assert all(
        s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] == node.name for s in slices
    )
    owner = slices[0]["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Node" and owner["name"] == node.name and owner["controller"] is True


def test_pod_gets_a_gpu_and_gives_it_back(
    gpu_node: Callable[..., GpuNode], gpu_class: str, kube_api: Any, namespace: str
) -> None:
    from kubernetes import client as k

    node = gpu_node("dgx-h100")
    wait_until(lambda: published_devices(kube_api, node.name), 30, "slices published")
    apply(kube_api, namespace, gpu_pod("trainer", node.name, "one-gpu"))
    record = node.node.wait_pod_record(
        namespace, "trainer", lambda r: bool(r.get("containers")), timeout=60
    )
    assert "prepareError" not in record, record
    main = record["containers"]["main"]
    claim = claim_of(kube_api, namespace, "trainer")
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert result["driver"] == DRIVER and result["pool"] == node.name
    device = result["device"]
    minor = int(device.removeprefix("gpu-"))
    uid = claim["metadata"]["uid"]
    assert main["cdiDevices"] == [f"k8s.gpu.dra.dev/claim={uid}-{device}"]
    assert "cdiError" not in main, main
    assert f"/dev/nvidia{minor}" in main["deviceNodes"] and "/dev/nvidiactl" in main["deviceNodes"]
    visible = [e for e in main["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible and visible[0].split("=", 1)[1].startswith("GPU-")
    spec_file = node.node.cdi_dir / f"k8s.gpu.dra.dev-claim_{uid}.json"
    assert json.loads(spec_file.read_text())["kind"] == "k8s.gpu.dra.dev/claim"
    claims = stored_claims(node.node.plugin_dir(DRIVER) / CHECKPOINT_FILE)
    assert claims[uid]["state"] == "PrepareCompleted"
    wait_until(
        lambda: (
            raw(k.CoreV1Api(kube_api).read_namespaced_pod, "trainer", namespace)["status"].get(
                "phase"
            )
            == "Running"
        ),
        30,
        "pod Running",
    )

    k.CoreV1Api(kube_api).delete_namespaced_pod("trainer", namespace)
    wait_until(
        lambda: gone(lambda: k.CoreV1Api(kube_api).read_namespaced_pod("trainer", namespace)),
        60,
        "pod gone",
    )
    assert not spec_file.exists()
    assert uid not in stored_claims(node.node.plugin_dir(DRIVER) / CHECKPOINT_FILE)


def test_bad_config_fails_that_claim_only(
    gpu_node: Callable[..., GpuNode], gpu_class: str, kube_api: Any, namespace: str
) -> None:
    node = gpu_node("l4x4")
    wait_until(lambda: published_devices(kube_api, node.name), 30, "slices published")
    bad = (
        gpu_pod("bad", node.name, "bad-gpu")
        .replace(
            "          deviceClassName: gpu.dra.dev",
            "          deviceClassName: gpu.dra.dev",
        )
        .replace(
            "    devices:\n      requests:",
            "    devices:\n      config:\n      - requests: [gpu]\n        opaque:\n          driver: gpu.dra.dev\n"
            "          parameters: {apiVersion: gpu.dra.dev/v1alpha1, kind: GpuConfig, sharing: {strategy: TimeSlicing, timeSlicingConfig: {intervall: Long}}}\n"
            "      requests:",
        )
    )
    apply(kube_api, namespace, bad)
    apply(kube_api, namespace, gpu_pod("good", node.name, "good-gpu"))
    record = node.node.wait_pod_record(namespace, "bad", lambda r: "prepareError" in r, timeout=60)
    assert "intervall" in record["prepareError"] and "unknown field" in record["prepareError"]
    good = node.node.wait_pod_record(
        namespace, "good", lambda r: bool(r.get("containers")), timeout=60
    )
    assert "prepareError" not in good
    assert node.driver.alive()


def test_agent_survives_a_restart_with_prepared_claims(
    gpu_node: Callable[..., GpuNode],
    gpu_class: str,
    kube_api: Any,
    namespace: str,
    cluster: LocalCluster,
) -> None:
    from kubernetes import client as k

    from devenv.simnode import start_driver

    node = gpu_node("l4x4")
    wait_until(lambda: published_devices(kube_api, node.name), 30, "slices published")
    apply(kube_api, namespace, gpu_pod("keep", node.name, "keep-gpu"))
    node.node.wait_pod_record(namespace, "keep", lambda r: bool(r.get("containers")), timeout=60)
    uid = claim_of(kube_api, namespace, "keep")["metadata"]["uid"]
    spec_file: Path = node.node.cdi_dir / f"k8s.gpu.dra.dev-claim_{uid}.json"
    assert spec_file.exists()

    cluster.stop_process(f"driver-{node.name}")
    start_driver(cluster, node.node, "l4x4")
    # The restarted agent unprepares a claim it has no memory of preparing in this process.
    k.CoreV1Api(kube_api).delete_namespaced_pod("keep", namespace)
    wait_until(
        lambda: gone(lambda: k.CoreV1Api(kube_api).read_namespaced_pod("keep", namespace)),
        60,
        "pod gone",
    )
    assert not spec_file.exists()


def test_a_claim_nested_thousands_deep_fails_alone(
    gpu_node: Callable[..., GpuNode], gpu_class: str, kube_api: Any, namespace: str
) -> None:
    """The API server stores opaque parameters nested thousands deep (within 10 KiB); such a
    claim fails alone, saying what to fix, and the agent prepares every other claim."""
    node = gpu_node("l4x4")
    wait_until(lambda: published_devices(kube_api, node.name), 30, "slices published")
    post_json(
        kube_api,
        resourceapi_path("resourceclaimtemplates", namespace),
        deep_claim("ResourceClaimTemplate", "deep-gpu"),
    )
    pod = gpu_pod("deep", node.name, "deep-gpu")
    apply(kube_api, namespace, pod[pod.index("apiVersion: v1\nkind: Pod") :])
    record = node.node.wait_pod_record(namespace, "deep", lambda r: "prepareError" in r, timeout=60)
    assert "nested too deeply to read" in record["prepareError"], record

    apply(kube_api, namespace, gpu_pod("plain", node.name, "plain-gpu"))
    plain = node.node.wait_pod_record(
        namespace, "plain", lambda r: bool(r.get("containers")), timeout=60
    )
    assert "prepareError" not in plain
    assert node.driver.alive()
