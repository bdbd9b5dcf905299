"""MPS client limits in a claim's CDI spec are keyed by the device ordinal the MPS client
sees: the device's position among the GPUs its control daemon serves (the daemon's
CUDA_VISIBLE_DEVICES), not its index among all of the claim's devices."""

from __future__ import annotations

from dra_driver.gpu.allocation import AllocatedDevice, Share
from dra_driver.gpu.container.claim_spec import build_claim_spec
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery

GIB = 2**30


def _env(devices: list[AllocatedDevice]) -> dict[str, str]:
    spec = build_claim_spec("uid", devices, mps_host_dir="/var/lib/mps/gpu-0/pipe").to_json()
    return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])


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
