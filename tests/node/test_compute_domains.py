"""ComputeDomains on the real node, in compat mode: the NVIDIA driver's IMEX channel examples
(tests/node/nvidia_examples/channel-injection*.yaml) run as they are but for images and
commands.

The chart is switched to ``compat: nvidia`` with ComputeDomains on, binding conditions on,
and the simulated gb200 profile (the node is in an NVLink clique). Everything runs as it
would on a rack: the controller as its Deployment, the node's compute domain plugin beside
the agent, the domain's IMEX daemon as a DaemonSet pod running the stand-in ``nvidia-imex``
from the node's driver root, and the example's pod with its channel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.node.nvidia_examples import HERE
from tests.node.probe import Node, wait_until

pytestmark = pytest.mark.node

GROUP, VERSION = "resource.nvidia.com", "v1beta1"
DOMAIN_LABEL = f"{GROUP}/computeDomain"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
DRIVER_NAMESPACE = "dra-driver"
#: The stand-in driver root's IMEX channel major (tests/driverroot.py).
IMEX_MAJOR = 507
VALUES = (
    "compat=nvidia",
    "discovery.profile=gb200",
    "computeDomains.enabled=true",
    "computeDomains.bindingConditions=true",
)


@pytest.fixture(scope="module")
def domains(node: Node) -> Iterator[Node]:
    no_extended = ("--set", "extendedResource.enabled=false")
    node.switch_chart("simulated", *no_extended)
    node.driver = "gpu.nvidia.com"
    try:
        node.switch_chart("simulated", *no_extended, *[a for kv in VALUES for a in ("--set", kv)])
        wait_until(lambda: _controller_ready(node), "the compute domain controller Ready")
        yield node
    finally:
        _delete_every_domain(node)
        node.driver = "gpu.dra.dev"
        node.switch_chart("simulated", *no_extended)
        node.switch_chart("simulated")


def _delete_every_domain(node: Node) -> None:
    """While the controller runs: a domain left behind would keep its finalizer forever once
    the chart (and with it the controller and the CRD) is switched off."""
    res = node.dynamic.resources.get(api_version=f"{GROUP}/{VERSION}", kind="ComputeDomain")
    for item in res.get().items:
        res.delete(name=item.metadata.name, namespace=item.metadata.namespace)
    wait_until(lambda: not res.get().items, "every ComputeDomain gone")


def _controller_ready(node: Node) -> bool:
    pods = node.core.list_namespaced_pod(
        DRIVER_NAMESPACE, label_selector="app.kubernetes.io/component=compute-domain-controller"
    ).items
    return any(
        any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        for p in pods
    )


def _domain(node: Node, namespace: str, name: str) -> dict[str, Any]:
    res = node.dynamic.resources.get(api_version=f"{GROUP}/{VERSION}", kind="ComputeDomain")
    got: dict[str, Any] = res.get(name=name, namespace=namespace).to_dict()
    return got


def _apply(node: Node, namespace: str, file: str) -> None:
    for obj in yaml.safe_load_all((HERE / file).read_text()):
        if obj:
            node.create(obj, namespace)


def _channels(log: str) -> dict[int, tuple[int, int]]:
    """The IMEX channel device nodes ``ls -la`` listed: channel -> (major, minor)."""
    found = {}
    for line in log.splitlines():
        m = re.match(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\bchannel(\d+)$", line)
        if m:
            found[int(m.group(3))] = (int(m.group(1)), int(m.group(2)))
    return found


def _env(log: str) -> dict[str, str]:
    lines = log.split("PROBE-ENV\n", 1)[1].split("PROBE-END", 1)[0].splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _events(node: Node, namespace: str, name: str) -> list[str]:
    events = node.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [f"{e.reason}: {e.message}" for e in events.items]


def _daemon_pods(node: Node, uid: str) -> list[Any]:
    return list(
        node.core.list_namespaced_pod(
            DRIVER_NAMESPACE, label_selector=f"{DOMAIN_LABEL}={uid}"
        ).items
    )


def _kill_daemon_and_recover(node: Node, namespace: str, daemon: Any) -> None:
    """Delete a daemon pod of the example's domain: NotReady with an Event, then Ready."""
    node.core.delete_namespaced_pod(daemon.metadata.name, DRIVER_NAMESPACE, grace_period_seconds=0)
    wait_until(
        lambda: any(
            e.startswith("DomainNotReady")
            for e in _events(node, namespace, "imex-channel-injection")
        ),
        "the DomainNotReady event",
    )
    wait_until(
        lambda: _domain(node, namespace, "imex-channel-injection")["status"]["status"] == "Ready",
        "the domain Ready again",
    )


