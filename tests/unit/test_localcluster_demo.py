"""The demo's waits and its stop, with small stand-in processes (no control plane)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from devenv import demo
from devenv.localcluster import ClusterError, ManagedProcess, NodeHandle
from devenv.localcluster.processes import pid_alive
from devenv.simnode import GpuNode

ROOT = Path(__file__).resolve().parents[2]


def _gpu_node(tmp_path: Path, name: str, driver_code: str) -> GpuNode:
    kubelet = ManagedProcess(
        f"kubelet-{name}",
        [sys.executable, "-c", "import time; time.sleep(30)"],
        tmp_path / f"kubelet-{name}.log",
    )
    driver = ManagedProcess(
        f"driver-{name}", [sys.executable, "-c", driver_code], tmp_path / f"driver-{name}.log"
    )
    kubelet.start()
    driver.start()
    node = NodeHandle(name, tmp_path / name, {}, [tmp_path / name / "cdi"], kubelet)
    return GpuNode(node=node, driver=driver, profile="dgx-h100", driver_name="gpu.dra.dev")


def test_wait_for_slices_names_a_driver_that_exited(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No slice is ever published; the demo must say why instead of waiting out its deadline.
    monkeypatch.setattr(demo, "_raw", lambda *_, **__: {"items": []})
    monkeypatch.setattr(demo, "WAIT", 5.0)
    node = _gpu_node(
        tmp_path, "gpu-node-a", "print('cannot load the profile'); raise SystemExit(2)"
    )
    try:
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as exc:
            demo._wait_for_slices(object(), {node.name: node})
        assert time.monotonic() - t0 < 4
        assert "driver-gpu-node-a exited (code 2)" in str(exc.value)
        assert "cannot load the profile" in str(exc.value)
    finally:
        node.driver.stop(timeout=1)
        node.node.process.stop(timeout=1)


def test_wait_for_slices_timeout_names_the_silent_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    items: list[dict[str, Any]] = [{"spec": {"nodeName": "gpu-node-a", "devices": []}}]
    monkeypatch.setattr(demo, "_raw", lambda *_, **__: {"items": items})
    monkeypatch.setattr(demo, "WAIT", 0.5)
    code = "print('still looking for GPUs', flush=True); import time; time.sleep(30)"
    a = _gpu_node(tmp_path, "gpu-node-a", code)
    b = _gpu_node(tmp_path, "gpu-node-b", code)
    try:
        time.sleep(0.3)
        with pytest.raises(ClusterError) as exc:
            demo._wait_for_slices(object(), {a.name: a, b.name: b})
        msg = str(exc.value)
        assert "gpu-node-b" in msg and "gpu-node-a" not in msg
        assert "still looking for GPUs" in msg
    finally:
        for n in (a, b):
            n.driver.stop(timeout=1)
            n.node.process.stop(timeout=1)


_DEMO_UNDER_TERM = """
import sys, time, types
from pathlib import Path
from devenv import demo
from devenv.localcluster import ManagedProcess

class Cluster:
    def __init__(self, keep: bool = False) -> None:
        argv = [sys.executable, "-c", "import time; time.sleep(30)"]
        self.proc = ManagedProcess("etcd", argv, Path(sys.argv[1]))

    def __enter__(self) -> "Cluster":
        self.proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stop(timeout=1)

    @property
    def version(self) -> str:
        print(self.proc.pid, flush=True)
        time.sleep(30)  # the control plane is up; the demo is busy
        return "v1.0.0"

demo.LocalCluster = Cluster
demo._kubernetes = lambda: types.SimpleNamespace(client=None)
demo.run_demo()
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_demo_stops_the_cluster_when_terminated(tmp_path: Path, sig: int) -> None:
    # The components run in their own sessions: a terminal's hang-up or a `kill` reaches
    # only the demo, which must take them down with it.
    demo_proc = subprocess.Popen(
        [sys.executable, "-c", _DEMO_UNDER_TERM, str(tmp_path / "etcd.log")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    component = 0
    try:
        assert demo_proc.stdout is not None
        for line in demo_proc.stdout:
            if line.strip().isdigit():
                component = int(line)
                break
        assert component and pid_alive(component)
        demo_proc.send_signal(sig)
        assert demo_proc.wait(timeout=10) != 0
        deadline = time.monotonic() + 5
        while pid_alive(component) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(component), "the cluster's process outlived the demo"
    finally:
        demo_proc.kill()
        demo_proc.wait()
        if component and pid_alive(component):
            os.killpg(component, signal.SIGKILL)


def test_wait_for_service_account_fails_when_it_never_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the namespace's default ServiceAccount no pod can be created: the demo must
    # stop there and say why (was: it went on, and creating the pods failed with an API error).
    monkeypatch.setattr(demo, "_raw", lambda *_, **__: {"items": []})
    monkeypatch.setattr(demo, "WAIT", 0.5)
    with pytest.raises(ClusterError, match="no default ServiceAccount"):
        demo._wait_for_service_account(object())


def test_wait_for_pods_names_a_driver_that_exited(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The agent dies once the pods are created: their prepares can never succeed, so the
    # demo says so at once instead of waiting out its deadline and reporting pending pods.
    monkeypatch.setattr(demo, "WAIT", 5.0)
    monkeypatch.setattr(demo, "_pod_report", lambda _client, _nodes, name: demo.PodReport(name))
    node = _gpu_node(tmp_path, "gpu-node-a", "print('lost the socket'); raise SystemExit(3)")
    try:
        node.driver.popen.wait(timeout=10)  # type: ignore[union-attr]
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as exc:
            demo._wait_for_pods(object(), {node.name: node}, ["gpu-pod"])
        assert time.monotonic() - t0 < 4
        assert "driver-gpu-node-a exited (code 3) while the pods on node gpu-node-a" in str(
            exc.value
        )
        assert "lost the socket" in str(exc.value)
    finally:
        node.driver.stop(timeout=1)
        node.node.process.stop(timeout=1)
