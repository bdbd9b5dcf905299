"""A real Kubernetes node on this machine, for the real-node test tier (``make node-up``).

The local control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager),
then one node (or more, ``--nodes``) made of the real components: containerd (CRI, CDI
specs read from the driver's CDI directory) running containers with runc, CNI bridge
networking on a private pod network, and the upstream kubelet (``testenv kubelet``). Images
come from local OCI archives. The driver is installed with its Helm chart and runs as a
DaemonSet pod.

    python realnode.py up --bin-dir B --cni-dir C --images I --helm H --chart DIR
                          [--backend simulated|nvml] [--helm-args "--set k=v ..."] [--nodes N]
    python realnode.py chart --backend nvml [--helm-args ...]   (a running node, helm upgrade)
    python realnode.py down
    python realnode.py status
    python realnode.py restart kubelet|containerd [--node I]

Everything lives in one directory (``--base``, default /var/lib/dra-node; short, because
the kubelet plugins' unix socket paths must stay under 108 bytes) and one cgroup
(`CGROUP_PARENT`), so that ``down`` can remove all of it. Needs root.

The pods reach the API server through the ``kubernetes`` Service's ClusterIP, as
in-cluster clients do. There is no kube-proxy: one DNAT rule sends that address to the
API server on 127.0.0.1 (which is why the bridge accepts routing to loopback).

With ``--nodes 2`` the second node, ``dra-node-1``, runs its containerd and kubelet in a
network namespace and a mount namespace of its own (`NodeSpec`, `create_namespaces`): its
own pod subnet behind its own bridge, a veth to the host's node bridge, and the same paths
as node 0 for what the chart mounts, bind-mounted from its directory ``<base>/n1``. The
host routes between the pod subnets, and a second DNAT rule on the node bridge sends the
Service address to the API server for the other node's kubelet and pods.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from host import (
    connect_node,
    create_cgroup_parent,
    create_namespaces,
    kill_containers,
    kill_shims,
    node_cgroup_parents,
    overlay_works,
    remove_cgroup_parent,
    remove_network,
    run,
    sandbox_netns,
    setup_network,
    setup_node_network,
    shared_mount,
    unmount_all,
)
from nodeconfig import (
    API_SERVICE_IP,
    DEFAULT_BASE,
    DRIVER_IMAGE,
    DRIVER_NAMESPACE,
    MAX_NODES,
    MPS_CGROUP_PARENT,
    NODE_LABELS,
    NODE_NAME,
    START_TIMEOUT,
    Layout,
    NodeError,
    NodeSpec,
    cni_config,
    containerd_config,
    kubelet_config,
)

# The local control plane. Its module is the only import of it here.
from devenv import localcluster as lc
from devenv.localcluster.cluster import stop_rank
from devenv.localcluster.probes import apiserver_request
from devenv.localcluster.processes import pid_alive

REPO = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------------------


@dataclass
class Tools:
    """Programs the node is made of."""

    bin_dir: Path  # containerd, containerd-shim-runc-v2, ctr
    cni_dir: Path
    images: list[Path]  # OCI archives to import
    helm: Path
    chart: Path
    runc: Path

    @property
    def ctr(self) -> Path:
        return self.bin_dir / "ctr"


@dataclass(frozen=True)
class ChartMode:
    """How the chart is installed: the discovery backend and extra ``helm`` arguments
    (after the tier's own values, so they win)."""

    backend: str = "simulated"
    helm_args: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "helmArgs": list(self.helm_args)}

    def __str__(self) -> str:
        return " ".join([f"backend {self.backend}", *self.helm_args])


def nvml_values(state: Path) -> dict[str, Any]:
    """Chart values for the NVML backend on the stand-in driver root: the stand-in
    libnvidia-ml finds its data, events and health files in ``state``, a host directory
    mounted at the same path (tests inject Xids and lost GPUs there and read MIG state)."""
    env = {
        "FAKE_NVML_DATA": state / "nvml-data",
        "FAKE_NVML_EVENTS": state / "events",
        "FAKE_NVML_HEALTH": state / "health",
        "FAKE_NVML_FAIL_FILE": state / "fail",
        "DRA_SYSFS_ROOT": state / "sys",
        "DRA_BOOT_ID_FILE": state / "boot_id",
    }
    return {
        "discovery": {"backend": "nvml", "profile": ""},
        "extraEnv": [{"name": k, "value": str(v)} for k, v in env.items()],
        "extraVolumes": [
            {"name": "standin-driver-state", "hostPath": {"path": str(state), "type": "Directory"}}
        ],
        "extraVolumeMounts": [{"name": "standin-driver-state", "mountPath": str(state)}],
    }


