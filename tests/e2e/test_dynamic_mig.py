"""Dynamic MIG end to end: the real scheduler allocates MIG placements through shared counters,
the driver carves them out of a simulated H100 when the kubelet prepares them and destroys them
when the pods go, also when it is killed at any step in between."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode, start_driver
from dra_driver import faults
from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE
from tests.e2e.conftest import gone, raw, wait_until
from tests.e2e.gpu import apply, claim_of, one_request, template_pod
from tests.e2e.mig import DYNAMIC
from tests.e2e.test_crash import check_node_consistent

pytestmark = pytest.mark.e2e

DRIVER = "gpu.dra.dev"
MIG_CLASS = "mig.gpu.dra.dev"


def pod(name: str, node: str, device_class: str, selector: str = "") -> str:
    return template_pod(name, node, one_request(device_class, selector))


def mig_pod(name: str, node: str, profile: str) -> str:
    return pod(name, node, MIG_CLASS, f'device.attributes["{DRIVER}"].profile == "{profile}"')


def instances(node: GpuNode) -> list[dict[str, Any]]:
    path = node.node.plugin_dir(DRIVER) / SIMULATED_STATE_FILE
    state = json.loads(path.read_text())
    return [i for g in state["gpus"].values() for i in g["instances"]]


def allocated_device(kube_api: Any, namespace: str, name: str) -> str | None:
    try:
        claim = claim_of(kube_api, namespace, name)
    except AssertionError:
        return None
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    found = results.get("results") or []
    return str(found[0]["device"]) if found else None


def prepared(node: GpuNode, namespace: str, name: str) -> dict[str, Any]:
    record = node.node.wait_pod_record(
        namespace, name, lambda r: bool(r.get("containers")), timeout=60
    )
    assert "prepareError" not in record, record
    return dict(record)


def delete_pods(kube_api: Any, namespace: str, names: list[str]) -> None:
    from kubernetes import client as k

    core = k.CoreV1Api(kube_api)
    for name in names:
        core.delete_namespaced_pod(name, namespace)
    for name in names:

        def is_gone(n: str = name) -> bool:
            return gone(lambda: core.read_namespaced_pod(n, namespace))

        wait_until(is_gone, 60, f"{name} gone")


def referenced(node: GpuNode) -> list[str]:
    """MIG UUIDs the checkpoint's prepared claims hold."""
    claims = check_node_consistent(node.node)
    return sorted(d["uuid"] for c in claims.values() for d in c["devices"] if d.get("mig"))


def test_3g_and_4g_do_not_overlap_and_exclude_the_whole_gpu(
    mig_node: Callable[..., GpuNode], device_classes: None, kube_api: Any, namespace: str
) -> None:
    node = mig_node()
    apply(kube_api, namespace, mig_pod("three", node.name, "3g.40gb"))
    apply(kube_api, namespace, mig_pod("four", node.name, "4g.40gb"))
    records = {n: prepared(node, namespace, n) for n in ("three", "four")}
    devices = {n: allocated_device(kube_api, namespace, n) for n in records}
    # 3g at 0 would overlap the only 4g placement; the scheduler must pick 3g at 4.
    assert devices == {"three": "gpu-0-mig-3g40gb-9-4", "four": "gpu-0-mig-4g40gb-5-0"}
    made = instances(node)
    assert sorted((i["profileId"], i["start"]) for i in made) == [(5, 0), (9, 4)]
    assert sorted(i["uuid"] for i in made) == referenced(node)
    for name, record in records.items():
        env = record["containers"]["main"]["env"]
        uuid = next(e.split("=", 1)[1] for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES="))
        assert uuid.startswith("MIG-") and uuid in {i["uuid"] for i in made}, name
        assert any("nvidia-caps" in p for p in record["containers"]["main"]["deviceNodes"])

    apply(kube_api, namespace, pod("whole", node.name, DRIVER))
    from kubernetes import client as k

    def unschedulable() -> bool:
        body = raw(k.CoreV1Api(kube_api).read_namespaced_pod, "whole", namespace)
        conds = body["status"].get("conditions") or []
        return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)

    wait_until(unschedulable, 30, "whole-GPU pod reported unschedulable")
    assert allocated_device(kube_api, namespace, "whole") is None

    delete_pods(kube_api, namespace, ["three", "four"])
    assert instances(node) == []
    # The GPU is whole again: the waiting pod gets it (and MIG mode goes off).
    prepared(node, namespace, "whole")
    assert allocated_device(kube_api, namespace, "whole") == "gpu-0"
    delete_pods(kube_api, namespace, ["whole"])
    assert check_node_consistent(node.node) == {}


def test_seven_1g_fit_an_eighth_does_not(
    mig_node: Callable[..., GpuNode], device_classes: None, kube_api: Any, namespace: str
) -> None:
    node = mig_node()
    names = [f"small-{i}" for i in range(8)]
    for name in names:
        apply(kube_api, namespace, mig_pod(name, node.name, "1g.10gb"))

    def settled() -> bool:
        return sum(allocated_device(kube_api, namespace, n) is not None for n in names) == 7

    wait_until(settled, 60, "seven claims allocated")
    placed = [n for n in names if allocated_device(kube_api, namespace, n)]
    for name in placed:
        prepared(node, namespace, name)
    assert len(instances(node)) == 7
    starts = sorted(i["start"] for i in instances(node))
    assert starts == list(range(7))
    waiting = [n for n in names if n not in placed]
    assert len(waiting) == 1 and allocated_device(kube_api, namespace, waiting[0]) is None
    delete_pods(kube_api, namespace, names)
    assert instances(node) == [] and check_node_consistent(node.node) == {}


PREPARE_POINTS = (
    "prepare.started-recorded",
    "prepare.mig-enabled",
    "mig.gi-created",
    "prepare.mig-created",
    "prepare.completed-recorded",
)
UNPREPARE_POINTS = (
    "unprepare.started-recorded",
    "unprepare.cdi-removed",
    "mig.ci-destroyed",
    "unprepare.mig-destroyed",
    "unprepare.recorded",
)


def crash_and_restart(cluster: LocalCluster, node: GpuNode, point: str, profile: str) -> None:
    wait_until(lambda: not node.driver.alive(), 60, f"agent to crash at {point}")
    assert node.driver.returncode() == faults.EXIT_CODE, node.driver.log_tail()
    node.driver = start_driver(cluster, node.node, profile, extra=DYNAMIC)


@pytest.mark.parametrize("point", PREPARE_POINTS + UNPREPARE_POINTS)
def test_killed_driver_leaves_no_orphans(
    mig_node: Callable[..., GpuNode],
    device_classes: None,
    kube_api: Any,
    namespace: str,
    cluster: LocalCluster,
    profile: str,
    point: str,
) -> None:
    node = mig_node(point)
    apply(kube_api, namespace, mig_pod("victim", node.name, "3g.40gb"))
    if point in PREPARE_POINTS:
        crash_and_restart(cluster, node, point, profile)
        prepared(node, namespace, "victim")  # the kubelet retries against the new agent
    else:
        prepared(node, namespace, "victim")
    made = instances(node)
    assert len(made) == 1 and [i["uuid"] for i in made] == referenced(node)
    from kubernetes import client as k

    k.CoreV1Api(kube_api).delete_namespaced_pod("victim", namespace)
    if point in UNPREPARE_POINTS:
        crash_and_restart(cluster, node, point, profile)
    wait_until(
        lambda: gone(lambda: k.CoreV1Api(kube_api).read_namespaced_pod("victim", namespace)),
        90,
        "pod gone",
    )
    assert instances(node) == []
    assert check_node_consistent(node.node) == {}
