"""The real node's layout, names and configuration files (pure): containerd, CNI, kubelet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_BASE = Path("/var/lib/dra-node")
NODE_NAME = "dra-node-0"
BRIDGE = "dranode0"
POD_SUBNET = "10.89.0.0/24"
POD_GATEWAY = "10.89.0.1"
API_SERVICE_IP = "10.0.0.1"
CGROUP_PARENT = "dra-node"
# The driver's MPS control daemons leave the agent's container for cgroups of their own here
# (dra_driver/gpu/sharing/host.py), so they outlive it; a reboot or `down` kills them.
MPS_CGROUP_PARENT = "dra-driver-mps"
CGROUP_ROOT = Path("/sys/fs/cgroup")
DRIVER_IMAGE = "localhost/dra-driver:dev"
DRIVER_NAMESPACE = "dra-driver"
IPTABLES_COMMENT = "dra-node: kubernetes service to the local API server"
STATE_FILE = "node-state.json"
# A second node (and any further one, `make node-up NODES=2`) runs in network and mount
# namespaces of its own. Its network: a veth on the host's node bridge, an address on the
# node network, and a pod subnet of its own that the host routes to it. Node 0 stays in
# the host's namespaces, as with one node.
MAX_NODES = 8
NODE_BRIDGE = "dranodes"
NODE_NETWORK = "10.89.255.0/24"
HOST_NODE_IP = "10.89.255.1"  # the host (node 0) on the node network
NS_DIR = "ns"  # under the base directory: the bind mounts that keep the namespaces
#: Labels of the node: the chart's DaemonSet runs only on nodes with GPUs.
NODE_LABELS = {"nvidia.com/gpu.present": "true"}
START_TIMEOUT = 180.0


class NodeError(RuntimeError):
    """A node component failed to start or a wait timed out."""


def node_name(index: int) -> str:
    return f"dra-node-{index}"


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
    def nvml_state(self) -> Path:
        """The stand-in driver's mutable state (NVML data, injected events and health)."""
        return self.base / "nvml"

    @property
    def state(self) -> Path:
        return self.base / STATE_FILE

    @property
    def logs(self) -> Path:
        return self.cluster / "logs"


@dataclass(frozen=True)
class NodeSpec:
    """One node of the cluster: its name, addresses, directories and namespaces.

    Node 0 is the host itself, as with one node. Every other node keeps its files in
    ``<base>/n<index>`` (`own`) and runs its containerd and kubelet in a network namespace
    and a mount namespace of its own. In that mount namespace its kubelet, CDI, driver root
    and stand-in state directories are bind-mounted onto node 0's paths (`view`), so the
    chart's single set of host paths (kubeletPluginsDir, cdiRoot, driverRoot, the stand-in's
    state) means each node's own directories on each node.
    """

    base: Path
    index: int = 0

    @property
    def name(self) -> str:
        return node_name(self.index)

    @property
    def isolated(self) -> bool:
        """In namespaces of its own (every node but the first)."""
        return self.index > 0

    @property
    def own(self) -> Layout:
        """Where the node's files are on the host."""
        return Layout(self.base if self.index == 0 else self.base / f"n{self.index}")

    @property
    def view(self) -> Layout:
        """The paths the node's kubelet, containerd and pods use: the same on every node."""
        return Layout(self.base)

    @property
    def pod_subnet(self) -> str:
        return POD_SUBNET if self.index == 0 else f"10.89.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return POD_GATEWAY if self.index == 0 else f"10.89.{self.index}.1"

    @property
    def bridge(self) -> str:
        """The pod bridge (in the node's network namespace)."""
        return BRIDGE if self.index == 0 else f"dranode{self.index}"

    @property
    def node_ip(self) -> str:
        """The Node's InternalIP: the kubelet listens there and the API server dials it."""
        return POD_GATEWAY if self.index == 0 else f"10.89.255.{10 + self.index}"

    @property
    def cgroup_parent(self) -> str:
        return CGROUP_PARENT if self.index == 0 else f"{CGROUP_PARENT}-{self.index}"

    @property
    def veth(self) -> str:
        """The host's end of the node's link to the node bridge."""
        return f"dranode{self.index}v"

    @property
    def netns_file(self) -> Path:
        return self.base / NS_DIR / f"net-{self.index}"

    @property
    def mountns_file(self) -> Path:
        return self.base / NS_DIR / f"mnt-{self.index}"

    def enter(self) -> list[str]:
        """The command prefix that runs a program in the node's namespaces."""
        if not self.isolated:
            return []
        return ["nsenter", f"--net={self.netns_file}", f"--mount={self.mountns_file}", "--"]

    def process(self, component: str) -> str:
        """The name of the node's `component` (containerd, kubelet) in the state file."""
        return component if self.index == 0 else f"{component}-{self.index}"

    def bind_mounts(self) -> list[tuple[Path, Path]]:
        """(own directory, the path the chart mounts) for an isolated node."""
        own, view = self.own, self.view
        return [
            (own.kubelet, view.kubelet),
            (own.cdi, view.cdi),
            (own.driver_root, view.driver_root),
            (own.nvml_state, view.nvml_state),
        ]


# --------------------------------------------------------------------------------------
# Configuration files (pure)
# --------------------------------------------------------------------------------------


def containerd_config(
    layout: Layout,
    *,
    snapshotter: str,
    cni_bin: Path,
    runc: Path,
    sandbox_image: str,
    isolated: bool = False,
) -> str:
    """containerd's config.toml (version 3): private dirs and socket, CRI with CDI.

    `isolated`: a node in a mount namespace of its own. Its pods' network namespaces are
    mounted under its state directory (not /run/netns, where the host would see files it
    cannot enter), and NRI is off (its socket, /run/nri/nri.sock, is one per machine).
    """
    extra = ""
    if isolated:
        extra = """
[plugins."io.containerd.nri.v1.nri"]
  disable = true
"""
    netns = "\n  netns_mounts_under_state_dir = true" if isolated else ""
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
  restrict_oom_score_adj = true{netns}
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
{extra}"""


def cni_config(
    layout: Layout, *, bridge: str = BRIDGE, subnet: str = POD_SUBNET, gateway: str = POD_GATEWAY
) -> dict[str, Any]:
    """A CNI network list: a bridge with host-local addresses, loopback, port mapping."""
    return {
        "cniVersion": "1.0.0",
        "name": "dra-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                # Pods talk to the host only; nothing leaves the machine.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.cni_state),
                    "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    layout: Layout,
    *,
    port: int,
    healthz_port: int,
    pki: Path,
    feature_gates: str,
    address: str = POD_GATEWAY,
    cgroup_parent: str = CGROUP_PARENT,
) -> dict[str, Any]:
    """The KubeletConfiguration of the node.

    cgroupfs on the machine's cgroup v1 hierarchies (hence failCgroupV1: false), no swap
    check, the serving key pair of `testenv keys`. The kubelet listens on the pod bridge's
    gateway address, the node's address (the kubelet refuses a loopback one), which only
    this machine reaches (`address`: another node's own address on the node network). Each
    node's pods live under a cgroup of their own (`cgroup_parent`): a kubelet removes the pod
    cgroups it does not know under its root. The API server has no kubelet client
    certificate, so the kubelet lets anonymous requests read logs.
    """
    gates = dict(item.split("=", 1) for item in feature_gates.split(",") if item)
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup_parent}",
        "failSwapOn": False,
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": address,
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
