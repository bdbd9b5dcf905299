"""List-type attributes end to end (``--list-attributes``): a GPU carries the MIG profiles it
supports as a list, and the real scheduler picks the GPU a claim's ``.includes()`` asks for.
Where the API server lacks DRAListTypeAttributes (off, or a release before 1.36), the agent
publishes without the lists and says so on the Node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode
from tests.e2e.conftest import wait_until
from tests.e2e.gpu import apply, gpu_pod, node_events, node_slices
from tests.e2e.test_dynamic_mig import allocated_device, prepared

pytestmark = pytest.mark.e2e

DRIVER = "gpu.dra.dev"
GATE = "DRAListTypeAttributes"
# An L4 first, so that without the selector the scheduler's first pick would be the L4.
L4_AND_H100 = """\
driverVersion: "580.95.05"
cudaDriverVersion: "13.0"
gpus:
  - {product: NVIDIA L4, pciBusId: "0000:81:00.0", pcieRoot: pci0000:80, numaNode: 1}
  - {product: NVIDIA H100 80GB HBM3, pciBusId: "0000:1b:00.0", pcieRoot: pci0000:15, numaNode: 0}
"""


def _attributes(kube_api: Any, node: str) -> dict[str, dict[str, Any]]:
    devices = [d for s in node_slices(kube_api, node) for d in s["spec"].get("devices", [])]
    return {d["name"]: d.get("attributes", {}) for d in devices}


@pytest.fixture
def list_node(gpu_node: Callable[..., GpuNode], tmp_path: Path) -> GpuNode:
    profile = tmp_path / "l4-h100.yaml"
    profile.write_text(L4_AND_H100)
    return gpu_node(str(profile), prefix="lists", extra=["--list-attributes=true"])


def test_a_claim_selects_a_gpu_by_a_mig_profile_it_supports(
    list_node: GpuNode,
    gpu_class: str,
    cluster: LocalCluster,
    kube_api: Any,
    namespace: str,
) -> None:
    if why := cluster.feature_off(GATE):
        pytest.skip(f"no list-type attributes: {why}")
    node = list_node
    attributes = wait_until(
        lambda: (a := _attributes(kube_api, node.name)) and len(a) == 2 and a, 30, "devices"
    )
    assert "migProfiles" not in attributes["gpu-0"]  # the L4 has no MIG
    profiles = attributes["gpu-1"]["migProfiles"]["strings"]
    assert "3g.40gb" in profiles and "7g.80gb" in profiles and profiles == sorted(profiles)

    # GPUs without MIG have no such attribute (a list may not be empty): has() keeps the
    # selector from failing on them, which would stop the scheduler for the whole pod.
    attr = f'device.attributes["{DRIVER}"]'
    selector = f'has({attr}.migProfiles) && {attr}.migProfiles.includes("3g.40gb")'
    apply(kube_api, namespace, gpu_pod("mig-able", node.name, "mig-able-gpu", selector))
    prepared(node, namespace, "mig-able")
    assert allocated_device(kube_api, namespace, "mig-able") == "gpu-1"


def test_without_the_gate_gpus_are_published_without_lists(
    list_node: GpuNode, cluster: LocalCluster, kube_api: Any
) -> None:
    if not cluster.feature_off(GATE):
        pytest.skip(f"{GATE} is on in this cluster; the fallback shows where it is off")
    node = list_node
    (message,) = wait_until(
        lambda: node_events(kube_api, node.name, "DRAFeatureUnavailable"), 30, "Node event"
    )
    assert GATE in message and "migProfiles" in message
    attributes = wait_until(
        lambda: (a := _attributes(kube_api, node.name)) and len(a) == 2 and a, 30, "devices"
    )
    assert not any("migProfiles" in a for a in attributes.values())
    assert attributes["gpu-1"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
