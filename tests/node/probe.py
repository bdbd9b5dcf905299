"""What a container on the real node saw, read back from its pod log.

Each test pod runs `PROBE` in ``localhost/dra-test/busybox:local``: it prints its
environment, its NVIDIA device nodes and its mounts between marker lines, then waits to be
deleted. `Node` creates the examples' objects with that probe as the container, waits for
the log, and parses it into a `Seen`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

BUSYBOX = "localhost/dra-test/busybox:local"
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
REALNODE = REPO / "testenv" / "node" / "realnode.py"
CHART = REPO / "deployments" / "helm" / "dra-driver"
DRIVER_NAMESPACE = "dra-driver"
DRIVER_LABELS = "app.kubernetes.io/name=dra-driver,app.kubernetes.io/component=kubelet-plugin"
PROBE = (
    "echo PROBE-ENV; env | sort; "
    "echo PROBE-DEV; ls -ld /dev/nvidia* /dev/nvidia-caps/* 2>&1; "
    "echo PROBE-MOUNTS; cat /proc/mounts; "
    "echo PROBE-END; trap 'exit 0' TERM; while true; do sleep 1; done"
)
# busybox `ls -ld` of a character device: "crw-rw-rw- 1 root root 195, 0 Nov 24 01:00 /dev/nvidia0"
_CHAR_DEV = re.compile(r"^c\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s(/dev/\S+)$")
WAIT = 180.0
NVIDIA_MAJOR = 195  # /dev/nvidia<minor>


@dataclass(frozen=True)
class Seen:
    """A container's view: environment, character devices (path -> major, minor), mounts."""

    env: dict[str, str]
    devices: dict[str, tuple[int, int]]
    mounts: list[str]
    log: str

    def visible_devices(self) -> set[str]:
        value = self.env.get("NVIDIA_VISIBLE_DEVICES", "")
        return {v for v in value.split(",") if v}

    def mount_options(self, target: str) -> list[str] | None:
        """The options of the mount at `target` (a line of /proc/mounts), None if none."""
        return mount_options(self.mounts, target)


def mount_options(mounts: Iterable[str], target: str) -> list[str] | None:
    """The options of the last mount at `target` in the lines of /proc/mounts, or None."""
    found = None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 4 and fields[1] == target:
            found = fields[3].split(",")
    return found