def ctr(tools: Tools, layout: Layout, *args: str, timeout: float = 300) -> str:
    return run(
        tools.ctr, "--address", layout.containerd_socket, "-n", "k8s.io", *args, timeout=timeout
    )


BACKENDS = ("simulated", "nvml")


def make_driver_root(path: Path, nvml_state: Path, node_name: str = NODE_NAME) -> None:
    """A stand-in NVIDIA driver installation in the node's driver root (tests/driverroot.py):
    the stand-in libnvidia-ml and tools, their mutable state in ``nvml_state``.

    The agent reads it at start (the chart's ``driverRoot``), so it is made before the chart
    is installed: every claim's CDI spec then mounts its libraries, tools, firmware and
    sockets, as on a GPU node, and tests/node/test_driver_files.py checks what a container
    sees. The NVML backend discovers the node's GPUs through it and runs its tools. Needs a
    C compiler (the libraries and tools are built from the project's sources). The stand-in
    GPUs' UUIDs derive from `node_name`.
    """
    argv = [sys.executable, "-m", "tests.driverroot", str(path), "--nvml", str(nvml_state)]
    if node_name != NODE_NAME:
        argv += ["--node-name", node_name]
    made = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise NodeError(f"simulated driver root in {path}: {made.stderr.strip()}")
    # What a reboot brings back (reset_standin_driver), and the boot id the agent reads.
    shutil.copyfile(nvml_state / "nvml-data", nvml_state / "nvml-data.installed")
    shutil.copyfile("/proc/sys/kernel/random/boot_id", nvml_state / "boot_id")
    print(made.stdout.strip(), flush=True)


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def reset_standin_driver(state: Path) -> None:
    """The stand-in driver as a boot leaves it: MIG devices made since it was installed are
    gone (the data file as made), and a new boot id."""
    shutil.copyfile(state / "nvml-data.installed", state / "nvml-data")
    (state / "boot_id").write_text(str(uuid.uuid4()) + "\n")


