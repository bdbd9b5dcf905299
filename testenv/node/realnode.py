"""A real Kubernetes node on this machine, for the real-node test tier (``make node-up``).

The local control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager),
then one node made of the real components: containerd (CRI, CDI specs read from the
driver's CDI directory) running containers with runc, CNI bridge networking on a private
pod network, and the upstream kubelet (``testenv kubelet``). Images come from local OCI
archives. The driver is installed with its Helm chart and runs as a DaemonSet pod.

    python realnode.py up --bin-dir B --cni-dir C --images I --helm H --chart DIR
    python realnode.py down
    python realnode.py status
    python realnode.py restart kubelet|containerd

Everything lives in one directory (``--base``, default /var/lib/dra-node; short, because
the kubelet plugins' unix socket paths must stay under 108 bytes) and one cgroup
(`CGROUP_PARENT`), so that ``down`` can remove all of it. Needs root.

The pods reach the API server through the ``kubernetes`` Service's ClusterIP, as
in-cluster clients do. There is no kube-proxy: one DNAT rule sends that address to the
API server on 127.0.0.1 (which is why the bridge accepts routing to loopback).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The local control plane. Its module is the only import of it here.
from devenv import localcluster as lc
from devenv.localcluster.cluster import stop_rank
from devenv.localcluster.processes import pid_alive

DEFAULT_BASE = Path("/var/lib/dra-node")
NODE_NAME = "dra-node-0"
BRIDGE = "dranode0"
POD_SUBNET = "10.89.0.0/24"
POD_GATEWAY = "10.89.0.1"
API_SERVICE_IP = "10.0.0.1"
CGROUP_PARENT = "dra-node"
CGROUP_ROOT = Path("/sys/fs/cgroup")
DRIVER_IMAGE = "localhost/dra-driver:dev"
DRIVER_NAMESPACE = "dra-driver"
IPTABLES_COMMENT = "dra-node: kubernetes service to the local API server"
STATE_FILE = "node-state.json"
#: Labels of the node: the chart's DaemonSet runs only on nodes with GPUs.
NODE_LABELS = {"nvidia.com/gpu.present": "true"}
START_TIMEOUT = 180.0


class NodeError(RuntimeError):
    """A node component failed to start or a wait timed out."""


@dataclass(frozen=True)
class Layout:
    """Where each component of the node keeps its files."""

    base: Path

    @property
    def cluster(self) -> Path:
        return self.base / "cluster"

    @property
    def containerd(self) -> Path:
        return self.base / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def kubelet(self) -> Path:
        return self.base / "kubelet"

    @property
    def cdi(self) -> Path:
        return self.base / "cdi"

    @property
    def cni_conf(self) -> Path:
        return self.base / "cni" / "net.d"

    @property
    def cni_state(self) -> Path:
        return self.base / "cni" / "state"

    @property
    def pod_logs(self) -> Path:
        return self.base / "pod-logs"

    @property
    def driver_root(self) -> Path:
        return self.base / "driver-root"

    @property
    def state(self) -> Path:
        return self.base / STATE_FILE

    @property
    def logs(self) -> Path:
        return self.cluster / "logs"


# --------------------------------------------------------------------------------------
# Configuration files (pure)
# --------------------------------------------------------------------------------------


def containerd_config(
    layout: Layout, *, snapshotter: str, cni_bin: Path, runc: Path, sandbox_image: str
) -> str:
    """containerd's config.toml (version 3): private dirs and socket, CRI with CDI."""
    return f"""version = 3
root = "{layout.containerd / "root"}"
state = "{layout.containerd / "state"}"

[grpc]
  address = "{layout.containerd_socket}"

[ttrpc]
  address = "{layout.containerd_socket}.ttrpc"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "{snapshotter}"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox_image}"

[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = ["{layout.cdi}"]
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower a container's oom_score_adj
  # (the kubelet asks -998 for critical pods) below containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      snapshotter = "{snapshotter}"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{layout.containerd / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{layout.cni_conf}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_config(layout: Layout) -> dict[str, Any]:
    """A CNI network list: a bridge with host-local addresses, loopback, port mapping."""
    return {
        "cniVersion": "1.0.0",
        "name": "dra-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                # Pods talk to the host only; nothing leaves the machine.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.cni_state),
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    layout: Layout, *, port: int, healthz_port: int, pki: Path, feature_gates: str
) -> dict[str, Any]:
    """The KubeletConfiguration of the node.

    cgroupfs on the machine's cgroup v1 hierarchies (hence failCgroupV1: false), no swap
    check, the serving key pair of `testenv keys`. The kubelet listens on the pod bridge's
    gateway address, the node's address (the kubelet refuses a loopback one), which only
    this machine reaches. The API server has no kubelet client certificate, so the kubelet
    lets anonymous requests read logs.
    """
    gates = dict(item.split("=", 1) for item in feature_gates.split(",") if item)
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_PARENT}",
        "failSwapOn": False,
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": POD_GATEWAY,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(pki / "apiserver.crt"),
        "tlsPrivateKeyFile": str(pki / "apiserver.key"),
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(layout.pod_logs),
        "featureGates": {k: v == "true" for k, v in gates.items()},
        "serializeImagePulls": False,
        # A shared build machine: evict nothing because of its disk or memory use.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusReportFrequency": "10s",
    }


# --------------------------------------------------------------------------------------
# Host setup and teardown
# --------------------------------------------------------------------------------------


def run(*argv: str | Path, check: bool = True, timeout: float = 300) -> str:
    """Run a command; its stdout, or NodeError with its stderr."""
    out = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and out.returncode != 0:
        cmd = " ".join(str(a) for a in argv)
        raise NodeError(f"{cmd}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
    return out.stdout


def overlay_works(scratch: Path) -> bool:
    """Whether an overlay filesystem can be mounted with its layers on `scratch`."""
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        dirs = {n: Path(tmp) / n for n in ("lower", "upper", "work", "merged")}
        for d in dirs.values():
            d.mkdir()
        opts = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
        mounted = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", opts, str(dirs["merged"])],
            capture_output=True,
            check=False,
        )
        if mounted.returncode != 0:
            return False
        run("umount", dirs["merged"])
    return True


def shared_mount(path: Path) -> None:
    """Make `path` a shared mount point of its own.

    The chart mounts the driver root with HostToContainer propagation, which needs a
    shared or slave source; this machine's / is private ("path "/" is mounted on "/" but
    it is not a shared or slave mount"). The simulated backend reads nothing from it.
    """
    path.mkdir(parents=True, exist_ok=True)
    run("mount", "--bind", path, path)
    run("mount", "--make-rshared", path)


def cgroup_hierarchies(*, unified: bool = False) -> list[Path]:
    """The mounted cgroup v1 hierarchies (the kubelet runs its pods under each), and the
    hybrid v2 one (runc makes the pods' cgroups there too) if `unified`."""
    return sorted(
        p
        for p in CGROUP_ROOT.iterdir()
        if p.is_dir() and (unified or p.name != "unified") and (p / "cgroup.procs").exists()
    )


def cgroup_pids() -> set[int]:
    """Every process in `CGROUP_PARENT`: the node's containers, whatever their parent."""
    pids: set[int] = set()
    for h in cgroup_hierarchies(unified=True):
        for procs in (h / CGROUP_PARENT).rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def kill_containers(timeout: float = 10.0) -> None:
    """SIGKILL the node's container processes; killing their shims does not stop them."""
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def create_cgroup_parent() -> None:
    """Create `CGROUP_PARENT` in every hierarchy; cpuset needs its CPUs and memory nodes."""
    for h in cgroup_hierarchies():
        d = h / CGROUP_PARENT
        d.mkdir(exist_ok=True)
        if h.name == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((h / f).read_text())


def remove_cgroup_parent() -> None:
    """Remove `CGROUP_PARENT` and everything under it, deepest first."""
    for h in cgroup_hierarchies(unified=True):
        top = h / CGROUP_PARENT
        if not top.exists():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def mounts_under(*roots: Path) -> list[Path]:
    """Mount points at or below `roots`, deepest first (the order to unmount them)."""
    found: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].replace("\\040", " "))
        if any(point == r or r in point.parents for r in roots):
            found.append(point)
    return sorted(set(found), key=lambda p: -len(p.parts))


