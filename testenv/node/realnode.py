"""A real Kubernetes node on this machine, for the real-node test tier (``make node-up``).

The local control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager),
then one node made of the real components: containerd (CRI, CDI specs read from the
driver's CDI directory) running containers with runc, CNI bridge networking on a private
pod network, and the upstream kubelet (``testenv kubelet``). Images come from local OCI
archives. The driver is installed with its Helm chart and runs as a DaemonSet pod.

    python realnode.py up --bin-dir B --cni-dir C --images I --helm H --chart DIR
                          [--backend simulated|nvml] [--helm-args "--set k=v ..."]
    python realnode.py chart --backend nvml [--helm-args ...]   (a running node, helm upgrade)
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
    create_cgroup_parent,
    kill_containers,
    kill_shims,
    overlay_works,
    remove_cgroup_parent,
    remove_network,
    run,
    sandbox_netns,
    setup_network,
    shared_mount,
    unmount_all,
)
from nodeconfig import (
    DEFAULT_BASE,
    DRIVER_IMAGE,
    DRIVER_NAMESPACE,
    MPS_CGROUP_PARENT,
    NODE_LABELS,
    NODE_NAME,
    POD_GATEWAY,
    START_TIMEOUT,
    Layout,
    NodeError,
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


def make_driver_root(path: Path, nvml_state: Path) -> None:
    """A stand-in NVIDIA driver installation in the node's driver root (tests/driverroot.py):
    the stand-in libnvidia-ml and tools, their mutable state in ``nvml_state``.

    The agent reads it at start (the chart's ``driverRoot``), so it is made before the chart
    is installed: every claim's CDI spec then mounts its libraries, tools, firmware and
    sockets, as on a GPU node, and tests/node/test_driver_files.py checks what a container
    sees. The NVML backend discovers the node's GPUs through it and runs its tools. Needs a
    C compiler (the libraries and tools are built from the project's sources).
    """
    made = subprocess.run(
        [sys.executable, "-m", "tests.driverroot", str(path), "--nvml", str(nvml_state)],
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

    # -- up ------------------------------------------------------------------------

    def up(
        self, tools: Tools, mode: ChartMode, *, driver_image: str = DRIVER_IMAGE
    ) -> dict[str, Any]:
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
            make_driver_root(layout.driver_root, layout.nvml_state)
            create_cgroup_parent()
            self._start_containerd(cluster, tools)
            self._save(cluster)
            for archive in tools.images:
                ctr(tools, layout, "images", "import", "--no-unpack=false", str(archive))
            self._start_kubelet(cluster)
            self._save(cluster)
            self._install_chart(cluster.kubeconfig, tools, driver_image, mode)
        except BaseException:
            self._save(cluster)
            raise
        return self._save(cluster, mode)

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
        lc.wait_for(lambda: slices_published(kubeconfig), START_TIMEOUT, "the driver's slices")
        print(f"driver installed with its chart ({mode}); slices published", flush=True)

    def switch(self, tools: Tools, mode: ChartMode, driver_image: str) -> dict[str, Any]:
        """Re-install the chart of a running node in another mode (helm upgrade): the node,
        its images and the control plane stay."""
        state = self.running()
        if state is None:
            raise NodeError("no node running")
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
        kill_containers(parent=MPS_CGROUP_PARENT)
        kill_shims(layout)
        netns = sandbox_netns()
        unmount_all(layout.base, *netns)
        for ns in netns:
            with contextlib.suppress(OSError):
                ns.unlink()
        remove_network()
        remove_cgroup_parent()
        remove_cgroup_parent(MPS_CGROUP_PARENT)
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


def node_ready(cluster: lc.LocalCluster) -> bool:
    return cluster._node_ready(NODE_NAME)


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


def slices_published(kubeconfig: Path) -> bool:
    """Whether the node's pool is published. After an upgrade, ``helm --wait`` has waited for
    the new agent to be started, which it is only once it published."""
    data = _admin_get(kubeconfig, "/apis/resource.k8s.io/v1/resourceslices")
    items = (data or {}).get("items", [])
    return any(s["spec"].get("nodeName") == NODE_NAME for s in items)


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
        print(f"{args.component} restarted: pid {node.restart(args.component)}")
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
        print(json.dumps(state, indent=2) if state else "no node running")
        return 0 if state else 1
    if state is None:
        tools = Tools(args.bin_dir, args.cni_dir, args.image, args.helm, args.chart, args.runc)
        try:
            state = node.up(tools, mode, driver_image=args.driver_image)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