class RealNode:
    """Bring the node up on top of a local control plane, or take it all down."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.nodes = [NodeSpec(layout.base)]

    # -- up ------------------------------------------------------------------------

    def up(
        self, tools: Tools, mode: ChartMode, *, driver_image: str = DRIVER_IMAGE, nodes: int = 1
    ) -> dict[str, Any]:
        layout = self.layout
        if layout.base.exists():
            self.down()
        self.nodes = [NodeSpec(layout.base, i) for i in range(nodes)]
        for spec in self.nodes:
            own = spec.own
            for d in (own.cdi, own.cni_conf, own.cni_state, own.kubelet, own.pod_logs):
                d.mkdir(parents=True, exist_ok=True)
        # The node lifecycle controller lifts the not-ready taint the kubelet registers with.
        controllers = (*lc.DEFAULT_CONTROLLERS, "node-lifecycle-controller")
        # The API server reaches the kubelet (logs) at the node's address; its name does
        # not resolve.
        cluster = lc.LocalCluster(
            base_dir=layout.cluster,
            keep=True,
            controllers=controllers,
            apiserver_extra_args=("--kubelet-preferred-address-types=InternalIP",),
        )
        try:
            cluster.start()
            assert cluster.ports is not None
            self._save(cluster)
            setup_network(cluster.ports.apiserver)
            if len(self.nodes) > 1:
                setup_node_network(cluster.ports.apiserver)
            # The other nodes' mount namespaces copy the host's before node 0 mounts anything.
            for spec in self.nodes[1:]:
                create_namespaces(spec)
                connect_node(spec)
            shared_mount(layout.driver_root)
            for spec in self.nodes:
                make_driver_root(spec.own.driver_root, spec.own.nvml_state, spec.name)
                create_cgroup_parent(spec.cgroup_parent)
                self._start_containerd(cluster, tools, spec)
                self._save(cluster)
                for archive in tools.images:
                    ctr(tools, spec.own, "images", "import", "--no-unpack=false", str(archive))
                self._start_kubelet(cluster, spec)
                self._save(cluster)
            self._install_chart(cluster.kubeconfig, tools, driver_image, mode)
        except BaseException:
            self._save(cluster)
            raise
        return self._save(cluster, mode)

    def _start_containerd(self, cluster: lc.LocalCluster, tools: Tools, spec: NodeSpec) -> None:
        layout = spec.own
        snapshotter = "overlayfs" if overlay_works(layout.containerd / "probe") else "native"
        shutil.rmtree(layout.containerd / "probe", ignore_errors=True)
        config = layout.containerd / "config.toml"
        config.write_text(
            containerd_config(
                layout,
                snapshotter=snapshotter,
                cni_bin=tools.cni_dir,
                runc=tools.runc,
                sandbox_image="localhost/dra-test/pause:local",
                isolated=spec.isolated,
            )
        )
        cni = cni_config(
            layout, bridge=spec.bridge, subnet=spec.pod_subnet, gateway=spec.pod_gateway
        )
        (layout.cni_conf / "10-dra-node.conflist").write_text(json.dumps(cni, indent=2))
        env = {"PATH": f"{tools.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        proc = cluster.spawn(
            spec.process("containerd"),
            [*spec.enter(), str(tools.bin_dir / "containerd"), "--config", str(config)],
            env,
        )
        lc.wait_for(
            lambda: (
                subprocess.run(
                    [str(tools.ctr), "--address", str(layout.containerd_socket), "version"],
                    capture_output=True,
                    check=False,
                ).returncode
                == 0
            ),
            60,
            "containerd socket",
            proc,
        )
        where = f" on {spec.name}" if spec.isolated else ""
        print(f"containerd running{where} (snapshotter {snapshotter})", flush=True)

    def _start_kubelet(self, cluster: lc.LocalCluster, spec: NodeSpec) -> None:
        layout = spec.own
        port, healthz = lc.pick_free_ports(2)
        config = layout.kubelet / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(
                    layout,
                    port=port,
                    healthz_port=healthz,
                    pki=cluster.pki_dir,
                    feature_gates=cluster.feature_gates,
                    address=spec.node_ip,
                    cgroup_parent=spec.cgroup_parent,
                )
            )
        )
        kubeconfig = cluster.kubeconfig
        if spec.isolated:  # 127.0.0.1 is the node's own loopback there
            kubeconfig = node_kubeconfig(cluster.kubeconfig, layout.base / "kubeconfig")
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        args = [
            "kubelet",
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            # Node 0's path: an isolated node has its own directory mounted there.
            f"--root-dir={spec.view.kubelet}",
            f"--hostname-override={spec.name}",
            f"--node-ip={spec.node_ip}",
            f"--node-labels={labels}",
            "--v=2",
        ]
        binary = cluster.binary or lc.binary_path()
        proc = cluster.spawn(spec.process("kubelet"), [*spec.enter(), str(binary), *args])
        lc.wait_for(
            lambda: node_ready(cluster, spec.name), START_TIMEOUT, f"node {spec.name} Ready", proc
        )
        print(f"kubelet running, node {spec.name} Ready", flush=True)

    def _install_chart(self, kubeconfig: Path, tools: Tools, image: str, mode: ChartMode) -> None:
        """``helm upgrade --install`` the chart in ``mode``; waits for the new agent's slices."""
        layout = self.layout
        repo, tag = image.rsplit(":", 1)
        values: dict[str, Any] = {
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "discovery": {"backend": "simulated", "profile": "mixed"},
            "kubeletPluginsDir": str(layout.kubelet / "plugins"),
            "kubeletRegistryDir": str(layout.kubelet / "plugins_registry"),
            "cdiRoot": str(layout.cdi),
            "driverRoot": str(layout.driver_root),
            "logFormat": "json",
            # The tier proves the device plugin's migration path; no device plugin runs here.
            "extendedResource": {"enabled": True, "acknowledgeNoDevicePlugin": True},
            # helm creates the release namespace (--create-namespace), not the chart.
            "createNamespace": False,
        }
        if mode.backend == "nvml":
            values.update(nvml_values(layout.nvml_state))
        values_file = layout.base / "chart-values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        run(
            tools.helm,
            "--kubeconfig",
            kubeconfig,
            "--namespace",
            DRIVER_NAMESPACE,
            "upgrade",
            "--install",
            "--create-namespace",
            "dra-driver",
            tools.chart,
            "--values",
            values_file,
            "--wait",
            "--timeout",
            "5m",
            *mode.helm_args,
        )
        names = [spec.name for spec in self.nodes]
        lc.wait_for(
            lambda: slices_published(kubeconfig, names), START_TIMEOUT, "the driver's slices"
        )
        print(f"driver installed with its chart ({mode}); slices published", flush=True)

    def switch(self, tools: Tools, mode: ChartMode, driver_image: str) -> dict[str, Any]:
        """Re-install the chart of a running node in another mode (helm upgrade): the node,
        its images and the control plane stay."""
        state = self.running()
        if state is None:
            raise NodeError("no node running")
        self.nodes = [NodeSpec(self.layout.base, i) for i in range(len(state["nodes"]))]
        if state.get("mode") != mode.as_dict():
            self._install_chart(Path(state["kubeconfig"]), tools, driver_image, mode)
            state["mode"] = mode.as_dict()
            self.layout.state.write_text(json.dumps(state, indent=2) + "\n")
        return state

    def _save(self, cluster: lc.LocalCluster, mode: ChartMode | None = None) -> dict[str, Any]:
        state = {
            "base": str(self.layout.base),
            "kubeconfig": str(cluster.kubeconfig),
            "node": NODE_NAME,
            "nodes": [node_record(spec) for spec in self.nodes],
            "mode": mode.as_dict() if mode else None,
            "processes": {name: p.pid for name, p in cluster.processes.items()},
            "commands": {
                name: {"argv": p.argv, "env": p.env, "log": str(p.log_path)}
                for name, p in cluster.processes.items()
            },
        }
        self.layout.base.mkdir(parents=True, exist_ok=True)
        self.layout.state.write_text(json.dumps(state, indent=2) + "\n")
        return state

    # -- status --------------------------------------------------------------------

    def running(self) -> dict[str, Any] | None:
        """The saved state when every recorded process is alive."""
        try:
            state: dict[str, Any] = json.loads(self.layout.state.read_text())
        except (OSError, ValueError):
            return None
        # A state file written before there could be more nodes records one.
        state.setdefault("nodes", [node_record(NodeSpec(self.layout.base))])
        procs = state.get("processes", {})
        needed = {"kube-apiserver"}
        for i in range(len(state["nodes"])):
            spec = NodeSpec(self.layout.base, i)
            needed |= {spec.process("containerd"), spec.process("kubelet")}
        if needed <= procs.keys() and all(pid_alive(int(p)) for p in procs.values()):
            return state
        return None

    def restart(self, component: str, node: int = 0) -> int:
        """Stop one process of a node (its process group) and start it again as before.

        Containers keep running: their shims are in sessions of their own.
        """
        state = self.running()
        if state is None:
            raise NodeError("no node running")
        if node >= len(state["nodes"]):
            raise NodeError(f"no node {node}: {len(state['nodes'])} running")
        name = NodeSpec(self.layout.base, node).process(component)
        cmd = state["commands"][name]
        lc.ManagedProcess(name, [], Path(os.devnull), pid=int(state["processes"][name])).stop()
        proc = lc.ManagedProcess(name, cmd["argv"], Path(cmd["log"]), cmd["env"])
        proc.start()
        assert proc.pid is not None
        state["processes"][name] = proc.pid
        self.layout.state.write_text(json.dumps(state, indent=2) + "\n")
        return proc.pid

    # -- down ----------------------------------------------------------------------

    def down(self) -> None:
        """Stop everything and remove every trace: processes, mounts, links, cgroups."""
        layout = self.layout
        try:
            state: dict[str, Any] = json.loads(layout.state.read_text())
        except (OSError, ValueError):
            state = {}
        procs: dict[str, int] = state.get("processes", {})
        for name, pid in sorted(procs.items(), key=lambda kv: stop_rank(kv[0])):
            lc.ManagedProcess(name, [], Path(os.devnull), pid=int(pid)).stop(timeout=10)
        # Whatever number of nodes the state recorded (or none): every node there can be.
        for parent in (*node_cgroup_parents(), MPS_CGROUP_PARENT):
            kill_containers(parent=parent)
        kill_shims(*(NodeSpec(layout.base, i).own for i in range(MAX_NODES)))
        netns = sandbox_netns()
        # With the other nodes' processes gone, unmounting their namespace files ends their
        # namespaces, and with them every mount, link and route made inside.
        unmount_all(layout.base, *netns)
        for ns in netns:
            with contextlib.suppress(OSError):
                ns.unlink()
        remove_network()
        for parent in (*node_cgroup_parents(), MPS_CGROUP_PARENT):
            remove_cgroup_parent(parent)
        shutil.rmtree(layout.base, ignore_errors=True)

    def reboot(self) -> None:
        """What a reboot does to the node, short of the machine: every process of the node
        stops (kubelet, containerd, containers, the driver's MPS daemons), tmpfs mounts and
        the CDI directory (a tmpfs on GPU nodes) are emptied, the stand-in GPUs lose their
        MIG devices, and the driver sees a new boot id. Then containerd and the kubelet start
        again and restart the pods, as after a boot; the control plane stays."""
        layout = self.layout
        state = self.running()
        if state is None:
            raise NodeError("no node running")
        for name in ("kubelet", "containerd"):
            lc.ManagedProcess(name, [], Path(os.devnull), pid=int(state["processes"][name])).stop()
        kill_containers()
        kill_containers(parent=MPS_CGROUP_PARENT)
        kill_shims(layout)
        remove_cgroup_parent(MPS_CGROUP_PARENT)
        unmount_all(layout.kubelet / "plugins")
        for spec in layout.cdi.iterdir():
            spec.unlink()
        reset_standin_driver(layout.nvml_state)
        for name in ("containerd", "kubelet"):
            cmd = state["commands"][name]
            proc = lc.ManagedProcess(name, cmd["argv"], Path(cmd["log"]), cmd["env"])
            proc.start()
            assert proc.pid is not None
            state["processes"][name] = proc.pid
            if name == "containerd":  # the kubelet exits when it finds no runtime
                lc.wait_for(lambda: _listening(layout.containerd_socket), 60, "containerd", proc)
        self.layout.state.write_text(json.dumps(state, indent=2) + "\n")


