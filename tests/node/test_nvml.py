"""The production backend on the real node: the agent runs ``--backend nvml`` against the
stand-in NVIDIA driver root (libnvidia-ml, nvidia-smi, nvidia-cuda-mps-control built from
tests/fakenvml), as the chart deploys it on a GPU node.

The module switches the node's chart to the NVML backend (``helm upgrade``) and back at its
end. What the agent did to the "hardware" is read from the stand-in's state on the host; what
each container saw, from its pod log; faults are injected by writing the stand-in's files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.gpu.sharing import procs
from tests.node.probe import BUSYBOX, PROBE, Node, wait_until
from tests.node.standin import StandIn, mps_daemons

pytestmark = pytest.mark.node

RECHECK_SECONDS = 4
DRIVER = "gpu.dra.dev"


@pytest.fixture(scope="module")
def simulated_devices(node: Node) -> dict[tuple[str, str], dict[str, Any]]:
    """The devices the simulated backend publishes for the node's profile."""
    node.switch_chart("simulated")
    return node.published_devices()


@pytest.fixture(scope="module")
def standin(node: Node, simulated_devices: object) -> Iterator[StandIn]:
    node.switch_chart("nvml", "--set", f"features.healthRecheckInterval={RECHECK_SECONDS}")
    yield StandIn(node.base / "nvml")
    node.switch_chart("simulated")


@pytest.fixture(scope="module")
def dynamic_mig(node: Node, standin: StandIn) -> Iterator[None]:
    """Dynamic MIG on for the rest of the module (off before the backend switches back)."""
    node.upgrade_driver("features.dynamicMig=true")
    wait_until(lambda: any("-mig-4g40gb-" in d for _, d in node.published_devices()), "placements")
    yield
    node.upgrade_driver("features.dynamicMig=false")


def plugin_dir(node: Node) -> Path:
    return node.base / "kubelet" / "plugins" / DRIVER


# -- discovery -------------------------------------------------------------------------


