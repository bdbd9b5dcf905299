"""Health, claim status and metrics end to end: an injected Xid taints the device (or, where
the API server has no device taints, withdraws it), the real scheduler stops using it, the
kubelet's health stream reports it, and once the device is fine again the agent's re-check
restores both."""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from devenv.localcluster import LocalCluster
from devenv.simnode import GpuNode
from tests.e2e.conftest import raw, wait_until
from tests.e2e.gpu import (
    DRIVER,
    apply,
    claim_of,
    gpu_pod,
    node_events,
    node_slices,
    published_devices,
)

pytestmark = pytest.mark.e2e

#: Seconds between the agent's re-checks of unhealthy devices in these tests.
RECHECK = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(rf"{re.escape(name)}(\{{(.*)\}})? (\S+)$", line)
        if not match:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def _taints(kube_api: Any, node: str) -> dict[str, list[dict[str, Any]]]:
    return {
        d["name"]: d.get("taints", [])
        for s in node_slices(kube_api, node)
        for d in s["spec"].get("devices", [])
    }


def _inject(node: GpuNode, device: str, *flag: str) -> None:
    from dra_driver.cli import main

    args = ["inject-health", device, *flag, f"--plugins-dir={node.node.plugins_dir}"]
    assert main(args) == 0


def test_xid_taints_reports_and_recovers(
    gpu_node: Callable[..., GpuNode],
    gpu_class: str,
    cluster: LocalCluster,
    kube_api: Any,
    namespace: str,
) -> None:
    from kubernetes import client as k

    taints_off = cluster.feature_off("DRADeviceTaints")
    if taints_off:
        print(f"{taints_off}: expecting unhealthy GPUs withdrawn instead of tainted")
    port = _free_port()
    node = gpu_node(
        "l4x4", extra=[f"--metrics-port={port}", f"--health-recheck-interval={RECHECK}"]
    )
    wait_until(lambda: len(_taints(kube_api, node.name)) == 4, 30, "slices published")

    apply(kube_api, namespace, gpu_pod("first", node.name, "first-gpu"))
    node.node.wait_pod_record(namespace, "first", lambda r: bool(r.get("containers")), timeout=60)
    claim = claim_of(kube_api, namespace, "first")
    used = claim["status"]["allocation"]["devices"]["results"][0]["device"]

    # Claim device status: the GPU's UUID and a Ready condition, written after prepare.
    def device_status() -> list[dict[str, Any]]:
        return list(claim_of(kube_api, namespace, "first").get("status", {}).get("devices", []))

    status = wait_until(device_status, 30, "claim status.devices")
    assert (
        status[0]["driver"] == DRIVER
        and status[0]["device"] == used
        and status[0]["pool"] == node.name
    )
    assert status[0]["data"]["uuid"].startswith("GPU-")
    assert (
        status[0]["conditions"][0]["type"] == "Ready"
        and status[0]["conditions"][0]["status"] == "True"
    )

    # An ignored (application) Xid changes nothing; a critical one taints every GPU we poke.
    _inject(node, used, "--xid=13")
    wait_until(
        lambda: (
            _value(_metrics(port), "dra_driver_health_events_total", xid="13", ignored="true") >= 1
        ),
        10,
        "Xid 13 seen",
    )
    assert not any(_taints(kube_api, node.name).values())
    for dev in ("gpu-0", "gpu-1", "gpu-2", "gpu-3"):
        _inject(node, dev, "--xid=79")
    if taints_off:
        # The first taint is dropped by the API server; the driver notices, says so once on
        # the Node, and withdraws the unhealthy GPUs instead.
        wait_until(lambda: not published_devices(kube_api, node.name), 20, "all devices withdrawn")
        (message,) = wait_until(
            lambda: node_events(kube_api, node.name, "DRAFeatureUnavailable"), 20, "Node event"
        )
        assert "DRADeviceTaints" in message and "withdrawn" in message
    else:
        wait_until(
            lambda: all(t for t in _taints(kube_api, node.name).values()), 10, "all devices tainted"
        )
        taint = _taints(kube_api, node.name)[used][0]
        assert (
            taint["key"] == f"{DRIVER}/xid"
            and taint["value"] == "79"
            and taint["effect"] == "NoSchedule"
        )

    # The real scheduler keeps new claims off unhealthy devices.
    apply(kube_api, namespace, gpu_pod("second", node.name, "second-gpu"))

    def unschedulable() -> str:
        pod = raw(k.CoreV1Api(kube_api).read_namespaced_pod, "second", namespace)
        conds = [c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return conds[0].get("message", "") if conds and conds[0]["status"] == "False" else ""

    assert "cannot allocate" in wait_until(unschedulable, 30, "second pod unschedulable")

    # The GPUs are fine again: the agent's re-check finds it, clears the taints (or publishes
    # the GPUs again) and says so on the Node; the pending pod runs.
    for dev in ("gpu-0", "gpu-1", "gpu-2", "gpu-3"):
        _inject(node, dev, "--clear")
    wait_until(lambda: len(_taints(kube_api, node.name)) == 4, 20, "all devices published")
    wait_until(lambda: not any(_taints(kube_api, node.name).values()), 20, "taints cleared")
    recovered = wait_until(
        lambda: (m := node_events(kube_api, node.name, "DeviceRecovered")) and len(m) == 4 and m,
        20,
        "a DeviceRecovered Event per GPU",
    )
    assert sorted(m.split()[0] for m in recovered) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert all("re-check" in m and "critical Xid 79 error" in m for m in recovered)
    node.node.wait_pod_record(namespace, "second", lambda r: bool(r.get("containers")), timeout=60)

    # The work shows up in the metrics.
    text = _metrics(port)
    assert _value(text, "dra_driver_prepare_seconds_count", outcome="success") >= 2
    assert _value(text, "dra_driver_published_devices") == 4
    assert _value(text, "dra_driver_health_events_total", xid="79", ignored="false") >= 4
    assert _value(text, "dra_driver_api_requests_total", verb="GET", code="200") > 0
    assert _value(text, "dra_driver_prepared_claims") == 2
    assert _value(text, "dra_driver_build_info", driver=DRIVER) == 1


def _named_claim_pod(name: str, node: str) -> str:
    """A pod with a ResourceClaim of its own name. Kubernetes 1.34's kubelet reports device
    health only for a claim whose name is the pod's name for it (not for template claims)."""
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: {DRIVER}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  nodeSelector: {{e2e-node: {node}}}
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: {name}
    resourceClaimName: {name}
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources:
      claims: [{{name: {name}}}]
"""


def test_kubelet_health_stream_reports_and_recovers(
    gpu_node: Callable[..., GpuNode],
    gpu_class: str,
    cluster: LocalCluster,
    kube_api: Any,
    namespace: str,
) -> None:
    if why := cluster.feature_off("ResourceHealthStatus"):
        pytest.skip(f"the kubelet streams no device health: {why}")
    if cluster.minor == 35:
        # Its DRA manager finds a container's claim only in pod.status.resourceClaimStatuses,
        # which lists claims made from templates; this pod names its claim (1.34 and 1.36+
        # look both up).
        pytest.skip(
            f"the kubelet of Kubernetes {cluster.version} reports device health only for "
            "claims made from a ResourceClaimTemplate"
        )
    from kubernetes import client as k

    node = gpu_node("l4x4", extra=[f"--health-recheck-interval={RECHECK}"])
    wait_until(lambda: len(_taints(kube_api, node.name)) == 4, 30, "slices published")
    apply(kube_api, namespace, _named_claim_pod("watched", node.name))
    node.node.wait_pod_record(namespace, "watched", lambda r: bool(r.get("containers")), timeout=60)
    claim = raw(k.ResourceV1Api(kube_api).read_namespaced_resource_claim, "watched", namespace)
    used = claim["status"]["allocation"]["devices"]["results"][0]["device"]

    def reported(health: str) -> bool:
        entries = (node.node.health() or {}).get("entries", [])
        return any(e["pod"] == "watched" and e["health"] == health for e in entries)

    _inject(node, used, "--xid=79")
    wait_until(lambda: reported("Unhealthy"), 30, "kubelet health stream reports Unhealthy")
    _inject(node, used, "--clear")
    wait_until(lambda: reported("Healthy"), 30, "kubelet health stream reports Healthy")
