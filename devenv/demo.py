"""``dra-driver demo``: a local control plane, two simulated GPU nodes, the driver, example pods.

It runs everything a user would: the real API server, scheduler and controller manager, the
kubelet's own DRA code on two nodes, the driver's node agent on each, the project's
DeviceClasses and a selection of examples; then prints which devices each pod got and the CDI
edits its containers receive, and cleans up.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devenv.localcluster import ClusterError, LocalCluster, repo_root
from devenv.simnode import GpuNode, start_gpu_node

NAMESPACE = "demo"
# gpu-node-a runs with dynamic MIG: MIG devices are carved out of its H100s on demand.
NODES = (("gpu-node-a", "dgx-h100", ("--dynamic-mig=true",)), ("gpu-node-b", "mixed", ()))
#: Examples whose pods the demo pins to a node, to show a feature that node has.
PINNED = {"dynamic-mig": "gpu-node-a"}
NODE_LABEL = "demo.gpu.dra.dev/node"
EXAMPLES = (
    "single-gpu",
    "gpu-min-memory",
    "gpu-by-model",
    "two-gpus-same-pcie-root",
    "prioritized-list",
    "mig-1g10gb",
    "dynamic-mig",
    "mps",
    "selector-typo",
)
#: The one example that must not run (its README explains the scheduler's message).
EXPECTED_PENDING = {"selector-typo"}
WAIT = 90.0


@dataclass
class PodReport:
    """What one example pod got."""

    name: str
    node: str = ""
    phase: str = "Pending"
    devices: list[str] = field(default_factory=list)
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)
    problem: str = ""


def _kubernetes() -> Any:
    """The synchronous client, untyped (its config helpers carry no annotations)."""
    import kubernetes.config
    import kubernetes.dynamic

    return kubernetes


def _say(text: str = "") -> None:
    print(text, flush=True)


def _raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return json.loads(call(*args, _preload_content=False, **kwargs).data)


def _docs(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


def _apply(client: Any, docs: Iterable[dict[str, Any]], namespace: str) -> None:
    from kubernetes.client.exceptions import ApiException

    dyn = _kubernetes().dynamic.DynamicClient(client)
    for doc in docs:
        api = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        try:
            if api.namespaced:
                api.create(body=doc, namespace=namespace)
            else:
                api.create(body=doc)
        except ApiException as exc:
            if exc.status != 409:
                raise


def _device_summary(client: Any, results: list[dict[str, Any]]) -> list[str]:
    from kubernetes import client as k

    slices = _raw(k.ResourceV1Api(client).list_resource_slice)["items"]
    attrs = {
        (s["spec"]["pool"]["name"], d["name"]): d.get("attributes", {})
        for s in slices
        for d in s["spec"].get("devices", [])
    }
    out = []
    for r in results:
        a = attrs.get((r["pool"], r["device"]), {})
        product = a.get("productName", {}).get("string", "?")
        profile = a.get("profile", {}).get("string")
        what = f"{product} MIG {profile}" if profile else product
        out.append(f"{r['pool']}/{r['device']} ({what}) for request {r['request']}")
    return out


def _pod_report(client: Any, nodes: dict[str, GpuNode], name: str) -> PodReport:
    from kubernetes import client as k

    pod = _raw(k.CoreV1Api(client).read_namespaced_pod, name, NAMESPACE)
    report = PodReport(
        name=name, node=pod["spec"].get("nodeName", ""), phase=pod["status"].get("phase", "")
    )
    for cond in pod["status"].get("conditions", []):
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            report.problem = cond.get("message", "")
    claims = _raw(k.ResourceV1Api(client).list_namespaced_resource_claim, NAMESPACE)["items"]
    statuses = {
        s["name"]: s.get("resourceClaimName")
        for s in pod["status"].get("resourceClaimStatuses", [])
    }
    wanted = {
        ref.get("resourceClaimName") or statuses.get(ref["name"])
        for ref in pod["spec"].get("resourceClaims", [])
    }
    for claim in claims:
        if claim["metadata"]["name"] in wanted:
            results = (
                claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
            )
            report.devices += _device_summary(client, results)
    node = nodes.get(report.node)
    record = node.node.pod_record(NAMESPACE, name) if node else None
    if record:
        report.containers = record.get("containers", {})
        report.problem = record.get("prepareError", report.problem)
    return report


def _settled(report: PodReport) -> bool:
    return (
        report.phase == "Running"
        or bool(report.problem and "cannot allocate" in report.problem)
        or ("CEL" in report.problem or "runtime error" in report.problem)
    )


def _print_report(report: PodReport) -> None:
    _say(
        f"pod {NAMESPACE}/{report.name}: {report.phase}"
        + (f" on {report.node}" if report.node else "")
    )
    for device in report.devices:
        _say(f"  device    {device}")
    for cname, c in report.containers.items():
        _say(f"  container {cname}:")
        for cdi in c.get("cdiDevices", []):
            _say(f"    cdi     {cdi}")
        for env in c.get("env", []):
            if env.startswith(("NVIDIA_", "CUDA_")):
                _say(f"    env     {env}")
        if c.get("deviceNodes"):
            _say(f"    devices {' '.join(c['deviceNodes'])}")
        for m in c.get("mounts", []):
            _say(f"    mount   {m['hostPath']} -> {m['containerPath']}")
    if report.problem and report.phase != "Running":
        _say(f"  pending:  {report.problem}")
    _say()


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _exit_on_term_or_hangup() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into SystemExit: the components run in their own sessions,
    so only the demo gets these, and it must leave its ``with`` block to stop them."""
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(keep: bool = False) -> int:
    """Run the whole demo; returns 0 when every example behaved as its README says."""
    kube = _kubernetes()
    k = kube.client
    root = repo_root()
    started = time.monotonic()
    _say("== starting a local control plane (etcd, kube-apiserver, scheduler, controller-manager)")
    with _exit_on_term_or_hangup(), LocalCluster(keep=keep) as cluster:
        _say(f"   Kubernetes {cluster.version}, KUBECONFIG={cluster.kubeconfig}")
        client = kube.config.new_client_from_config(config_file=str(cluster.kubeconfig))
        nodes: dict[str, GpuNode] = {}
        for name, profile, extra in NODES:
            features = f", {' '.join(extra)}" if extra else ""
            _say(
                f"== node {name}: kubelet-dra + the driver (simulated profile {profile}{features})"
            )
            nodes[name] = start_gpu_node(
                cluster, name, profile, labels={NODE_LABEL: name}, extra=extra
            )
        _wait_for_slices(client, nodes)
        _say("== applying DeviceClasses (manifests/base/deviceclasses.yaml)")
        _apply(client, _docs([root / "manifests" / "base" / "deviceclasses.yaml"]), NAMESPACE)
        k.CoreV1Api(client).create_namespace({"metadata": {"name": NAMESPACE}})
        _wait_for_service_account(client)
        pods: list[str] = []
        for example in EXAMPLES:
            docs = _docs(sorted((root / "examples" / example).glob("*.yaml")))
            for doc in (d for d in docs if d["kind"] == "Pod"):
                pods.append(doc["metadata"]["name"])
                if example in PINNED:
                    doc["spec"]["nodeSelector"] = {NODE_LABEL: PINNED[example]}
            _apply(client, docs, NAMESPACE)
        _say(f"== applied examples: {', '.join(EXAMPLES)}")
        reports = _wait_for_pods(client, nodes, pods)
        _say()
        for report in reports:
            _print_report(report)
        _say(
            "== deleting the pods: the kubelet unprepares, the driver removes each claim's CDI spec"
        )
        core = k.CoreV1Api(client)
        # A graceful delete: the kubelet unprepares first, then finishes the deletion.
        for pod_name in pods:
            core.delete_namespaced_pod(pod_name, NAMESPACE)
        deleted = _wait(lambda: not _raw(core.list_namespaced_pod, NAMESPACE)["items"], WAIT)
        left = sorted(
            f"{n.node.name}:{p.name}"
            for n in nodes.values()
            for p in n.node.cdi_dir.glob("k8s.gpu.dra.dev-claim_*.json")
        )
        _say(f"   CDI specs left on the nodes: {len(left)}" + "".join(f"\n     {x}" for x in left))
        client.close()
    running = sorted(r.name for r in reports if r.phase == "Running")
    pending = sorted(r.name for r in reports if r.phase != "Running")
    elapsed = time.monotonic() - started
    waiting = ", ".join(pending) or "none"
    _say(f"== done in {elapsed:.0f}s: {len(running)} pods ran; pending: {waiting}")
    failed = False
    if set(pending) != EXPECTED_PENDING:
        _say(f"!! expected only {', '.join(sorted(EXPECTED_PENDING))} to stay pending")
        failed = True
    # A pod that does not go away, or a spec left behind, is an unprepare that failed.
    if not deleted:
        _say(f"!! the pods were not deleted within {WAIT:.0f}s")
        failed = True
    if left:
        _say("!! every claim's CDI spec should be removed once its pods are gone")
        failed = True
    return 1 if failed else 0


