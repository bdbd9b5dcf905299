"""Two nodes (``make node-up NODES=2``): both registered and Ready, both running the driver
and publishing their devices, a pod on each, and the pod network and the API server's
Service reached across them.

``dra-node-1`` runs in network and mount namespaces of its own (docs/real-node.md): these
tests prove that its kubelet, its containerd and its pods are a node like the first, not
the host's view of the first one. Skipped when fewer than two nodes run.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.node.probe import BUSYBOX, Node, wait_until

pytestmark = pytest.mark.node

PORT = 8080
DONE = "CLIENT-END"
API_SERVICE_IP = "10.0.0.1"


@pytest.fixture(scope="module")
def two(node: Node) -> Node:
    if len(node.nodes) < 2:
        pytest.skip(
            f"needs two nodes, {len(node.nodes)} running: make node-up NODES=2 "
            "(or make e2e-node NODES=2)"
        )
    return node


def _pod(name: str, script: str, **env: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                }
            ],
        },
    }


def _start(node: Node, namespace: str, pod: dict[str, Any], on: str) -> None:
    node.pin(pod, on)
    node.create(pod, namespace)


def _running_ip(node: Node, namespace: str, name: str) -> str:
    """The pod's IP once it runs."""

    def ip() -> str | None:
        try:
            p = node.core.read_namespaced_pod(name, namespace)
        except ApiException:
            return None
        return p.status.pod_ip if p.status.phase == "Running" and p.status.pod_ip else None

    try:
        found: str = wait_until(ip, f"pod {namespace}/{name} running with an IP")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{node.describe(namespace, name)}") from None
    return found


def _server(name: str) -> dict[str, Any]:
    """busybox httpd answering with the pod's name (its hostname)."""
    return _pod(
        name,
        f"mkdir -p /www && hostname > /www/index.html && exec httpd -f -p {PORT} -h /www",
    )


def _client(name: str, target: str) -> dict[str, Any]:
    """Fetch the page of `target` (retrying while the route comes up), print it, then wait to
    be deleted. (busybox's ``wget -T`` crashes: ``timeout`` bounds each try.)"""
    script = (
        "for i in $(seq 60); do "
        f'  if page=$(timeout 3 wget -q -O- "http://$TARGET:{PORT}/"); then '
        '    echo "PAGE $page"; break; fi; '
        "  sleep 1; "
        "done; "
        f"echo {DONE}; trap 'exit 0' TERM; while true; do sleep 1; done"
    )
    return _pod(name, script, TARGET=target)


# busybox's TLS client and Go's TLS server share no cipher suite: the API server is called
# from the driver's image (Debian's Python), with the pod's service account token, checking
# the serving certificate against the service account's CA for the Service address.
API_CLIENT = f"""
import json, os, signal, ssl, sys, time, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
url = "https://" + os.environ["API"] + ":443/version"
for _ in range(30):
    try:
        token = open(sa + "/token").read()
        req = urllib.request.Request(url, headers={{"Authorization": "Bearer " + token}})
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            print("API " + json.dumps(json.load(r)), flush=True)
        break
    except Exception as e:
        print("API-ERROR", e, flush=True)
        time.sleep(1)
print("{DONE}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
"""


def _api_client(name: str, image: str, address: str) -> dict[str, Any]:
    pod = _pod(name, "")
    container = pod["spec"]["containers"][0]
    container.update(image=image, command=["python3", "-c", API_CLIENT])
    container["env"] = [{"name": "API", "value": address}]
    return pod


def _node_of(node: Node, namespace: str, pod: str) -> str:
    name: str = node.core.read_namespaced_pod(pod, namespace).spec.node_name
    return name


def _subnet(node: Node, name: str) -> ipaddress.IPv4Network:
    """The node's pod subnet, as node-up recorded it."""
    state = json.loads((node.base / "node-state.json").read_text())
    (record,) = [n for n in state["nodes"] if n["name"] == name]
    return ipaddress.IPv4Network(record["podSubnet"])


def test_both_nodes_are_ready(two: Node) -> None:
    for name in two.nodes[:2]:
        status = two.core.read_node(name).status
        ready = {c.type: c.status for c in status.conditions}.get("Ready")
        assert ready == "True", f"{name}: Ready={ready}"
    addresses = {
        name: {
            a.address for a in two.core.read_node(name).status.addresses if a.type == "InternalIP"
        }
        for name in two.nodes[:2]
    }
    first, second = (addresses[n] for n in two.nodes[:2])
    assert first and second and not first & second, addresses


def test_both_nodes_run_the_driver_and_publish_slices(two: Node) -> None:
    res = two.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
    for name in two.nodes[:2]:
        pods = two.core.list_namespaced_pod(
            "dra-driver", field_selector=f"spec.nodeName={name}"
        ).items
        assert [p.status.phase for p in pods] == ["Running"], f"driver pods on {name}"
        selector = f"spec.driver={two.driver},spec.nodeName={name}"
        slices = res.get(field_selector=selector).items
        assert slices, f"no slice of {two.driver} for {name}"
        assert all(s.spec.pool.name == name for s in slices)
        assert sum(len(s.spec.devices or []) for s in slices) > 0, name


def test_pods_on_the_two_nodes_reach_each_other(two: Node, namespace: str) -> None:
    first, second = two.nodes[:2]
    _start(two, namespace, _server("web-0"), first)
    _start(two, namespace, _server("web-1"), second)
    ip0 = _running_ip(two, namespace, "web-0")
    ip1 = _running_ip(two, namespace, "web-1")
    assert _node_of(two, namespace, "web-0") == first
    assert _node_of(two, namespace, "web-1") == second
    # Each node's pods are on its own pod subnet.
    assert ipaddress.IPv4Address(ip0) in _subnet(two, first), ip0
    assert ipaddress.IPv4Address(ip1) in _subnet(two, second), ip1

    _start(two, namespace, _client("from-0", ip1), first)
    _start(two, namespace, _client("from-1", ip0), second)
    log0 = two.log_until(namespace, "from-0", DONE)
    log1 = two.log_until(namespace, "from-1", DONE)
    assert "PAGE web-1" in log0.splitlines(), f"node 0's pod did not reach {ip1}:\n{log0}"
    assert "PAGE web-0" in log1.splitlines(), f"node 1's pod did not reach {ip0}:\n{log1}"


def test_a_pod_on_the_second_node_reaches_the_api_server(two: Node, namespace: str) -> None:
    """Through the ``kubernetes`` Service's address, as an in-cluster client does."""
    second = two.nodes[1]
    service = two.core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
    assert service == API_SERVICE_IP
    image = two.driver_pods()[0].spec.containers[0].image
    _start(two, namespace, _api_client("api-1", image, service), second)
    log = two.log_until(namespace, "api-1", DONE)
    assert _node_of(two, namespace, "api-1") == second
    api = [line for line in log.splitlines() if line.startswith("API ")]
    assert api, f"the pod on {second} did not reach {service}:\n{log}"
    version = json.loads(api[0].removeprefix("API "))
    assert version["gitVersion"].startswith("v1."), log
