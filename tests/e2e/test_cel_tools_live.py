"""``match --live`` and ``explain-claim`` against a real cluster with the driver's slices."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode
from tests.e2e.conftest import raw, wait_until
from tests.e2e.gpu import apply, node_slices

pytestmark = pytest.mark.e2e


def _cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", *args, f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_match_live_and_explain_claim(
    gpu_node: Callable[..., GpuNode], gpu_class: str, kube_api: Any, namespace: str, cluster: LocalCluster
) -> None:
    from kubernetes import client as k

    node = gpu_node("l4x4")
    wait_until(lambda: node_slices(kube_api, node.name), 30, "slices published")
    # A claim no L4 can satisfy: at least 40Gi of memory.
    apply(
        kube_api,
        namespace,
        f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: big}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {gpu_class}
        selectors:
        - cel: {{expression: 'device.capacity["gpu.dra.dev"].memory.compareTo(quantity("40Gi")) >= 0'}}
""",
    )
    proc = _cli(cluster, "match", "--live", f"--class={gpu_class}", f"--claim={namespace}/big", "-o", "json")
    assert proc.returncode == 4, proc.stderr  # nothing matches
    report = json.loads(proc.stdout)
    text = json.dumps(report)
    assert node.name in text and "memory" in text and "22.5Gi" in text

    # A claim the L4s satisfy, live: every device of the node matches.
    proc = _cli(cluster, "match", "--live", f"--class={gpu_class}", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.dumps(json.loads(proc.stdout)).count(node.name) >= 4

    # explain-claim says which selector leaves nothing.
    proc = _cli(cluster, "explain-claim", "-n", namespace, "big")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # blocked
    assert "memory" in proc.stdout and "0" in proc.stdout
    proc = _cli(cluster, "explain-claim", f"{namespace}/big", "-o", "json")
    assert proc.returncode == 4
    assert json.loads(proc.stdout)
    claim = raw(k.ResourceV1Api(kube_api).read_namespaced_resource_claim, "big", namespace)
    assert "allocation" not in claim.get("status", {})
