"""Driver features that the chart turns on: GPUs shared by memory and dynamic MIG.

Each test upgrades the release with the feature's value and restores it afterwards. The
feature fixture comes before `namespace` so that the test's pods are deleted (their claims
unprepared) while the feature is still on: a driver restarted with dynamic MIG off cannot
unprepare a claim whose MIG device it created (see docs/real-node.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.node.loadcheck import TRIPLET_DIR
from tests.node.probe import Node, wait_until

pytestmark = pytest.mark.node


@pytest.fixture
def shared_gpus(node: Node) -> Iterator[None]:
    node.upgrade_driver("features.sharedGpus=all")
    yield
    node.upgrade_driver("features.sharedGpus=")


@pytest.fixture
def dynamic_mig(node: Node) -> Iterator[None]:
    node.upgrade_driver("features.dynamicMig=true")
    yield
    node.upgrade_driver("features.dynamicMig=false")


def test_shared_gpu_by_memory(node: Node, shared_gpus: None, namespace: str) -> None:
    limits = {"small": "0=10240M", "medium": "0=20480M"}
    pods = node.apply_example("shared-gpu-memory", namespace, only=limits)
    assert sorted(pods) == sorted(limits)
    for pod in pods:
        seen = node.seen(namespace, pod)
        (dev,) = node.allocated(namespace, pod)
        assert seen.visible_devices() == {dev.attr("uuid")}, seen.log
        assert seen.env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == limits[pod], seen.log
        assert seen.env.get("CUDA_MPS_PIPE_DIRECTORY"), seen.log
        # A share of a GPU gets the driver's libraries as a whole GPU does.
        assert seen.mount_options(f"{TRIPLET_DIR}/libcuda.so.1"), seen.log


def test_dynamic_mig_creates_devices_on_prepare(
    node: Node, dynamic_mig: None, namespace: str
) -> None:
    wait_until(lambda: any("-mig-4g40gb-" in d for _, d in node.published_devices()), "placements")
    pods = node.apply_example("dynamic-mig", namespace)
    uuids = set()
    for pod in pods:
        seen = node.seen(namespace, pod)
        (visible,) = seen.visible_devices()
        assert visible.startswith("MIG-"), seen.log
        caps = [p for p in seen.devices if p.startswith("/dev/nvidia-caps/nvidia-cap")]
        assert len(caps) == 2, seen.log
        uuids.add(visible)
    assert len(uuids) == 2