def test_the_nvidia_channel_injection_example_runs_unchanged(domains: Node, namespace: str) -> None:
    node = domains
    _apply(node, namespace, "channel-injection.yaml")
    log = node.log_until(namespace, "imex-channel-injection", "PROBE-END", container="ctr")
    domain = _domain(node, namespace, "imex-channel-injection")
    uid = domain["metadata"]["uid"]
    channel = int(domain["metadata"]["annotations"][f"{GROUP}/imexChannel"])
    # The container has exactly its domain's channel, and the domain in its environment.
    assert _channels(log) == {channel: (IMEX_MAJOR, channel)}, log
    env = _env(log)
    assert env["COMPUTE_DOMAIN_UID"] == uid
    assert env["COMPUTE_DOMAIN"] == f"{namespace}/imex-channel-injection"
    assert env["NVIDIA_IMEX_CHANNELS"] == str(channel)
    # The domain is Ready on this node, with its daemon's address and the node's clique.
    status = domain["status"]
    assert status["status"] == "Ready", status
    [entry] = status["nodes"]
    labels = node.core.read_node(node.name).metadata.labels
    assert entry["name"] == node.name and entry["status"] == "Ready"
    assert entry["cliqueID"] == labels[CLIQUE_LABEL]
    assert labels[DOMAIN_LABEL] == uid
    [daemon] = _daemon_pods(node, uid)
    assert entry["ipAddress"] == daemon.status.pod_ip
    # The daemon runs the driver root's nvidia-imex with itself as its only peer.
    daemon_log = node.core.read_namespaced_pod_log(daemon.metadata.name, DRIVER_NAMESPACE)
    started = [
        json.loads(line)
        for line in daemon_log.splitlines()
        if line.startswith("{") and '"nvidia-imex started"' in line
    ]
    assert started and started[-1]["peers"] == [daemon.status.pod_ip], daemon_log
    assert any(
        e.startswith("DomainReady") for e in _events(node, namespace, "imex-channel-injection")
    )
    # The channel was allocated with its binding condition met before the pod was bound.
    [claim] = node.claim_names(namespace, "imex-channel-injection")
    res = node.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
    devices = res.get(name=claim, namespace=namespace).to_dict()["status"]["devices"]
    conditions = {c["type"]: c["status"] for d in devices for c in d.get("conditions") or []}
    assert conditions.get("IMEXDaemonReady") == "True", devices

    # The daemon goes away, then comes back.
    _kill_daemon_and_recover(node, namespace, daemon)

    # Deleted: the pod first (the node leaves the domain), then the domain and all it made.
    node.delete_pod(namespace, "imex-channel-injection")
    wait_until(
        lambda: DOMAIN_LABEL not in (node.core.read_node(node.name).metadata.labels or {}),
        "the node out of the domain",
    )
    res = node.dynamic.resources.get(api_version=f"{GROUP}/{VERSION}", kind="ComputeDomain")
    res.delete(name="imex-channel-injection", namespace=namespace)

    def gone() -> bool:
        try:
            _domain(node, namespace, "imex-channel-injection")
        except ApiException as e:
            return e.status == 404
        return False

    wait_until(gone, "the domain gone")
    # Its DaemonSet is gone; the pods follow (the garbage collector deletes them).
    wait_until(lambda: not _daemon_pods(node, uid), "the daemon pods gone")
    templates = node.dynamic.resources.get(
        api_version="resource.k8s.io/v1", kind="ResourceClaimTemplate"
    )
    assert not templates.get(namespace=namespace).items


def test_the_nvidia_channel_injection_all_example_gets_every_channel(
    domains: Node, namespace: str
) -> None:
    node = domains
    _apply(node, namespace, "channel-injection-all.yaml")
    log = node.log_until(namespace, "imex-channel-injection-all", "PROBE-END", container="ctr")
    channels = _channels(log)
    assert sorted(channels) == list(range(2048))
    assert all(major == IMEX_MAJOR and minor == c for c, (major, minor) in channels.items())
    assert _env(log)["NVIDIA_IMEX_CHANNELS"] == "all"


# -- two nodes (make node-up NODES=2) ------------------------------------------------------


def _node_names(node: Node) -> list[str]:
    return sorted(n.metadata.name for n in node.core.list_node().items)


