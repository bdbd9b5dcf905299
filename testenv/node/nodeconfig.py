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
    def nvml_state(self) -> Path:
        """The stand-in driver's mutable state (NVML data, injected events and health)."""
        return self.base / "nvml"

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