def parse_probe(log: str) -> Seen:
    """Split the probe's log at its markers."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in log.splitlines():
        if line in ("PROBE-ENV", "PROBE-DEV", "PROBE-MOUNTS", "PROBE-END"):
            current = sections.setdefault(line, [])
            continue
        if current is not None:
            current.append(line)
    if "PROBE-END" not in sections:
        raise ValueError(f"incomplete probe output:\n{log}")
    env = dict(line.split("=", 1) for line in sections["PROBE-ENV"] if "=" in line)
    devices = {}
    for line in sections["PROBE-DEV"]:
        m = _CHAR_DEV.match(line.strip())
        if m:
            devices[m.group(3)] = (int(m.group(1)), int(m.group(2)))
    return Seen(env, devices, sections["PROBE-MOUNTS"], log)


@dataclass(frozen=True)
class Allocated:
    """One allocated device of a claim and its published attributes."""

    request: str
    pool: str
    device: str
    attributes: dict[str, Any]

    def attr(self, name: str) -> Any:
        value = self.attributes.get(name, {})
        return next(iter(value.values()), None) if isinstance(value, dict) else None


def wait_until(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


@dataclass
class Node:
    """The real node started by ``make node-up`` and an API client for its cluster.

    With more nodes (``make node-up NODES=2``) this is the first, ``dra-node-0``: the pods
    it creates are pinned to it, and its driver pods and slices are its own.
    """

    api: client.ApiClient
    name: str
    base: Path
    kubeconfig: Path
    helm_bin: Path
    ctr_bin: Path
    #: The driver name the chart installs (compat mode: the NVIDIA driver's).
    driver: str = "gpu.dra.dev"
    #: Every node of the cluster, this one first, and the directory of each on the host.
    nodes: list[str] = field(default_factory=list)
    node_dirs: list[Path] = field(default_factory=list)
    _dyn: DynamicClient | None = field(default=None, repr=False)

    @classmethod
    def from_state(cls, base: Path) -> Node:
        """The node that ``realnode.py up`` recorded in `base` (OSError when there is none).

        helm and ctr: ``DRA_NODE_HELM`` / ``DRA_NODE_CTR``, else where the make targets put
        them.
        """
        state = json.loads((base / "node-state.json").read_text())
        records = state.get("nodes") or [{"name": state["node"], "dir": str(base)}]
        return cls(
            api=config.new_client_from_config(config_file=state["kubeconfig"]),
            name=state["node"],
            nodes=[n["name"] for n in records],
            node_dirs=[Path(n["dir"]) for n in records],
            base=base,
            kubeconfig=Path(state["kubeconfig"]),
            helm_bin=Path(os.environ.get("DRA_NODE_HELM", REPO / ".cache/tools/bin/helm")),
            ctr_bin=Path(os.environ.get("DRA_NODE_CTR", REPO / ".cache/node/bin/ctr")),
        )

    def new_namespace(self, prefix: str) -> str:
        """Create a namespace named `prefix` plus a random suffix, with its ServiceAccount."""
        ns = self.core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(generate_name=prefix))
        )
        name: str = ns.metadata.name
        self.wait_service_account(name)
        return name

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def dynamic(self) -> DynamicClient:
        if self._dyn is None:
            self._dyn = DynamicClient(self.api)
        return self._dyn

    @property
    def cdi_dir(self) -> Path:
        return self.base / "cdi"

    # -- objects -------------------------------------------------------------------

    def create(self, obj: dict[str, Any], namespace: str) -> None:
        """Create `obj`; with more than one node, its pods (or its template's) on this one."""
        if len(self.nodes) > 1:
            self.pin(obj)
        res = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        res.create(body=obj, namespace=namespace if res.namespaced else None)

    def apply_example(
        self,
        name: str,
        namespace: str,
        edit: Callable[[dict[str, Any]], None] | None = None,
        only: Iterable[str] | None = None,
        probe: Callable[[dict[str, Any]], None] | None = None,
    ) -> list[str]:
        """Create an example's objects (those named in `only`, if given), each pod's
        containers running the probe (`probe_pod`, or `probe` to run something else).
        Returns the names of the pods created.
        """
        wanted = None if only is None else set(only)
        pods = []
        for path in sorted((EXAMPLES / name).glob("*.yaml")):
            for obj in yaml.safe_load_all(path.read_text()):
                if not obj or (wanted is not None and obj["metadata"]["name"] not in wanted):
                    continue
                if edit is not None:
                    edit(obj)
                if obj["kind"] == "Pod":
                    (probe or probe_pod)(obj)
                    pods.append(obj["metadata"]["name"])
                self.create(obj, namespace)
        return pods

    def run_pod(self, namespace: str, name: str, **container: Any) -> None:
        """Create a plain probe pod (no claim unless `container` adds resources)."""
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "app", **container}]},
        }
        probe_pod(pod)
        self.create(pod, namespace)

    def pin(self, obj: dict[str, Any], node: str | None = None) -> None:
        """Schedule `obj` (a pod, or a workload's pod template) on `node` (default: this
        one) only: a node selector, so the scheduler still allocates its claims."""
        spec = obj.get("spec") or {}
        if obj["kind"] != "Pod":
            spec = (spec.get("template") or {}).get("spec")
            if spec is None:
                return
        selector = spec.setdefault("nodeSelector", {})
        selector.setdefault("kubernetes.io/hostname", node or self.name)

    # -- what the containers saw -----------------------------------------------------

    def seen(self, namespace: str, pod: str, container: str = "app") -> Seen:
        """Wait for the pod's probe to finish printing; its parsed output."""
        return parse_probe(self.log_until(namespace, pod, "PROBE-END", container))

    def log_until(self, namespace: str, pod: str, marker: str, container: str = "app") -> str:
        """The container's log once it has a line `marker`."""

        def done() -> str | None:
            try:
                log: str | None = self.core.read_namespaced_pod_log(
                    pod, namespace, container=container
                )
            except ApiException:
                return None
            return log if log and marker in log.splitlines() else None

        try:
            text: str = wait_until(done, f"the output of {namespace}/{pod}")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.describe(namespace, pod)}") from None
        return text

    def describe(self, namespace: str, pod: str) -> str:
        """The pod's phase, conditions and events (for failure messages)."""
        try:
            p = self.core.read_namespaced_pod(pod, namespace)
        except ApiException as e:
            return f"pod {pod}: {e.reason}"
        events = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod}"
        )
        lines = [f"pod {pod}: phase {p.status.phase}"]
        lines += [f"  {c.type}={c.status} {c.reason or ''}" for c in p.status.conditions or []]
        lines += [f"  event {e.reason}: {e.message}" for e in events.items]
        return "\n".join(lines)

    def allocated(self, namespace: str, pod: str) -> list[Allocated]:
        """The devices allocated to the pod's claims, with their slices' attributes."""
        p = self.core.read_namespaced_pod(pod, namespace)
        # Claims made from templates are in the status; claims named by the pod in its spec.
        claims = [s.resource_claim_name for s in p.status.resource_claim_statuses or []]
        claims += [
            c.resource_claim_name for c in p.spec.resource_claims or [] if c.resource_claim_name
        ]
        ext = p.status.extended_resource_claim_status
        if ext is not None:
            claims.append(ext.resource_claim_name)
        res = self.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
        devices = self.published_devices()
        out = []
        for claim in claims:
            obj = res.get(name=claim, namespace=namespace).to_dict()
            for r in obj["status"]["allocation"]["devices"]["results"]:
                attrs = devices.get((r["pool"], r["device"]), {})
                out.append(Allocated(r["request"], r["pool"], r["device"], attrs))
        return out

    def published_devices(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The driver's published devices by (pool, name): their attributes."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for s in self.slices():
            for d in s["spec"].get("devices", []):
                out[(s["spec"]["pool"]["name"], d["name"])] = d.get("attributes", {})
        return out

    def pod_uid(self, namespace: str, pod: str) -> str:
        uid: str = self.core.read_namespaced_pod(pod, namespace).metadata.uid
        return uid

    def claim_names(self, namespace: str, pod: str) -> list[str]:
        """The names of the pod's ResourceClaims (made from templates or not)."""
        p = self.core.read_namespaced_pod(pod, namespace)
        return [s.resource_claim_name for s in p.status.resource_claim_statuses or []]

    def claim_uids(self, namespace: str, pod: str) -> list[str]:
        res = self.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
        return [
            res.get(name=name, namespace=namespace).metadata.uid
            for name in self.claim_names(namespace, pod)
        ]

    def cdi_specs_for(self, uids: Iterable[str]) -> list[Path]:
        """The CDI spec files on the node that name one of the claims `uids`."""
        wanted = set(uids)
        return [p for p in self.cdi_dir.glob("*") if any(u in p.name for u in wanted)]

    def restart(self, component: str) -> None:
        """Restart the node's kubelet or containerd (``realnode.py restart``)."""
        subprocess.run(
            [sys.executable, str(REALNODE), "--base", str(self.base), "restart", component],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def ctr(self, *args: str, node_dir: Path | None = None) -> str:
        """containerd's client on the node's containerd (or that of the node whose files are
        in `node_dir`), in the CRI namespace."""
        sock = (node_dir or self.base) / "containerd" / "containerd.sock"
        out = subprocess.run(
            [str(self.ctr_bin), "--address", str(sock), "-n", "k8s.io", *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return out.stdout

    def helm(self, *args: str) -> str:
        out = subprocess.run(
            [
                str(self.helm_bin),
                "--kubeconfig",
                str(self.kubeconfig),
                "--namespace",
                DRIVER_NAMESPACE,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}: {out.stderr}")
        return out.stdout

    def upgrade_driver(self, *sets: str) -> None:
        """`helm upgrade` the driver with ``--set`` values; wait until the new agent publishes.

        During the surge update the old and the new agent run side by side; the pool must end
        as the new one publishes it (every slice names the new pod as its publisher), with no
        slice of the old agent's view left behind.
        """
        args = [a for kv in sets for a in ("--set", kv)]
        self.helm("upgrade", "dra-driver", str(CHART), "--reuse-values", *args, "--wait")
        wait_until(lambda: len(self.driver_pods()) == 1, "one driver pod after the upgrade")
        self.wait_published_by(self.driver_pods()[0].metadata.uid)

    def switch_chart(self, backend: str, *helm_args: str) -> None:
        """Re-install the chart with the ``backend`` (``simulated`` or ``nvml``) and extra
        ``helm`` arguments (``realnode.py chart``); wait until the new agent publishes."""
        self._realnode(
            "chart",
            "--backend",
            backend,
            "--helm-args",
            shlex.join(helm_args),
            "--helm",
            str(self.helm_bin),
            "--chart",
            str(CHART),
        )
        wait_until(lambda: len(self.driver_pods()) == 1, "one driver pod after the switch")
        self.wait_published_by(self.driver_pods()[0].metadata.uid)

    def reboot(self) -> None:
        """What a reboot does to the node (``realnode.py reboot``)."""
        self._realnode("reboot")

    def _realnode(self, *args: str) -> None:
        out = subprocess.run(
            [sys.executable, str(REALNODE), "--base", str(self.base), *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if out.returncode != 0:
            raise AssertionError(f"realnode.py {args[0]}: {out.stderr.strip()}")

    def device_taints(self) -> dict[str, list[str]]:
        """Device name -> its taints as ``key=value``, across the driver's slices."""
        return {
            d["name"]: [f"{t['key']}={t.get('value', '')}" for t in d.get("taints") or []]
            for s in self.slices()
            for d in s["spec"].get("devices", [])
        }

    def wait_published_by(self, uid: str) -> None:
        """Wait until every slice of the driver names the agent pod ``uid`` as its publisher."""

        def published_by_agent() -> bool:
            slices = self.slices()
            return bool(slices) and all(
                (s["metadata"].get("annotations") or {})
                .get(f"{self.driver}/publisher", "")
                .endswith("/" + uid)
                for s in slices
            )

        wait_until(published_by_agent, "every slice published by the new agent")

    def slices(self) -> list[dict[str, Any]]:
        """The driver's ResourceSlices of this node as plain dicts."""
        res = self.dynamic.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
        selector = f"spec.driver={self.driver},spec.nodeName={self.name}"
        return [item.to_dict() for item in res.get(field_selector=selector).items]

    def driver_pods(self) -> list[client.V1Pod]:
        """The driver's pods on this node."""
        pods = self.core.list_namespaced_pod(
            DRIVER_NAMESPACE,
            label_selector=DRIVER_LABELS,
            field_selector=f"spec.nodeName={self.name}",
        )
        return list(pods.items)

    def registration_sockets(self) -> set[str]:
        return {p.name for p in (self.base / "kubelet" / "plugins_registry").glob("*.sock")}

    def container_ids(self, namespace: str, pod: str) -> dict[str, str]:
        """Container name -> container ID: a restarted container gets a new one."""
        p = self.core.read_namespaced_pod(pod, namespace)
        return {c.name: c.container_id for c in p.status.container_statuses or []}

    # -- cleanup -------------------------------------------------------------------

    def delete_pod(self, namespace: str, pod: str) -> None:
        self.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=1)

        def gone() -> bool:
            try:
                self.core.read_namespaced_pod(pod, namespace)
            except ApiException as e:
                return e.status == 404
            return False

        wait_until(gone, f"pod {namespace}/{pod} to be deleted")

    def wait_service_account(self, namespace: str) -> None:
        """Wait for the controller to create the default ServiceAccount; create it if late.

        Pod admission needs it, and the controller's watch may still be backing off after
        an API server restart; that controller is not what these tests are about.
        """

        def ready() -> bool:
            try:
                self.core.read_namespaced_service_account("default", namespace)
            except ApiException:
                return False
            return True

        try:
            wait_until(ready, f"the default ServiceAccount of {namespace}", timeout=15)
        except AssertionError:
            try:
                self.core.create_namespaced_service_account(
                    namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
                )
            except ApiException as e:
                if e.status != 409:  # the controller got there first
                    raise

    def delete_namespace(self, namespace: str) -> None:
        """Delete the pods first (so the kubelet unprepares their claims), then the rest.
        Deployments go before their pods, which they would make again."""
        client.AppsV1Api(self.api).delete_collection_namespaced_deployment(namespace)
        client.AppsV1Api(self.api).delete_collection_namespaced_replica_set(namespace)
        for p in self.core.list_namespaced_pod(namespace).items:
            self.core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=1)
        wait_until(
            lambda: not self.core.list_namespaced_pod(namespace).items,
            f"the pods of {namespace} to go",
        )
        self.core.delete_namespace(namespace)


def probe_pod(pod: dict[str, Any]) -> None:
    """Make every container of `pod` run the probe in the busybox image."""
    spec = pod["spec"]
    spec["terminationGracePeriodSeconds"] = 2
    for c in spec["containers"]:
        c["image"] = BUSYBOX
        c["imagePullPolicy"] = "Never"
        c["command"] = ["sh", "-c", PROBE]
        c.pop("args", None)