@pytest.fixture
def two_nodes(domains: Node) -> tuple[Node, list[str]]:
    names = _node_names(domains)
    if len(names) < 2:
        pytest.skip("needs two nodes (make node-up NODES=2)")
    return domains, names[:2]


def _example(
    file: str, num_nodes: int, pods: dict[str, str], domain: str | None = None
) -> list[dict[str, Any]]:
    """An example's objects with ``numNodes`` set and its pod once per entry of ``pods``
    (pod name -> node), each pinned to its node; ``domain`` renames the domain and its
    template (to run two side by side)."""
    objects = [o for o in yaml.safe_load_all((HERE / file).read_text()) if o]
    [cd] = [o for o in objects if o["kind"] == "ComputeDomain"]
    [pod] = [o for o in objects if o["kind"] == "Pod"]
    cd["spec"]["numNodes"] = num_nodes
    template = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    if domain is not None:
        cd["metadata"]["name"] = domain
        template = f"{domain}-channel"
        cd["spec"]["channel"]["resourceClaimTemplate"]["name"] = template
    made = [cd]
    for name, where in pods.items():
        copy = json.loads(json.dumps(pod))
        copy["metadata"]["name"] = name
        copy["spec"]["nodeSelector"] = {"kubernetes.io/hostname": where}
        copy["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
        made.append(copy)
    return made


def _daemon_peers(node: Node, pod: Any) -> list[str]:
    """The peers the daemon last wrote into its nodes config (from its log)."""
    text = node.core.read_namespaced_pod_log(pod.metadata.name, DRIVER_NAMESPACE)
    lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    written = [
        x["peers"] for x in lines if x.get("event") in ("nvidia-imex started", "domain daemons")
    ]
    return sorted(written[-1]) if written else []


def test_a_domain_of_two_nodes_runs_one_pod_on_each(
    two_nodes: tuple[Node, list[str]], namespace: str
) -> None:
    node, (first, second) = two_nodes
    pods = {"worker-0": first, "worker-1": second}
    for obj in _example("channel-injection.yaml", 2, pods):
        node.create(obj, namespace)
    logs = {p: node.log_until(namespace, p, "PROBE-END", container="ctr") for p in pods}
    domain = _domain(node, namespace, "imex-channel-injection")
    uid = domain["metadata"]["uid"]
    channel = int(domain["metadata"]["annotations"][f"{GROUP}/imexChannel"])
    for pod, log in logs.items():
        assert _channels(log) == {channel: (IMEX_MAJOR, channel)}, (pod, log)
        assert _env(log)["COMPUTE_DOMAIN_UID"] == uid
    status = domain["status"]
    assert status["status"] == "Ready"
    assert {e["name"]: e["status"] for e in status["nodes"]} == {first: "Ready", second: "Ready"}
    # The daemons run on the pod network and each one's nodes config lists both.
    daemons = _daemon_pods(node, uid)
    ips = sorted(d.status.pod_ip for d in daemons)
    assert len(ips) == 2 and {e["ipAddress"] for e in status["nodes"]} == set(ips)
    for daemon in daemons:
        assert _daemon_peers(node, daemon) == ips, daemon.metadata.name

    # The daemon on one node is killed, then comes back.
    [victim] = [d for d in daemons if d.spec.node_name == second]
    _kill_daemon_and_recover(node, namespace, victim)


def test_two_domains_in_one_clique_get_distinct_channels_and_their_own_daemons(
    two_nodes: tuple[Node, list[str]], namespace: str
) -> None:
    node, (first, second) = two_nodes
    for domain, where in (("left", first), ("right", second)):
        for obj in _example("channel-injection.yaml", 1, {f"{domain}-pod": where}, domain):
            node.create(obj, namespace)
    seen = {}
    for domain in ("left", "right"):
        log = node.log_until(namespace, f"{domain}-pod", "PROBE-END", container="ctr")
        cd = _domain(node, namespace, domain)
        channel = int(cd["metadata"]["annotations"][f"{GROUP}/imexChannel"])
        assert _channels(log) == {channel: (IMEX_MAJOR, channel)}
        [daemon] = _daemon_pods(node, cd["metadata"]["uid"])
        assert _daemon_peers(node, daemon) == [daemon.status.pod_ip]  # never the other's
        seen[domain] = (channel, cd["status"]["nodes"][0]["cliqueID"])
    assert seen["left"][0] != seen["right"][0]
    assert seen["left"][1] == seen["right"][1]  # one clique