def test_nvml_slices_match_the_simulated_profile(
    node: Node, standin: StandIn, simulated_devices: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """The stand-in was rendered from the profile the simulated backend serves: discovery
    through libnvidia-ml publishes the very same devices, attribute for attribute."""
    published = node.published_devices()
    assert sorted(published) == sorted(simulated_devices)
    for key, attributes in simulated_devices.items():
        assert published[key] == attributes, key
    # And they are the stand-in's GPUs: whole GPUs not in MIG mode, MIG devices of the rest.
    uuids = {next(iter(a["uuid"].values())) for a in published.values()}
    gpus = standin.gpus().values()
    assert uuids == {g.uuid for g in gpus if not g.mig_mode} | standin.mig_devices()


def test_whole_gpu_and_static_mig(node: Node, standin: StandIn, namespace: str) -> None:
    (gpu_pod,) = node.apply_example("single-gpu", namespace)
    (mig_pod,) = node.apply_example("mig-1g10gb", namespace)
    for pod in (gpu_pod, mig_pod):
        seen = node.seen(namespace, pod)
        (dev,) = node.allocated(namespace, pod)
        assert seen.visible_devices() == {dev.attr("uuid")}, seen.log
    (mig,) = node.allocated(namespace, mig_pod)
    assert mig.attr("uuid") in standin.mig_devices()


# -- sharing ---------------------------------------------------------------------------


def test_time_slicing_sets_and_restores_the_gpu_policy(
    node: Node, standin: StandIn, namespace: str
) -> None:
    (pod,) = node.apply_example("time-slicing", namespace)
    node.seen(namespace, pod, "trainer")
    (dev,) = node.allocated(namespace, pod)
    uuid = dev.attr("uuid")
    assert standin.gpus()[uuid].timeslice == 3  # Long, through nvidia-smi compute-policy
    node.delete_pod(namespace, pod)
    wait_until(lambda: standin.gpus()[uuid].timeslice == 0, "the default time-slice back")


def _mps_probe(pod: dict[str, Any]) -> None:
    """The probe, after writing /dev/shm; client-b runs as uid 1000."""
    spec = pod["spec"]
    spec["terminationGracePeriodSeconds"] = 2
    for c in spec["containers"]:
        c.update(image=BUSYBOX, imagePullPolicy="Never")
        c["command"] = [
            "sh",
            "-c",
            'touch "/dev/shm/probe-$(id -u)" && echo "SHM-WRITABLE uid=$(id -u)"; ' + PROBE,
        ]
        c.pop("args", None)
        if c["name"] == "client-b":
            c["securityContext"] = {"runAsUser": 1000, "runAsGroup": 1000}


def _restart_agent(node: Node, how: str) -> None:
    (old_pod,) = node.driver_pods()
    old = old_pod.metadata.uid
    if how == "delete":
        node.core.delete_namespaced_pod(old_pod.metadata.name, "dra-driver")
    else:
        node.upgrade_driver(f"podAnnotations.dra-test/rollout={how}")

    def replaced() -> bool:
        pods = node.driver_pods()
        return len(pods) == 1 and pods[0].metadata.uid != old

    wait_until(replaced, f"a new agent pod ({how})")
    node.wait_published_by(node.driver_pods()[0].metadata.uid)


def test_mps_daemon_lives_on_the_host_and_outlives_the_agent(
    node: Node, standin: StandIn, namespace: str
) -> None:
    (pod,) = node.apply_example("mps", namespace, probe=_mps_probe)
    for container, uid in (("client-a", 0), ("client-b", 1000)):
        seen = node.seen(namespace, pod, container)
        assert seen.env.get("CUDA_MPS_PIPE_DIRECTORY") == "/tmp/nvidia-mps", seen.log
        assert f"SHM-WRITABLE uid={uid}" in seen.log, seen.log
        shm = [m.split() for m in seen.mounts if m.split()[1:2] == ["/dev/shm"]]
        assert shm and shm[-1][2] == "tmpfs", seen.log

    (claim,) = node.claim_uids(namespace, pod)
    base = plugin_dir(node) / "mps" / claim
    (daemon,) = mps_daemons(base / "pipe")
    servers = [p for p in procs.pids() if procs.parent(p) == daemon.pid]
    assert [Path(procs.exe(p) or "").name for p in servers] == ["nvidia-cuda-mps-server"]
    # The daemon got the claim's limits through its control pipe.
    control_log = (base / "log" / "control.log").read_text()
    assert "set_default_active_thread_percentage 50" in control_log

    # A pod's forged pid file, the agent's pod deleted, then a helm upgrade: the same daemon
    # serves on, and no second one is started.
    pid_file = base / "pipe" / "nvidia-cuda-mps-control.pid"
    pid_file.write_text("1\n")
    _restart_agent(node, "delete")
    assert procs.is_alive(daemon) and mps_daemons(base / "pipe") == [daemon]
    pid_file.unlink(missing_ok=True)
    _restart_agent(node, "upgrade")
    assert procs.is_alive(daemon) and mps_daemons(base / "pipe") == [daemon]

    # Unprepare stops it (quit through its pipe), with its server and its shm tmpfs.
    node.delete_pod(namespace, pod)
    wait_until(lambda: not procs.is_alive(daemon), "the MPS daemon to stop")
    assert not any(procs.is_alive(s) for s in map(procs.identify, servers) if s)
    assert not mps_daemons(base / "pipe")
    assert str(base / "shm") not in Path("/proc/self/mounts").read_text()


# -- health ----------------------------------------------------------------------------


def _tainted(node: Node, device: str, key: str) -> bool:
    return any(t.startswith(key) for t in node.device_taints().get(device, []))


def test_xid_taints_within_seconds_and_a_recheck_untaints(node: Node, standin: StandIn) -> None:
    gpu = standin.by_minor(3)
    standin.inject(f"{gpu.uuid} xid 79")
    wait_until(lambda: _tainted(node, "gpu-3", "gpu.dra.dev/xid=79"), "the Xid taint", 20)
    # The GPU answers NVML again and has nothing pending: the next re-check untaints it.
    wait_until(lambda: not node.device_taints()["gpu-3"], "the re-check to untaint", 30)


def test_a_lost_gpu_is_tainted_and_the_others_still_watched(node: Node, standin: StandIn) -> None:
    lost, other = standin.by_minor(2), standin.by_minor(3)
    try:
        standin.set_health({lost.uuid: "lost"})
        standin.inject("lost")
        wait_until(lambda: _tainted(node, "gpu-2", "gpu.dra.dev/gpu-lost"), "the lost taint", 20)
        assert not node.device_taints()["gpu-3"]
        # The watcher goes on: an Xid on another GPU is still seen.
        standin.inject(f"{other.uuid} xid 79")
        wait_until(lambda: _tainted(node, "gpu-3", "gpu.dra.dev/xid=79"), "the later Xid", 20)
        assert _tainted(node, "gpu-2", "gpu.dra.dev/gpu-lost")
    finally:
        standin.set_health({})
    wait_until(lambda: not node.device_taints()["gpu-2"], "the lost GPU untainted", 30)


def test_a_health_watch_that_cannot_start_fails_liveness(node: Node, standin: StandIn) -> None:
    """NVML's event waits fail and it makes no event set any more: the watcher gives up on
    its set, its health loop fails at every start, stops beating, and the liveness probe
    makes the kubelet restart the agent."""
    (pod,) = node.driver_pods()
    before = pod.status.container_statuses[0].restart_count
    try:
        standin.fail("nvmlEventSetWait_v2", "nvmlEventSetCreate")

        def restarted() -> bool:
            (now,) = node.driver_pods()
            return bool(now.status.container_statuses[0].restart_count > before)

        wait_until(restarted, "the kubelet to restart the agent", 240)
        events = node.core.list_namespaced_event(
            "dra-driver", field_selector=f"involvedObject.name={pod.metadata.name}"
        )
        messages = [e.message for e in events.items if e.reason == "Unhealthy"]
        assert any("Liveness probe failed" in m and "NOT_SERVING" in m for m in messages), messages
        # The restarted container's predecessor said why, one event per line.
        previous = node.core.read_namespaced_pod_log(pod.metadata.name, "dra-driver", previous=True)
        crashes = [
            json.loads(line)
            for line in previous.splitlines()
            if '"background loop crashed"' in line
        ]
        assert crashes and all(c["loop"] == "health" for c in crashes), previous[-2000:]
        assert "no NVML event set" in crashes[-1]["error"], crashes[-1]
    finally:
        standin.fail()
    node.wait_published_by(node.driver_pods()[0].metadata.uid)


# -- dynamic MIG and reboots -------------------------------------------------------------


def test_dynamic_mig_carves_and_destroys_in_the_driver(
    node: Node, standin: StandIn, dynamic_mig: None, namespace: str
) -> None:
    before = standin.mig_devices()
    pods = node.apply_example("dynamic-mig", namespace)
    carved = set()
    for pod in pods:
        (visible,) = node.seen(namespace, pod).visible_devices()
        assert visible in standin.mig_devices() - before
        carved.add(visible)
    assert len(carved) == len(pods)
    for pod in pods:
        node.delete_pod(namespace, pod)
    wait_until(lambda: standin.mig_devices() == before, "the MIG devices destroyed")


def test_reboot_prepares_claims_again(
    node: Node, standin: StandIn, dynamic_mig: None, namespace: str
) -> None:
    """After a reboot the pods the kubelet restarts get their claims prepared afresh: new
    CDI specs, MIG devices carved again, MPS daemons started again; nothing stale."""
    (mig_pod, *_) = node.apply_example("dynamic-mig", namespace)
    (mps_pod,) = node.apply_example("mps", namespace)
    (old_mig,) = node.seen(namespace, mig_pod).visible_devices()
    node.seen(namespace, mps_pod, "client-a")
    (mps_claim,) = node.claim_uids(namespace, mps_pod)
    pipe = plugin_dir(node) / "mps" / mps_claim / "pipe"
    (old_daemon,) = mps_daemons(pipe)
    ids = {p: node.container_ids(namespace, p) for p in (mig_pod, mps_pod)}

    node.reboot()
    assert old_mig not in standin.mig_devices() and not procs.is_alive(old_daemon)

    def restarted(pod: str) -> bool:
        now = node.container_ids(namespace, pod)
        return all(now.get(c) not in (None, old) for c, old in ids[pod].items())

    for pod in (mig_pod, mps_pod):
        wait_until(lambda pod=pod: restarted(pod), f"{pod} restarted after the reboot")
    (new_mig,) = node.seen(namespace, mig_pod).visible_devices()
    assert new_mig != old_mig and new_mig in standin.mig_devices()
    assert node.seen(namespace, mps_pod, "client-a").env.get("CUDA_MPS_PIPE_DIRECTORY")
    (new_daemon,) = mps_daemons(pipe)
    assert new_daemon != old_daemon
    claims = [*node.claim_uids(namespace, mig_pod), mps_claim]
    assert len(node.cdi_specs_for(claims)) == len(claims)