def _wait(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.3)
    return False


def _wait_for_slices(client: Any, gpu_nodes: dict[str, GpuNode]) -> None:
    from kubernetes import client as k

    nodes = list(gpu_nodes)
    seen: set[str] = set()

    def published() -> bool:
        _fail_if_dead(gpu_nodes, "before node {} published ResourceSlices")
        items = _raw(k.ResourceV1Api(client).list_resource_slice)["items"]
        seen.clear()
        seen.update(s["spec"].get("nodeName") for s in items)
        return seen >= set(nodes)

    if not _wait(published, WAIT):
        silent = [gpu_nodes[n] for n in nodes if n not in seen]
        raise ClusterError(
            f"no ResourceSlices from {', '.join(n.name for n in silent)} within {WAIT:.0f}s"
            + "".join(f"\n--- log {n.driver.log_path}:\n{n.driver.log_tail()}" for n in silent)
        )
    items = _raw(k.ResourceV1Api(client).list_resource_slice)["items"]
    for node in nodes:
        devices = [
            d["name"]
            for s in items
            if s["spec"].get("nodeName") == node
            for d in s["spec"].get("devices", [])
        ]
        gpus = [d for d in devices if "-mig-" not in d]
        if len(devices) > 12:
            shown = f"{' '.join(gpus)} + {len(devices) - len(gpus)} MIG placements"
        else:
            shown = " ".join(devices)
        _say(f"   {node}: {len(devices)} devices published: {shown}")


