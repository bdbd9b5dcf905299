"""MPS client limits in a claim's CDI spec are keyed by the device ordinal the MPS client
sees: the device's position among the GPUs its control daemon serves (the daemon's
CUDA_VISIBLE_DEVICES), not its index among all of the claim's devices."""

from __future__ import annotations

from typing import Any

from dra_driver.gpu.allocation import AllocatedDevice, Share
from dra_driver.gpu.config import GpuConfig
from dra_driver.gpu.container.claim_spec import build_claim_spec
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery

GIB = 2**30


def _env(devices: list[AllocatedDevice]) -> dict[str, str]:
    """The environment of a container given the claim's last device (an MPS client)."""
    spec = build_claim_spec("uid", devices, mps_host_dir="/var/lib/mps/gpu-0/pipe").to_json()
    env: dict[str, str] = _container_edits(spec, spec["devices"][-1]["name"])["env"]
    return env


def test_a_share_after_a_whole_gpu_is_limited_as_the_daemons_only_device() -> None:
    gpus = SimulatedDiscovery("dgx-h100", "n1").discover().gpus
    whole = AllocatedDevice(requests=("whole",), device_name="gpu-1", gpu=gpus[1])
    share = AllocatedDevice(
        requests=("gpu",), device_name="gpu-0", gpu=gpus[0], share=Share("s1", 10 * GIB)
    )
    # gpu-0's daemon serves gpu-0 alone: its clients see it as device 0.
    assert _env([whole, share])["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"


def test_two_shares_of_one_gpu_are_one_client_device_with_both_amounts() -> None:
    gpus = SimulatedDiscovery("dgx-h100", "n1").discover().gpus
    shares = [
        AllocatedDevice(
            requests=(f"r{i}",), device_name="gpu-0", gpu=gpus[0], share=Share(f"s{i}", 10 * GIB)
        )
        for i in range(2)
    ]
    assert _env(shares)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"


def _container_edits(spec: dict[str, Any], device: str) -> dict[str, Any]:
    """What a container given only ``device`` of the claim gets: the claim-wide edits, then
    the device's (the runtime replaces an env entry of the same name, and a mount at the
    same container path)."""
    env: dict[str, str] = {}
    mounts: dict[str, str] = {}
    for edits in [spec.get("containerEdits") or {}] + [
        d["containerEdits"] for d in spec["devices"] if d["name"] == device
    ]:
        env.update(e.split("=", 1) for e in edits.get("env", []))
        mounts.update((m["containerPath"], m["hostPath"]) for m in edits.get("mounts", []))
    return {"env": env, "mounts": mounts}


def test_a_container_of_the_claims_exclusive_gpu_alone_is_no_mps_client() -> None:
    """An MPS client sees only the GPUs its daemon serves: a container given only the
    claim's exclusive GPU must not be pointed at the daemon, or CUDA finds no GPU there."""
    gpus = SimulatedDiscovery("dgx-h100", "n1").discover().gpus
    mps = GpuConfig.model_validate(
        {
            "apiVersion": "gpu.dra.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30}},
        }
    )
    whole = AllocatedDevice(requests=("whole",), device_name="gpu-1", gpu=gpus[1])
    served = AllocatedDevice(requests=("mps",), device_name="gpu-0", gpu=gpus[0], config=mps)
    spec = build_claim_spec(
        "uid", [whole, served], mps_host_dir="/var/lib/mps/uid/pipe", mps_shm_dir="/shm"
    ).to_json()

    alone = _container_edits(spec, "uid-gpu-1")
    assert not [name for name in alone["env"] if name.startswith("CUDA_MPS_")], alone
    assert "/tmp/nvidia-mps" not in alone["mounts"] and "/dev/shm" not in alone["mounts"]
    assert alone["env"]["NVIDIA_VISIBLE_DEVICES"] == f"{gpus[1].uuid},{gpus[0].uuid}"

    client = _container_edits(spec, "uid-gpu-0")
    assert client["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert client["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert client["mounts"] == {"/tmp/nvidia-mps": "/var/lib/mps/uid/pipe", "/dev/shm": "/shm"}