def unmount_all(*roots: Path) -> None:
    for point in mounts_under(*roots):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def iptables_rule(api_port: int) -> list[str]:
    """The nat rule that stands in for kube-proxy for the one Service pods need."""
    return [
        "PREROUTING",
        "-i",
        BRIDGE,
        "-d",
        API_SERVICE_IP,
        "-p",
        "tcp",
        "--dport",
        "443",
        "-m",
        "comment",
        "--comment",
        IPTABLES_COMMENT,
        "-j",
        "DNAT",
        "--to-destination",
        f"127.0.0.1:{api_port}",
    ]


def setup_network(api_port: int) -> None:
    """The pod bridge with the node's address, routing from it to loopback, and the API
    server's Service address."""
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
        run("ip", "link", "add", BRIDGE, "type", "bridge")
    prefix = POD_SUBNET.split("/")[1]
    run("ip", "addr", "replace", f"{POD_GATEWAY}/{prefix}", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1")
    remove_iptables_rules()
    run("iptables", "-t", "nat", "-A", *iptables_rule(api_port))


def remove_iptables_rules() -> None:
    """Delete our DNAT rule and the chains the CNI plugins made for our network."""
    saved = run("iptables-save", "-t", "nat", check=False)
    for line in saved.splitlines():
        if line.startswith("-A ") and IPTABLES_COMMENT in line:
            args = line[3:].replace(f'"{IPTABLES_COMMENT}"', "COMMENT").split()
            args = [IPTABLES_COMMENT if a == "COMMENT" else a for a in args]
            run("iptables", "-t", "nat", "-D", *args, check=False)


def remove_network() -> None:
    remove_iptables_rules()
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)


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


