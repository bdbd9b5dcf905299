"""Soak: continuous pod churn on two simulated GPU nodes, with an API server restart midway.

One minute in the normal suite; ``DRA_SOAK_SECONDS=600`` makes it a ten-minute (nightly-style)
run. Rounds of pods that each need a GPU are created on both nodes, must all run, and are
deleted again; the API server is restarted once in the middle of a round. Along the way and at
the end: the nodes' checkpoints and CDI specs agree, nothing is left once the pods are gone, the
agents never restart (same PID) and their memory and open files stay bounded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode
from tests.e2e.conftest import gone, raw, wait_until
from tests.e2e.gpu import DRIVER, apply
from tests.e2e.test_crash import check_node_consistent, wait_published

pytestmark = pytest.mark.e2e

SOAK_SECONDS = float(os.environ.get("DRA_SOAK_SECONDS", "60"))
PROFILE = "l4x4"
PODS_PER_NODE = 3  # of 4 GPUs: the scheduler always has room, even while claims are freed
# Bounds for an agent over the run, after a warm-up round (allocator arenas, gRPC and HTTP
# connection pools settle during the first round).
RSS_GROWTH_LIMIT_KIB = 24 * 1024
FD_GROWTH_LIMIT = 8


def proc_usage(pid: int) -> tuple[int, int]:
    """(resident set size in KiB, open file descriptors) of a process."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def soak_nodes(gpu_node: Callable[..., GpuNode]) -> list[GpuNode]:
    """Two fresh GPU nodes with their agents."""
    return [gpu_node(PROFILE, prefix="soak") for _ in range(2)]


TEMPLATE = f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: soak-gpu}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {{deviceClassName: {DRIVER}}}
"""


def pod(name: str, node: str) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeSelector: {{e2e-node: {node}}}
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - {{name: gpu, resourceClaimTemplateName: soak-gpu}}
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources: {{claims: [{{name: gpu}}]}}
"""


def running(kube_api: Any, namespace: str, names: list[str]) -> bool:
    from kubernetes import client as k

    pods = raw(k.CoreV1Api(kube_api).list_namespaced_pod, namespace)["items"]
    phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
    return all(phases.get(n) == "Running" for n in names)


def create_pods(kube_api: Any, namespace: str, names: list[str], node_of: dict[str, str]) -> None:
    """Create pods, riding out an API server that is briefly away."""
    for name in names:
        wait_until(
            lambda n=name: apply(kube_api, namespace, pod(n, node_of[n])) or True,
            60,
            f"pod {name} created",
            interval=0.5,
        )


@pytest.mark.usefixtures("gpu_class")
def test_soak_pod_churn(
    soak_nodes: list[GpuNode], cluster: LocalCluster, kube_api: Any, namespace: str
) -> None:
    from kubernetes import client as k

    core = k.CoreV1Api(kube_api)
    for node in soak_nodes:
        wait_published(kube_api, node)
    apply(kube_api, namespace, TEMPLATE)
    pids = {node.name: node.driver.pid for node in soak_nodes}
    assert all(pids.values())

    started = time.monotonic()
    restart_at = started + SOAK_SECONDS / 2
    restarted = False
    baseline: dict[str, tuple[int, int]] = {}
    peak: dict[str, tuple[int, int]] = {}
    rounds = pods_run = 0
    while not rounds or time.monotonic() - started < SOAK_SECONDS:
        names = [f"r{rounds}-{n.name[-6:]}-{i}" for n in soak_nodes for i in range(PODS_PER_NODE)]
        node_of = {name: soak_nodes[j // PODS_PER_NODE].name for j, name in enumerate(names)}
        create_pods(kube_api, namespace, names, node_of)
        if not restarted and time.monotonic() >= restart_at:
            # Mid-round: prepares in flight read their claims from a server that is going away.
            cluster.restart_apiserver()
            restarted = True
        wait_until(lambda n=names: running(kube_api, namespace, n), 120, f"round {rounds} running")
        pods_run += len(names)
        for node in soak_nodes:
            claims = check_node_consistent(node.node)
            assert len(claims) == PODS_PER_NODE, claims
        for name in names:
            core.delete_namespaced_pod(name, namespace)
        for name in names:
            wait_until(
                lambda n=name: gone(lambda: core.read_namespaced_pod(n, namespace)),
                90,
                f"pod {name} gone",
            )
        for node in soak_nodes:
            assert node.driver.alive() and node.driver.pid == pids[node.name]
            usage = proc_usage(pids[node.name] or 0)
            if rounds == 0:
                baseline[node.name] = usage
            peak[node.name] = tuple(map(max, peak.get(node.name, usage), usage))  # type: ignore[assignment]
        rounds += 1

    assert restarted, "the run was too short to restart the API server"
    for node in soak_nodes:
        assert check_node_consistent(node.node) == {}
        assert not list(node.node.cdi_dir.glob("*.json"))
        assert node.driver.alive() and node.driver.pid == pids[node.name]
        (rss0, fds0), (rss, fds) = baseline[node.name], peak[node.name]
        print(
            f"{node.name}: {rounds} rounds, {pods_run} pods; RSS {rss0} -> max {rss} KiB, "
            f"fds {fds0} -> max {fds}"
        )
        assert rss - rss0 < RSS_GROWTH_LIMIT_KIB, (rss0, rss)
        assert fds - fds0 <= FD_GROWTH_LIMIT, (fds0, fds)
