"""The NVML MIG backend against the stand-in libnvidia-ml.so.1 (tests/fakenvml).

Every step runs in a fresh Python process (the loader reads LD_LIBRARY_PATH at start), and
the stand-in library writes MIG changes back to its data file, so each step also checks
that the next process sees what the previous one did.
"""

from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from dra_driver.faults import EXIT_CODE
from dra_driver.gpu.discovery.simulated import build_inventory, load_profile
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.mig.nvml import NvmlMig
from dra_driver.gpu.publish.profiles import restrict_profiles
from tests.unit.gpu.discovery.test_nvml_backend import build, fake_split_layout, render

SINGLE_H100 = str(Path(__file__).parents[3] / "data" / "single-h100.yaml")

_STEP = """
import json, sys
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.mig.backend import MigError
from dra_driver.gpu.mig.nvml import NvmlMig
from dra_driver.gpu.publish.profiles import restrict_profiles
inventory = Inventory.model_validate_json(sys.argv[1])
gpu = inventory.gpus[0]
profiles = {p.name: p for p in gpu.mig_profiles}
mig = NvmlMig()
out = {}
try:
    for op, *args in json.loads(sys.argv[2]):
        if op == "enable":
            mig.set_mig_mode(gpu, True)
        elif op == "disable":
            mig.set_mig_mode(gpu, False)
        elif op == "create":
            out.setdefault("created", []).append(
                mig.create(gpu, profiles[args[0]], args[1]).model_dump(mode="json"))
        elif op == "destroy":
            mig.destroy(gpu, args[0])
    out["enabled"] = mig.mig_enabled(gpu)
    out["list"] = [
        {"gi": i.gpu_instance_id, "profile": i.profile_id, "start": i.placement.start,
         "uuid": i.device.uuid if i.device else None}
        for i in mig.list(gpu)
    ]
except MigError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def lib_dir() -> Path:
    try:
        library: Path = build.build_library()
    except build.CompilerMissing as exc:
        pytest.skip(str(exc))
    return library.parent


class Node:
    def __init__(self, tmp_path: Path, lib_dir: Path) -> None:
        self.inventory: Inventory = build_inventory(load_profile(SINGLE_H100), "n1")
        self.data = tmp_path / "nvml.data"
        self.data.write_text(render.render(self.inventory))
        self.lib_dir = lib_dir

    def run(self, *ops: list[Any], exit_code: int = 0, **env: str) -> dict[str, Any]:
        """Run ``ops`` in a fresh process; its answer, or {} when it is to exit otherwise
        (a fault point killed it)."""
        result = subprocess.run(
            [sys.executable, "-c", _STEP, self.inventory.model_dump_json(), json.dumps(ops)],
            env={
                "PATH": "/usr/bin:/bin",
                "LD_LIBRARY_PATH": str(self.lib_dir),
                "FAKE_NVML_DATA": str(self.data),
                **env,
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == exit_code, result.stderr
        if exit_code:
            return {}
        # Log lines go to stdout too; the answer is the last line.
        out: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
        return out


@pytest.fixture
def node(tmp_path: Path, lib_dir: Path) -> Node:
    return Node(tmp_path, lib_dir)


def test_create_list_destroy_across_processes(node: Node) -> None:
    assert node.run() == {"enabled": False, "list": []}
    out = node.run(["enable"], ["create", "4g.40gb", 0], ["create", "3g.40gb", 4])
    assert out["enabled"] is True
    four, three = out["created"]
    assert four["profile_name"] == "4g.40gb" and four["placement"] == {"start": 0, "size": 4}
    assert three["multiprocessors"] == 60 and three["uuid"].startswith("MIG-")
    assert four["uuid"] != three["uuid"]
    # A new process (a restarted driver) sees both, with their MIG devices.
    listed = node.run()["list"]
    assert [(i["profile"], i["start"], i["uuid"]) for i in listed] == [
        (5, 0, four["uuid"]),
        (9, 4, three["uuid"]),
    ]
    gi = listed[0]["gi"]
    assert node.run(["destroy", gi], ["destroy", gi])["list"] == listed[1:]  # idempotent
    assert node.run(["destroy", listed[1]["gi"]], ["disable"]) == {"enabled": False, "list": []}


def test_placement_rules(node: Node) -> None:
    assert "Not Supported" in node.run(["create", "1g.10gb", 0])["error"]  # MIG mode off
    node.run(["enable"], ["create", "3g.40gb", 0])
    assert "overlaps" in node.run(["create", "1g.10gb", 2])["error"]
    assert "cannot start at memory slice 1" in node.run(["create", "2g.20gb", 1])["error"]
    node.run(["create", "1g.10gb+me", 4])
    assert "allows 1 instance" in node.run(["create", "1g.10gb+me", 5])["error"]
    assert "in use" in node.run(["disable"])["error"].lower()


@pytest.mark.parametrize(
    "fail", ["nvmlGpuInstanceCreateComputeInstance", "nvmlComputeInstanceGetInfo_v2"]
)
def test_a_failed_create_destroys_only_the_gpu_instance_it_made(node: Node, fail: str) -> None:
    # The caller gets no GPU instance id from a failed create, so it cannot tell the GI
    # from another tool's at the same placement: the create must not leave it behind.
    other = node.run(["enable"], ["create", "3g.40gb", 4])["list"]
    out = node.run(["create", "2g.20gb", 2], FAKE_NVML_FAIL=fail)
    assert fail.removesuffix("_v2") in out["error"]
    assert node.run()["list"] == other


_INTERRUPTED_AFTER_THE_GPU_INSTANCE = """
from dra_driver import faults
def point(name):
    if name == "mig.gi-created":
        raise KeyboardInterrupt  # Ctrl-C, or the SIGTERM hw-check turns into one
