"""The examples on the real node: each container sees exactly its devices.

Every pod runs ``localhost/dra-test/busybox:local`` and prints its environment and its
NVIDIA device nodes; the assertions read that output from the pod log through the API.
"""

from __future__ import annotations

import pytest

from tests.node.probe import NVIDIA_MAJOR, Node

pytestmark = pytest.mark.node


def gpu_minor(device: str) -> int:
    """The simulated GPU's minor number: its index, the N of ``gpu-N``."""
    return int(device.split("-")[1])


def test_single_gpu_container_sees_its_gpu(node: Node, namespace: str) -> None:
    (pod,) = node.apply_example("single-gpu", namespace)
    seen = node.seen(namespace, pod)
    (dev,) = node.allocated(namespace, pod)
    assert seen.visible_devices() == {dev.attr("uuid")}, seen.log
    minor = gpu_minor(dev.device)
    assert seen.devices[f"/dev/nvidia{minor}"] == (NVIDIA_MAJOR, minor), seen.log
    other = {p for p in seen.devices if p.startswith("/dev/nvidia") and p[11:].isdigit()}
    assert other == {f"/dev/nvidia{minor}"}, seen.log


def test_container_without_claim_sees_no_gpu(node: Node, namespace: str) -> None:
    node.run_pod(namespace, "no-claim")
    seen = node.seen(namespace, "no-claim")
    assert "NVIDIA_VISIBLE_DEVICES" not in seen.env, seen.log
    assert not seen.devices, seen.log
    assert "No such file or directory" in seen.log


def test_pod_deletion_removes_the_cdi_spec(node: Node, namespace: str) -> None:
    (pod,) = node.apply_example("single-gpu", namespace)
    node.seen(namespace, pod)
    uids = node.claim_uids(namespace, pod)
    assert node.cdi_specs_for(uids), f"no CDI spec for {uids} in {node.cdi_dir}"
    node.delete_pod(namespace, pod)
    assert not node.cdi_specs_for(uids)