# --------------------------------------------------------------------------------------
# API checks (through kubectl-free GETs of the local control plane)
# --------------------------------------------------------------------------------------


def node_ready(cluster: lc.LocalCluster, name: str = NODE_NAME) -> bool:
    return cluster._node_ready(name)


def node_record(spec: NodeSpec) -> dict[str, Any]:
    """What the state file says of a node."""
    return {
        "name": spec.name,
        "address": spec.node_ip,
        "podSubnet": spec.pod_subnet,
        "dir": str(spec.own.base),
        "netns": str(spec.netns_file) if spec.isolated else None,
        "mountns": str(spec.mountns_file) if spec.isolated else None,
    }


def node_kubeconfig(kubeconfig: Path, out: Path) -> Path:
    """A copy of `kubeconfig` for a kubelet in a network namespace of its own: the API
    server at the ``kubernetes`` Service's address (named by its serving certificate), which
    the host's DNAT rule on the node bridge sends to the API server."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        cluster = entry["cluster"]
        cluster["server"] = f"https://{API_SERVICE_IP}:443"
        if cluster.get("certificate-authority"):
            cluster["certificate-authority"] = str(
                kubeconfig.parent / cluster["certificate-authority"]
            )
    out.write_text(yaml.safe_dump(config))
    return out


def _admin_get(kubeconfig: Path, path: str) -> dict[str, Any] | None:
    """GET ``path`` with the admin credentials of the local control plane's kubeconfig."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    token = config["users"][0]["user"]["token"]
    ca = cluster.get("certificate-authority") or str(kubeconfig.parent / "pki" / "ca.crt")
    status, body = apiserver_request(cluster["server"], token, ca, path)
    if status != 200:
        return None
    try:
        data: dict[str, Any] = json.loads(body)
    except ValueError:
        return None
    return data