faults.point = point
"""


def test_an_interrupted_create_destroys_the_gpu_instance_it_made(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.run(["enable"])
    interrupted = _INTERRUPTED_AFTER_THE_GPU_INSTANCE + _STEP
    monkeypatch.setattr(sys.modules[__name__], "_STEP", interrupted)
    node.run(["create", "2g.20gb", 2], exit_code=-signal.SIGINT)
    monkeypatch.undo()
    assert node.run()["list"] == []


def test_a_gpu_instance_without_compute_instance_is_listed(node: Node) -> None:
    # A crash between the two steps leaves the GI without its compute instance: it is
    # still listed, without a MIG device, so start-up recovery can destroy it.
    node.run(["enable"])
    node.run(["create", "2g.20gb", 2], exit_code=EXIT_CODE, DRA_FAULT_POINTS="mig.gi-created")
    listed = node.run()["list"]
    assert [(i["profile"], i["start"], i["uuid"]) for i in listed] == [(14, 2, None)]
    assert node.run(["destroy", listed[0]["gi"]])["list"] == []


def test_a_gpu_instance_split_into_compute_instances_is_listed_without_a_mig_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GI 1's two 1-slice compute instances are not MIG devices the driver publishes or
    # reuses (discovery skips them): GI 1 is listed once, its placement taken, no device.
    gpu = build_inventory(load_profile(SINGLE_H100), "n1").gpus[0]
    *_, whole = fake_split_layout(monkeypatch, gpu)
    listed = NvmlMig()._list(gpu, "gpu-0")
    assert [(i.gpu_instance_id, i.profile_id, i.placement.start) for i in listed] == [
        (1, 14, 2),
        (2, 9, 4),
    ]
    assert [i.device.uuid if i.device else None for i in listed] == [None, whole.uuid]


def test_gpu_instances_of_profiles_left_out_by_mig_profiles_are_listed(node: Node) -> None:
    # With --mig-profiles the agent's GPU lists only the chosen profiles, yet GIs of the
    # others (made by hand, or under an earlier --mig-profiles) still take their slices:
    # they must be listed so carving sees the overlap and recovery can sweep them.
    three = node.run(["enable"], ["create", "3g.40gb", 4])["list"]
    assert [(i["profile"], i["start"]) for i in three] == [(9, 4)]
    node.inventory = restrict_profiles(node.inventory, ["1g.10gb"])
    assert node.run()["list"] == three
    assert "overlaps" in node.run(["create", "1g.10gb", 4])["error"]


def test_destroy_removes_compute_instances_of_every_ci_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A CI an admin made with a profile the driver never uses for its own spanning CIs
    # (NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1, index 7) must be destroyed too: a GI
    # with a CI left answers IN_USE, and the GI could never be destroyed.
    rev1 = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1
    offered = {pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: [], rev1: [42]}
    destroyed: list[int] = []

    def profile_info(_gi: object, index: int, _engine: int) -> SimpleNamespace:
        if index not in offered:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=index)

    def compute_instances(_gi: object, profile_id: int, array: Any, count: Any) -> None:
        for i, ci in enumerate(offered[profile_id]):
            array[i] = ctypes.cast(ci, pynvml.c_nvmlComputeInstance_t)
        count._obj.value = len(offered[profile_id])

    def destroy_ci(ci: object) -> None:
        ci_id = ctypes.cast(ci, ctypes.c_void_p).value
        assert ci_id is not None
        destroyed.append(ci_id)

    def destroy_gi(_gi: object) -> None:
        if sorted(destroyed) != [42]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)

    for name, fn in {
        "nvmlGpuInstanceGetComputeInstanceProfileInfo": profile_info,
        "nvmlGpuInstanceGetComputeInstances": compute_instances,
        "nvmlComputeInstanceDestroy": destroy_ci,
        "nvmlGpuInstanceDestroy": destroy_gi,
    }.items():
        monkeypatch.setattr(pynvml, name, fn)
    NvmlMig()._destroy_gpu_instance("gi-1", "GPU 0 GPU instance 1")
    assert destroyed == [42]
