"""A local Kubernetes control plane for tests and the demo.

`LocalCluster` runs the binaries of the ``testenv`` Go module (``make testenv``) as
subprocesses on loopback: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager, plus one ``kubelet-dra`` process per node (the kubelet's
own DRA manager and plugin watcher, without containers). It knows nothing about
GPUs. Everything lives in one base directory::

    <base>/pki/            service-account keys, CA, serving certificate
    <base>/etcd/           etcd data
    <base>/logs/<name>.log one log per component
    <base>/kubeconfig      admin kubeconfig (static token in system:masters)
    <base>/nodes/<name>/   kubelet root dir of a node: plugins_registry/, plugins/,
                           cdi/, pods/<namespace>_<name>.json records, health.json

Command line (used by ``make cluster`` / ``make cluster-down``)::

    python -m devenv.localcluster up [--node NAME[:k=v,...]]...
    python -m devenv.localcluster down
    python -m devenv.localcluster status
"""

from devenv.localcluster.cli import save_state
from devenv.localcluster.cluster import LocalCluster
from devenv.localcluster.flags import (
    DEFAULT_CONTROLLERS,
    apiserver_flags,
    controller_manager_flags,
    etcd_flags,
    kubelet_flags,
    parse_node_spec,
    render_kubeconfig,
    scheduler_flags,
    token_auth_line,
)
from devenv.localcluster.nodes import NodeHandle
from devenv.localcluster.processes import (
    ClusterError,
    ManagedProcess,
    Ports,
    binary_path,
    pick_free_ports,
    repo_root,
    tail,
    wait_for,
)

__all__ = [
    "DEFAULT_CONTROLLERS",
    "ClusterError",
    "LocalCluster",
    "ManagedProcess",
    "NodeHandle",
    "Ports",
    "apiserver_flags",
    "binary_path",
    "controller_manager_flags",
    "etcd_flags",
    "kubelet_flags",
    "parse_node_spec",
    "pick_free_ports",
    "render_kubeconfig",
    "repo_root",
    "save_state",
    "scheduler_flags",
    "tail",
    "token_auth_line",
    "wait_for",
]
