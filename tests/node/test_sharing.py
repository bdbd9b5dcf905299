"""MIG devices, shared GPUs, admin access and the extended resource on the real node.

As in test_examples: what each container printed is read back from its pod log.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.node.loadcheck import TRIPLET_DIR
from tests.node.probe import NVIDIA_MAJOR, Node, wait_until

pytestmark = pytest.mark.node

MPS_PIPE = "/tmp/nvidia-mps"


def test_mig_device_and_its_capabilities(node: Node, namespace: str) -> None:
    (pod,) = node.apply_example("mig-1g10gb", namespace)
    seen = node.seen(namespace, pod)
    (dev,) = node.allocated(namespace, pod)
    assert seen.visible_devices() == {dev.attr("uuid")}, seen.log
    # The MIG device's parent GPU node and the capability nodes of its GPU and compute
    # instances.
    parents = [p for p in seen.devices if p[len("/dev/nvidia") :].isdigit()]
    assert len(parents) == 1, seen.log
    assert seen.devices[parents[0]][0] == NVIDIA_MAJOR
    caps = [p for p in seen.devices if p.startswith("/dev/nvidia-caps/nvidia-cap")]
    assert len(caps) == 2, seen.log
    # The driver's libraries come with a MIG device as with a whole GPU (test_driverfiles).
    assert seen.mount_options(f"{TRIPLET_DIR}/libcuda.so.1"), seen.log


def test_time_slicing_shares_one_gpu_between_containers(node: Node, namespace: str) -> None:
    (pod,) = node.apply_example("time-slicing", namespace)
    trainer = node.seen(namespace, pod, "trainer")
    evaluator = node.seen(namespace, pod, "evaluator")
    (dev,) = node.allocated(namespace, pod)
    assert trainer.visible_devices() == evaluator.visible_devices() == {dev.attr("uuid")}
    assert trainer.devices == evaluator.devices
    # The claim's device status, written by the agent with its service account. The Python
    # client sent the claim's parameters with ", " separators, which the API server cannot
    # apply a status to: the agent writes it by update (its chart grants that).
    (name,) = node.claim_names(namespace, pod)
    claims = node.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")

    def device_status() -> list[dict[str, Any]]:
        claim = claims.get(name=name, namespace=namespace).to_dict()
        return list(claim.get("status", {}).get("devices") or [])

    (entry,) = wait_until(device_status, "the claim's status.devices")
    assert (entry["device"], entry["data"]["uuid"]) == (dev.device, dev.attr("uuid"))


def test_mps_clients_get_the_pipe_directory(node: Node, namespace: str) -> None:
    (pod,) = node.apply_example("mps", namespace)
    for container in ("client-a", "client-b"):
        seen = node.seen(namespace, pod, container)
        assert seen.env.get("CUDA_MPS_PIPE_DIRECTORY") == MPS_PIPE, seen.log
        assert any(m.split()[1] == MPS_PIPE for m in seen.mounts), seen.log


def test_admin_access_sees_every_whole_gpu(node: Node, namespace: str) -> None:
    node.core.patch_namespace(
        namespace, {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}}
    )
    (pod,) = node.apply_example("admin-access", namespace)
    seen = node.seen(namespace, pod, "monitor")
    devices = node.allocated(namespace, pod)
    assert len(devices) >= 2
    assert seen.visible_devices() == {d.attr("uuid") for d in devices}, seen.log


def test_extended_resource_gets_a_gpu_through_dra(node: Node, namespace: str) -> None:
    limits: dict[str, Any] = {"nvidia.com/gpu": "1"}
    node.run_pod(namespace, "extended", resources={"limits": limits})
    seen = node.seen(namespace, "extended")
    (dev,) = node.allocated(namespace, "extended")
    assert seen.visible_devices() == {dev.attr("uuid")}, seen.log
    minor = int(dev.device.split("-")[1])
    assert seen.devices[f"/dev/nvidia{minor}"] == (NVIDIA_MAJOR, minor), seen.log
    # The node itself does not advertise the resource: only the DeviceClass serves it.
    status = client.CoreV1Api(node.api).read_node(node.name).status
    assert "nvidia.com/gpu" not in (status.allocatable or {})