def slices_published(kubeconfig: Path, names: Sequence[str] = (NODE_NAME,)) -> bool:
    """Whether every node's pool is published. After an upgrade, ``helm --wait`` has waited
    for the new agents to be started, which they are only once they published."""
    data = _admin_get(kubeconfig, "/apis/resource.k8s.io/v1/resourceslices")
    items = (data or {}).get("items", [])
    published = {s["spec"].get("nodeName") for s in items}
    return all(name in published for name in names)


def nodes_ready(state: dict[str, Any]) -> dict[str, bool]:
    """Each recorded node's Ready condition, as the API server has it."""
    ready = {}
    for record in state.get("nodes", []):
        node = _admin_get(Path(state["kubeconfig"]), f"/api/v1/nodes/{record['name']}") or {}
        conditions = node.get("status", {}).get("conditions", [])
        ready[record["name"]] = any(
            c["type"] == "Ready" and c["status"] == "True" for c in conditions
        )
    return ready


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def require_root() -> None:
    if os.geteuid() != 0:
        raise SystemExit("node: needs root (containers, mounts, a bridge, cgroups); run as root")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, default=DEFAULT_BASE)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--bin-dir", type=Path, required=True)
    up.add_argument("--cni-dir", type=Path, required=True)
    up.add_argument("--image", type=Path, action="append", default=[])
    up.add_argument("--helm", type=Path, required=True)
    up.add_argument("--chart", type=Path, required=True)
    up.add_argument("--runc", type=Path, required=True)
    up.add_argument("--driver-image", default=DRIVER_IMAGE)
    up.add_argument(
        "--nodes",
        type=int,
        default=1,
        choices=range(1, MAX_NODES + 1),
        metavar="N",
        help="nodes: dra-node-0 on the host, the others in namespaces of their own",
    )
    for command in (
        up,
        chart := sub.add_parser("chart", help="re-install the chart (helm upgrade)"),
    ):
        command.add_argument("--backend", choices=BACKENDS, default="simulated")
        command.add_argument("--helm-args", default="", help="extra helm install arguments")
    chart.add_argument("--helm", type=Path, required=True)
    chart.add_argument("--chart", type=Path, required=True)
    chart.add_argument("--driver-image", default=DRIVER_IMAGE)
    sub.add_parser("down")
    sub.add_parser("status")
    sub.add_parser("reboot", help="what a reboot does to the node (the control plane stays)")
    restart = sub.add_parser("restart", help="restart the kubelet or containerd")
    restart.add_argument("component", choices=("kubelet", "containerd"))
    restart.add_argument("--node", type=int, default=0, help="the node's index (default 0)")
    args = parser.parse_args(argv)
    require_root()
    node = RealNode(Layout(args.base.resolve()))
    if args.cmd == "down":
        node.down()
        print("node down; nothing left")
        return 0
    if args.cmd == "reboot":
        node.reboot()
        print("node rebooted")
        return 0
    if args.cmd == "restart":
        print(f"{args.component} restarted: pid {node.restart(args.component, args.node)}")
        return 0
    if args.cmd in ("up", "chart"):
        mode = ChartMode(args.backend, tuple(shlex.split(args.helm_args)))
    if args.cmd == "chart":
        tools = Tools(Path(), Path(), [], args.helm, args.chart, Path())
        try:
            node.switch(tools, mode, args.driver_image)
        except (NodeError, lc.ClusterError) as e:
            print(f"node chart failed: {e}", file=sys.stderr)
            return 1
        return 0
    state = node.running()
    if args.cmd == "status":
        if state:
            state["ready"] = nodes_ready(state)
        print(json.dumps(state, indent=2) if state else "no node running")
        return 0 if state else 1
    if state is not None and len(state["nodes"]) != args.nodes:
        print(f"{len(state['nodes'])} node(s) running, {args.nodes} asked for: starting afresh")
        node.down()
        state = None
    if state is None:
        tools = Tools(args.bin_dir, args.cni_dir, args.image, args.helm, args.chart, args.runc)
        try:
            state = node.up(tools, mode, driver_image=args.driver_image, nodes=args.nodes)
        except (NodeError, lc.ClusterError) as e:
            print(f"node-up failed: {e}\nlogs: {node.layout.logs}", file=sys.stderr)
            return 1
    else:
        tools = Tools(args.bin_dir, args.cni_dir, args.image, args.helm, args.chart, args.runc)
        try:
            state = node.switch(tools, mode, args.driver_image)
        except (NodeError, lc.ClusterError) as e:
            print(f"node-up failed: {e}\nlogs: {node.layout.logs}", file=sys.stderr)
            return 1
    print(f"KUBECONFIG={state['kubeconfig']}")
    print(f"NODE={state['node']}")
    if len(state["nodes"]) > 1:
        print("NODES=" + ",".join(n["name"] for n in state["nodes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
