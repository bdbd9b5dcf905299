"""A simulated GPU node on a local control plane: kubelet-dra plus this driver's node agent.

Used by the demo and the end-to-end tests; knows only the CLI of the driver, so it runs the
node agent exactly as a DaemonSet would (a separate process configured by flags).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devenv.localcluster import LocalCluster, ManagedProcess, NodeHandle

GPU_NODE_LABEL = "nvidia.com/gpu.present"


@dataclass
class GpuNode:
    """A node whose GPUs come from a simulated profile."""

    node: NodeHandle
    driver: ManagedProcess
    profile: str
    driver_name: str

    @property
    def name(self) -> str:
        """The node name (also the pool name)."""
        return self.node.name


def driver_argv(
    cluster: LocalCluster,
    node: NodeHandle,
    profile: str,
    driver_name: str,
    extra: Sequence[str] = (),
    cdi_root: Path | None = None,
) -> list[str]:
    """The ``dra-driver run`` command line for a simulated node (CDI specs in the node's
    directory unless ``cdi_root`` names another)."""
    return [
        sys.executable,
        "-m",
        "dra_driver.cli",
        "run",
        "--backend=simulated",
        f"--profile={profile}",
        f"--node-name={node.name}",
        f"--driver-name={driver_name}",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--registry-dir={node.registry_dir}",
        f"--plugins-dir={node.plugins_dir}",
        f"--cdi-root={cdi_root or node.cdi_dir}",
        "--log-format=json",
        # Several agents share this machine: ports are opt-in (pass them in ``extra``).
        "--metrics-port=0",
        "--health-port=0",
        *extra,
    ]


def start_driver(
    cluster: LocalCluster,
    node: NodeHandle,
    profile: str,
    *,
    driver_name: str = "gpu.dra.dev",
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> ManagedProcess:
    """Start (or restart) the node agent for ``node``; logs go to the cluster's log dir."""
    return cluster.spawn(
        f"driver-{node.name}",
        driver_argv(cluster, node, profile, driver_name, extra),
        dict(env or {}),
    )


def start_gpu_node(
    cluster: LocalCluster,
    name: str,
    profile: str,
    *,
    driver_name: str = "gpu.dra.dev",
    labels: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> GpuNode:
    """Start kubelet-dra for ``name`` (waits until Ready) and the driver beside it."""
    node = cluster.add_node(name, {GPU_NODE_LABEL: "true", **(labels or {})})
    driver = start_driver(cluster, node, profile, driver_name=driver_name, extra=extra, env=env)
    return GpuNode(node=node, driver=driver, profile=profile, driver_name=driver_name)
