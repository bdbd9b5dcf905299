"""Restarts and upgrades on the real node while pods hold claims: nothing is lost.

A pod holding a GPU must keep its containers (same container IDs, no restart) and its
claim's CDI spec through a kubelet restart, a containerd restart and a `helm upgrade` of
the driver; afterwards new claims still work and deleting the pod still unprepares.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.node.probe import CHART, Node, wait_until

pytestmark = pytest.mark.node


def hold_a_gpu(node: Node, namespace: str) -> tuple[str, dict[str, str], list[str]]:
    """Start the single-gpu example; its pod, container IDs and claim UIDs."""
    (pod,) = node.apply_example("single-gpu", namespace)
    node.seen(namespace, pod)
    uids = node.claim_uids(namespace, pod)
    assert node.cdi_specs_for(uids)
    return pod, node.container_ids(namespace, pod), uids


def assert_kept(node: Node, namespace: str, pod: str, ids: dict[str, str]) -> None:
    p = node.core.read_namespaced_pod(pod, namespace)
    assert p.status.phase == "Running"
    assert node.container_ids(namespace, pod) == ids
    assert all(c.restart_count == 0 for c in p.status.container_statuses or [])


def new_claims_still_work(node: Node, namespace: str) -> None:
    """A second pod with a claim of its own starts and sees one GPU."""
    (second,) = node.apply_example(
        "single-gpu",
        namespace,
        edit=lambda o: o["metadata"].update(name=o["metadata"]["name"] + "-2"),
    )
    seen = node.seen(namespace, second)
    assert len(seen.visible_devices()) == 1, seen.log


@pytest.mark.parametrize("component", ["kubelet", "containerd"])
def test_restart_keeps_running_pods(node: Node, namespace: str, component: str) -> None:
    pod, ids, uids = hold_a_gpu(node, namespace)
    node.restart(component)
    wait_until(lambda: node.driver_pods() and node.registration_sockets(), "the driver")
    new_claims_still_work(node, namespace)
    assert_kept(node, namespace, pod, ids)
    assert node.cdi_specs_for(uids)
    node.delete_pod(namespace, pod)
    assert not node.cdi_specs_for(uids)


def test_helm_upgrade_with_claims_held(node: Node, namespace: str) -> None:
    """The DaemonSet's surge update: the new agent takes over, no claim or pod is lost."""
    pod, ids, uids = hold_a_gpu(node, namespace)
    (old,) = node.driver_pods()
    old_sockets = node.registration_sockets()
    image = old.spec.containers[0].image
    repo, tag = image.rsplit(":", 1)
    for node_dir in node.node_dirs:  # the DaemonSet runs on every node
        node.ctr("images", "tag", "--force", image, f"{repo}:upgraded", node_dir=node_dir)
    try:
        node.helm(
            "upgrade",
            "dra-driver",
            str(CHART),
            "--reuse-values",
            "--set",
            "image.tag=upgraded",
            "--wait",
            "--timeout",
            "3m",
        )

        def taken_over() -> bool:
            pods = node.driver_pods()
            return (
                len(pods) == 1
                and pods[0].metadata.uid != old.metadata.uid
                and bool(node.registration_sockets() - old_sockets)
            )

        wait_until(taken_over, "the new driver pod to replace the old one")
        (new,) = node.driver_pods()
        assert new.spec.containers[0].image == f"{repo}:upgraded"
        assert node.registration_sockets() == {
            s for s in node.registration_sockets() if new.metadata.uid in s
        }
        new_claims_still_work(node, namespace)
        assert_kept(node, namespace, pod, ids)
        assert node.cdi_specs_for(uids)
        node.delete_pod(namespace, pod)
        assert not node.cdi_specs_for(uids)
    finally:
        node.helm(
            "upgrade",
            "dra-driver",
            str(CHART),
            "--reuse-values",
            "--set",
            f"image.tag={tag}",
            "--wait",
            "--timeout",
            "3m",
        )


def test_uninstall_and_cleanup_leave_no_slice(node: Node) -> None:
    """`helm uninstall` and `dra-driver cleanup` remove every trace; then reinstall."""
    values = node.base / "chart-values.yaml"
    try:
        node.helm("uninstall", "dra-driver", "--wait")
        wait_until(lambda: not node.driver_pods(), "the driver pod to go")
        cleanup = Path(sys.executable).parent / "dra-driver"
        for name in node.nodes:
            subprocess.run(
                [
                    str(cleanup),
                    "cleanup",
                    "--node-name",
                    name,
                    "--kubeconfig",
                    str(node.kubeconfig),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
        assert not node.published_devices()
        assert not node.registration_sockets()
    finally:
        node.helm("install", "dra-driver", str(CHART), "--values", str(values), "--wait")
        wait_until(lambda: node.published_devices(), "the reinstalled driver's slices")