def ctr(tools: Tools, layout: Layout, *args: str, timeout: float = 300) -> str:
    return run(
        tools.ctr, "--address", layout.containerd_socket, "-n", "k8s.io", *args, timeout=timeout
    )


class RealNode:
    """Bring the node up on top of a local control plane, or take it all down."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    # -- up ------------------------------------------------------------------------

    def up(self, tools: Tools, *, driver_image: str = DRIVER_IMAGE) -> dict[str, Any]:
        layout = self.layout
        if layout.base.exists():
            self.down()
        for d in (layout.cdi, layout.cni_conf, layout.cni_state, layout.kubelet, layout.pod_logs):
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
            shared_mount(layout.driver_root)
            create_cgroup_parent()
            self._start_containerd(cluster, tools)
            self._save(cluster)
            for archive in tools.images:
                ctr(tools, layout, "images", "import", "--no-unpack=false", str(archive))
            self._start_kubelet(cluster)
            self._save(cluster)
            self._install_chart(cluster, tools, driver_image)
        except BaseException:
            self._save(cluster)
            raise
        return self._save(cluster)

    def _start_containerd(self, cluster: lc.LocalCluster, tools: Tools) -> None:
        layout = self.layout
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
            )
        )
        (layout.cni_conf / "10-dra-node.conflist").write_text(
            json.dumps(cni_config(layout), indent=2)
        )
        env = {"PATH": f"{tools.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        proc = cluster.spawn(
            "containerd", [str(tools.bin_dir / "containerd"), "--config", str(config)], env
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
        print(f"containerd running (snapshotter {snapshotter})", flush=True)

    def _start_kubelet(self, cluster: lc.LocalCluster) -> None:
        layout = self.layout
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
                )
            )
        )
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        args = [
            "kubelet",
            f"--config={config}",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--root-dir={layout.kubelet}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={POD_GATEWAY}",
            f"--node-labels={labels}",
            "--v=2",
        ]
        binary = cluster.binary or lc.binary_path()
        proc = cluster.spawn("kubelet", [str(binary), *args])
        lc.wait_for(lambda: node_ready(cluster), START_TIMEOUT, f"node {NODE_NAME} Ready", proc)
        print(f"kubelet running, node {NODE_NAME} Ready", flush=True)

    def _install_chart(self, cluster: lc.LocalCluster, tools: Tools, image: str) -> None:
        layout = self.layout
        repo, tag = image.rsplit(":", 1)
        values = {
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
        values_file = layout.base / "chart-values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        run(
            tools.helm,
            "--kubeconfig",
            cluster.kubeconfig,
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
        )
        lc.wait_for(lambda: slices_published(cluster), START_TIMEOUT, "the driver's slices")
        print("driver installed with its chart; slices published", flush=True)

    def _save(self, cluster: lc.LocalCluster) -> dict[str, Any]:
        state = {
            "base": str(self.layout.base),
            "kubeconfig": str(cluster.kubeconfig),
            "node": NODE_NAME,
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
        procs = state.get("processes", {})
        needed = {"kube-apiserver", "containerd", "kubelet"}
        if needed <= procs.keys() and all(pid_alive(int(p)) for p in procs.values()):
            return state
        return None

    def restart(self, name: str) -> int:
        """Stop one process of the node (its process group) and start it again as before.

        Containers keep running: their shims are in sessions of their own.
        """
        state = self.running()
        if state is None:
            raise NodeError("no node running")
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
        kill_containers()
        kill_shims(layout)
        netns = sandbox_netns()
        unmount_all(layout.base, *netns)
        for ns in netns:
            with contextlib.suppress(OSError):
                ns.unlink()
        remove_network()
        remove_cgroup_parent()
        shutil.rmtree(layout.base, ignore_errors=True)


def kill_shims(layout: Layout) -> None:
    """Kill the container shims (and so the containers) of our containerd."""
    marker = str(layout.containerd_socket).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and marker in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(proc.name), signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
    time.sleep(0.5)
    remove_stale_shim_sockets()


def remove_stale_shim_sockets() -> None:
    """Remove shim sockets nobody listens on (containerd keeps them in a fixed place)."""
    sockets = Path("/run/containerd/s")
    for path in sockets.glob("*") if sockets.is_dir() else []:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(path))
            except ConnectionRefusedError:
                path.unlink(missing_ok=True)
            except OSError:
                continue
    for d in (sockets, sockets.parent):
        with contextlib.suppress(OSError):
            d.rmdir()


def sandbox_netns() -> list[Path]:
    """The network namespaces of our pods: those with an address on the pod network."""
    netns_dir = Path("/run/netns")
    prefix = POD_SUBNET.rsplit(".", 1)[0] + "."
    found = []
    for ns in sorted(netns_dir.glob("cni-*")) if netns_dir.is_dir() else []:
        addrs = run("ip", "-n", ns.name, "-br", "addr", check=False)
        if f" {prefix}" in addrs:
            found.append(ns)
    return found


# --------------------------------------------------------------------------------------
# API checks (through kubectl-free GETs of the local control plane)
# --------------------------------------------------------------------------------------


def _get_json(cluster: lc.LocalCluster, path: str) -> dict[str, Any] | None:
    status, body = cluster._apiserver_request(path)
    if status != 200:
        return None
    try:
        data: dict[str, Any] = json.loads(body)
    except ValueError:
        return None
    return data


def node_ready(cluster: lc.LocalCluster) -> bool:
    return cluster._node_ready(NODE_NAME)


def slices_published(cluster: lc.LocalCluster) -> bool:
    data = _get_json(cluster, "/apis/resource.k8s.io/v1/resourceslices")
    items = (data or {}).get("items", [])
    return any(s.get("spec", {}).get("nodeName") == NODE_NAME for s in items)


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
    sub.add_parser("down")
    sub.add_parser("status")
    restart = sub.add_parser("restart", help="restart the kubelet or containerd")
    restart.add_argument("component", choices=("kubelet", "containerd"))
    args = parser.parse_args(argv)
    require_root()
    node = RealNode(Layout(args.base.resolve()))
    if args.cmd == "down":
        node.down()
        print("node down; nothing left")
        return 0
    if args.cmd == "restart":
        print(f"{args.component} restarted: pid {node.restart(args.component)}")
        return 0
    state = node.running()
    if args.cmd == "status":
        print(json.dumps(state, indent=2) if state else "no node running")
        return 0 if state else 1
    if state is None:
        tools = Tools(args.bin_dir, args.cni_dir, args.image, args.helm, args.chart, args.runc)
        try:
            state = node.up(tools, driver_image=args.driver_image)
        except (NodeError, lc.ClusterError) as e:
            print(f"node-up failed: {e}\nlogs: {node.layout.logs}", file=sys.stderr)
            return 1
    print(f"KUBECONFIG={state['kubeconfig']}")
    print(f"NODE={state['node']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