def _wait_for_service_account(client: Any) -> None:
    from kubernetes import client as k

    def ready() -> bool:
        names = [
            s["metadata"]["name"]
            for s in _raw(k.CoreV1Api(client).list_namespaced_service_account, NAMESPACE)["items"]
        ]
        return "default" in names

    if not _wait(ready, WAIT):
        # Pods could not be created without it: say why here, not in an API error later.
        raise ClusterError(
            f"namespace {NAMESPACE} got no default ServiceAccount within {WAIT:.0f}s: "
            "kube-controller-manager creates it (see its log in the cluster's logs directory)"
        )


def _fail_if_dead(gpu_nodes: dict[str, GpuNode], when: str) -> None:
    """Raise :class:`ClusterError` naming a node's kubelet or agent that exited, ``when``
    (formatted with the node's name) saying what it did not live to see: waiting longer
    cannot help. The cluster's directory, logs included, is removed on the way out (unless
    kept), so the error carries the log's tail."""
    for gpu_node in gpu_nodes.values():
        for proc in (gpu_node.node.process, gpu_node.driver):
            if not proc.alive():
                raise ClusterError(
                    f"{proc.name} exited (code {proc.returncode()}) "
                    f"{when.format(gpu_node.name)}; log {proc.log_path}:\n{proc.log_tail()}"
                )


def _wait_for_pods(client: Any, nodes: dict[str, GpuNode], pods: list[str]) -> list[PodReport]:
    reports: list[PodReport] = []

    def settled() -> bool:
        _fail_if_dead(nodes, "while the pods on node {} started")
        reports[:] = [_pod_report(client, nodes, p) for p in pods]
        return all(_settled(r) for r in reports)

    _wait(settled, WAIT)
    return reports
