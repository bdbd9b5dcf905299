"""Fault paths end to end with dynamic MIG: two agents on one node (a surge update) and a lost
or corrupt checkpoint under running pods. Nothing a pod holds may be lost or destroyed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode, driver_argv, start_driver
from tests.e2e.conftest import wait_until
from tests.e2e.gpu import apply
from tests.e2e.mig import DRIVER, DYNAMIC
from tests.e2e.test_crash import check_node_consistent, checkpoint_claims
from tests.e2e.test_dynamic_mig import delete_pods, instances, mig_pod, prepared, referenced

pytestmark = pytest.mark.e2e

# Pod UIDs of the old and the new agent's pods: their sockets are named after them.
OLD_UID = "0a0a0a0a-0000-4000-8000-000000000001"
NEW_UID = "0b0b0b0b-0000-4000-8000-000000000002"


def _held(node: GpuNode) -> list[str]:
    """The MIG devices that exist; each must be one a prepared claim holds."""
    made = sorted(i["uuid"] for i in instances(node))
    assert made == referenced(node), "a MIG device exists that no prepared claim holds"
    return made


def _device_of(node: GpuNode, pod: str) -> str:
    """The MIG device UUID the checkpoint records for the claim of ``pod``."""
    claims = checkpoint_claims(node.node)
    (uuid,) = [
        d["uuid"] for c in claims.values() if c["name"].startswith(f"{pod}-") for d in c["devices"]
    ]
    return str(uuid)


def test_surge_update_loses_no_claim_and_destroys_nothing_held(
    mig_node: Callable[..., GpuNode],
    device_classes: None,
    kube_api: Any,
    namespace: str,
    cluster: LocalCluster,
    profile: str,
) -> None:
    node = mig_node()
    # The old agent as the DaemonSet runs it during a rolling update: sockets named by pod UID.
    cluster.stop_process(f"driver-{node.name}")
    node.driver = start_driver(
        cluster, node.node, profile, extra=[*DYNAMIC, f"--pod-uid={OLD_UID}"]
    )
    apply(kube_api, namespace, mig_pod("a", node.name, "1g.10gb"))
    apply(kube_api, namespace, mig_pod("b", node.name, "1g.10gb"))
    for name in ("a", "b"):
        prepared(node, namespace, name)
    assert len(_held(node)) == 2
    b_device = _device_of(node, "b")

    new = f"driver-{node.name}-new"
    cluster.spawn(
        new, driver_argv(cluster, node.node, profile, DRIVER, [*DYNAMIC, f"--pod-uid={NEW_UID}"])
    )
    try:
        # Both agents serve; the kubelet may call either. Claims come and go interleaved.
        apply(kube_api, namespace, mig_pod("c", node.name, "1g.10gb"))
        prepared(node, namespace, "c")
        delete_pods(kube_api, namespace, ["a"])
        apply(kube_api, namespace, mig_pod("d", node.name, "2g.20gb"))
        prepared(node, namespace, "d")
        held = _held(node)
        assert len(held) == 3 and b_device in held  # a's device went with a, b's stays
        # The old agent stops (its pod is deleted by the update); the new one carries on.
        cluster.stop_process(f"driver-{node.name}")
        assert _held(node) == held
        claims = checkpoint_claims(node.node)
        assert len(claims) == 3, claims
        apply(kube_api, namespace, mig_pod("e", node.name, "1g.10gb"))
        prepared(node, namespace, "e")
        assert len(_held(node)) == 4
        delete_pods(kube_api, namespace, ["b", "c", "d", "e"])
        assert instances(node) == [] and check_node_consistent(node.node) == {}
    finally:
        cluster.stop_process(new)


def _corrupt(path: Any, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(b"\x00\xffnot a checkpoint\xfe" * 64)


@pytest.mark.parametrize("how", ["deleted", "truncated", "garbage"])
def test_lost_checkpoint_under_running_pods_is_rebuilt(
    mig_node: Callable[..., GpuNode],
    device_classes: None,
    kube_api: Any,
    namespace: str,
    cluster: LocalCluster,
    profile: str,
    how: str,
) -> None:
    node = mig_node()
    apply(kube_api, namespace, mig_pod("x", node.name, "3g.40gb"))
    apply(kube_api, namespace, mig_pod("y", node.name, "1g.10gb"))
    for name in ("x", "y"):
        prepared(node, namespace, name)
    held = _held(node)
    uids = sorted(checkpoint_claims(node.node))

    cluster.stop_process(f"driver-{node.name}")
    _corrupt(node.node.plugin_dir(DRIVER) / "checkpoint.json", how)
    node.driver = start_driver(cluster, node.node, profile, extra=DYNAMIC)

    # The agent rebuilds the record from the CDI specs and the API server; nothing is destroyed.
    wait_until(lambda: sorted(checkpoint_claims(node.node)) == uids, 30, "checkpoint rebuilt")
    assert sorted(i["uuid"] for i in instances(node)) == held
    assert _held(node) == held
    log = node.driver.log_path.read_text()
    assert "destroyed MIG device" not in log
    # The pods end later: their claims unprepare cleanly and the MIG devices go with them.
    delete_pods(kube_api, namespace, ["x", "y"])
    assert instances(node) == [] and check_node_consistent(node.node) == {}
