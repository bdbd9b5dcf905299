"""The NVML discovery backend against the stand-in libnvidia-ml.so.1 (tests/fakenvml).

Each case renders a simulated node's inventory into the stand-in library's data file and a
fake sysfs tree, runs NVML discovery in a fresh Python process (the dynamic loader reads
LD_LIBRARY_PATH only at process start) and compares the result with the simulated backend.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
import structlog

from dra_driver.gpu.discovery.nvml import (
    NvmlDiscovery,
    cores_per_sm,
    cuda_version_string,
    mig_profile_name,
    normalize_bus_id,
    spans_gpu_instance,
)
from dra_driver.gpu.discovery.simulated import BUILTIN_PROFILES, build_inventory, load_profile
from dra_driver.gpu.inventory import MIB, Gpu, Inventory, MigState, Placement
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.resourceslice.pool import render_pool
from tests.fakenvml import build, render
from tests.unit.slice_rules import check_pool

NODE = "n1"
DRIVER = "gpu.dra.dev"
SINGLE_H100 = str(Path(__file__).parents[3] / "data" / "single-h100.yaml")

_DISCOVER = """
import sys
from dra_driver.gpu.discovery.base import DiscoveryError
from dra_driver.gpu.discovery.nvml import NvmlDiscovery
try:
    inventory = NvmlDiscovery().discover()
except DiscoveryError as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
print(inventory.model_dump_json())
"""


@pytest.fixture(scope="session")
def fake_lib_dir() -> Path:
    """Directory holding the stand-in libnvidia-ml.so.1, built on first use."""
    try:
        library: Path = build.build_library()
    except build.CompilerMissing as exc:
        pytest.skip(str(exc))
    return library.parent


@dataclass
class FakeNode:
    """A rendered node: what the simulated backend sees and what NVML should find."""

    inventory: Inventory
    data: Path
    sysfs: Path
    lib_dir: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "DRA_"))}
        env.update(
            LD_LIBRARY_PATH=str(self.lib_dir),
            FAKE_NVML_DATA=str(self.data),
            DRA_SYSFS_ROOT=str(self.sysfs),
        )
        env.update(extra)
        return env

    def python(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """``python ARGS`` against the stand-in library and this node's data."""
        return subprocess.run(
            [sys.executable, *args],
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def run(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return self.python("-c", _DISCOVER, **extra)

    def discover(self, **extra: str) -> Inventory:
        result = self.run(**extra)
        assert result.returncode == 0, result.stderr
        # Log lines go to stdout too; the inventory is the last line.
        return Inventory.model_validate_json(result.stdout.splitlines()[-1])

    def error(self, **extra: str) -> str:
        result = self.run(**extra)
        assert result.returncode == 3, (result.stdout, result.stderr)
        return result.stderr.strip()


def make_node(profile: str, tmp_path: Path, lib_dir: Path) -> FakeNode:
    inventory = build_inventory(load_profile(profile), NODE)
    data = tmp_path / "nvml.data"
    data.write_text(render.render(inventory))
    sysfs = tmp_path / "sys"
    render.render_sysfs(inventory, sysfs)
    return FakeNode(inventory, data, sysfs, lib_dir)


@pytest.fixture
def mixed(tmp_path: Path, fake_lib_dir: Path) -> FakeNode:
    return make_node("mixed", tmp_path, fake_lib_dir)


# -- NVML and simulated agree --------------------------------------------------------------


@pytest.mark.parametrize("profile", BUILTIN_PROFILES)
def test_nvml_inventory_equals_simulated(profile: str, tmp_path: Path, fake_lib_dir: Path) -> None:
    node = make_node(profile, tmp_path, fake_lib_dir)
    got = node.discover()
    assert got == node.inventory
    # Field for field, including order, as the JSON the CLI prints.
    assert got.model_dump_json() == node.inventory.model_dump_json()


def test_gpus_without_mig_are_not_capable(tmp_path: Path, fake_lib_dir: Path) -> None:
    got = make_node("l4x4", tmp_path, fake_lib_dir).discover()
    assert len(got.gpus) == 4
    for gpu in got.gpus:
        assert gpu.architecture == "Ada Lovelace"
        assert not gpu.mig.capable and not gpu.mig_enabled
        assert gpu.mig_profiles == () and gpu.mig_devices == ()


def test_mig_devices_and_placements(mixed: FakeNode) -> None:
    got = mixed.discover()
    a100, h100, h100_whole, l4 = got.gpus
    assert a100.mig_enabled and h100.mig_enabled
    assert [(d.gpu_instance_id, d.profile_name, d.placement) for d in a100.mig_devices] == [
        (1, "3g.40gb", Placement(start=0, size=4)),
        (2, "2g.20gb", Placement(start=4, size=2)),
        (3, "1g.10gb", Placement(start=6, size=1)),
    ]
    assert [(d.profile_id, d.placement.start) for d in h100.mig_devices] == [
        (5, 0),
        (19, 4),
        (19, 5),
    ]
    assert all(d.uuid.startswith("MIG-") for d in (*a100.mig_devices, *h100.mig_devices))
    # MIG-capable but off: profiles are listed, no devices.
    assert h100_whole.mig.capable and not h100_whole.mig_enabled
    assert h100_whole.mig_profiles and not h100_whole.mig_devices
    assert not l4.mig.capable
    # Profile names lose NVML's "MIG " prefix; the +me variant keeps its suffix.
    names = [p.name for p in a100.mig_profiles]
    assert "1g.10gb+me" in names and not any(n.startswith("MIG") for n in names)
    me = next(p for p in a100.mig_profiles if p.name == "1g.10gb+me")
    assert me.instance_count == 1 and len(me.placements) == 7


def test_pci_topology_from_sysfs(mixed: FakeNode) -> None:
    got = mixed.discover()
    assert [(g.pci_bus_id, g.pcie_root, g.numa_node) for g in got.gpus] == [
        ("0000:07:00.0", "pci0000:00", 0),
        ("0000:1b:00.0", "pci0000:15", 0),
        ("0000:43:00.0", "pci0000:15", 0),
        ("0000:81:00.0", "pci0000:80", 1),
    ]


def test_without_sysfs_entries_topology_is_unknown(mixed: FakeNode, tmp_path: Path) -> None:
    empty = tmp_path / "empty-sys"
    empty.mkdir()
    got = mixed.discover(DRA_SYSFS_ROOT=str(empty))
    assert all(g.pcie_root is None and g.numa_node is None for g in got.gpus)
    # Everything else is unaffected.
    strip = {"pcie_root": None, "numa_node": None}
    assert [g.model_copy(update=strip) for g in got.gpus] == [
        g.model_copy(update=strip) for g in mixed.inventory.gpus
    ]


# -- errors --------------------------------------------------------------------------------


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="a real libnvidia-ml is installed system-wide; it cannot be hidden",
)
def test_library_missing_is_one_clear_line(tmp_path: Path) -> None:
    empty = tmp_path / "lib"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "DRA_"))}
    env["LD_LIBRARY_PATH"] = str(empty)
    result = subprocess.run(
        [sys.executable, "-m", "dra_driver.cli", "discover", "--backend", "nvml"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "libnvidia-ml.so.1 not found" in lines[0]
    assert "--backend simulated" in lines[0]


def test_driver_not_loaded_names_the_alternative(mixed: FakeNode) -> None:
    message = mixed.error(FAKE_NVML_FAIL="nvmlInitWithFlags=9")
    assert "\n" not in message
    assert "Driver Not Loaded" in message and "--backend simulated" in message


@pytest.mark.parametrize(
    ("symbol", "call", "where"),
    [
        ("nvmlSystemGetDriverVersion", "nvmlSystemGetDriverVersion", "the system"),
        ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo", "GPU 0 (GPU-"),
        ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo", "GPU 0 (GPU-"),
        (
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            "MIG profile",
        ),
        ("nvmlDeviceGetAttributes_v2", "nvmlDeviceGetAttributes", "MIG device 0"),
        ("nvmlGpuInstanceGetInfo", "nvmlGpuInstanceGetInfo", "MIG device 0"),
    ],
)
def test_nvml_error_names_the_call(mixed: FakeNode, symbol: str, call: str, where: str) -> None:
    message = mixed.error(FAKE_NVML_FAIL=symbol)
    assert "\n" not in message
    assert f"NVML call {call} failed for" in message
    assert where in message
    assert message.endswith("Unknown Error")


def test_mig_mode_not_supported_means_not_capable(mixed: FakeNode) -> None:
    got = mixed.discover(FAKE_NVML_FAIL="nvmlDeviceGetMigMode=3")
    assert all(not g.mig.capable and not g.mig_profiles and not g.mig_devices for g in got.gpus)


def test_core_count_unavailable_leaves_sm_count_unknown(mixed: FakeNode) -> None:
    # 13 = NVML_ERROR_FUNCTION_NOT_FOUND, as from a driver that predates the call.
    got = mixed.discover(FAKE_NVML_FAIL="nvmlDeviceGetNumGpuCores=13")
    assert [g.multiprocessors for g in got.gpus] == [0, 0, 0, 0]


def test_memory_info_not_supported_leaves_memory_unknown(mixed: FakeNode) -> None:
    # 3 = NVML_ERROR_NOT_SUPPORTED: what unified-memory GPUs (NVIDIA GB10, DGX Spark) answer;
    # nvidia-smi shows "Memory-Usage: Not Supported". The rest of the node is unaffected.
    result = mixed.run(FAKE_NVML_FAIL="nvmlDeviceGetMemoryInfo=3")
    assert result.returncode == 0, result.stderr
    got = Inventory.model_validate_json(result.stdout.splitlines()[-1])
    unknown = {"memory_bytes": 0}
    assert list(got.gpus) == [g.model_copy(update=unknown) for g in mixed.inventory.gpus]
    warnings = [line for line in result.stdout.splitlines() if "no memory size" in line]
    assert [next(g.uuid for g in got.gpus if g.uuid in w) for w in warnings] == [
        g.uuid for g in got.gpus
    ]  # one warning per GPU, naming it
    # Its whole GPUs are still published, with memory 0: no memory selector matches them.
    slices = render_pool(build_catalog(got).pool(NODE, DRIVER))
    assert check_pool(slices) == []
    whole = {
        d["attributes"]["uuid"]["string"]: d["capacity"]["memory"]["value"]
        for sl in slices
        for d in sl["spec"]["devices"]
        if d["attributes"]["type"]["string"] == "gpu"
    }
    assert whole == {g.uuid: "0" for g in got.gpus if not g.mig_enabled}


def test_fake_rejects_a_wrong_profile_struct_version(mixed: FakeNode) -> None:
    # The stand-in checks the struct version pynvml stamps, so a layout mismatch between
    # it and pynvml cannot go unnoticed; this forces that path to prove it is wired up.
    message = mixed.error(FAKE_NVML_FAIL="nvmlDeviceGetGpuInstanceProfileInfoV=25")
    assert "nvmlDeviceGetGpuInstanceProfileInfo" in message


def test_each_discover_is_a_fresh_nvml_session(mixed: FakeNode) -> None:
    script = (
        "from dra_driver.gpu.discovery.nvml import NvmlDiscovery\n"
        "import pynvml, json\n"
        "d = NvmlDiscovery()\n"
        "a = d.discover(); b = d.discover()\n"
        "try:\n"
        "    pynvml.nvmlDeviceGetCount(); print('still initialised')\n"
        "except pynvml.NVMLError_Uninitialized:\n"
        "    print(json.dumps(a == b))\n"
    )
    result = mixed.python("-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "true"


# -- a GPU instance split into several compute instances (static MIG) ----------------------


@dataclass(frozen=True)
class FakeMigDevice:
    """A compute instance as NVML lists it: a MIG device of its own."""

    uuid: str
    gi: int
    ci: int
    compute_slices: int


def fake_split_layout(monkeypatch: pytest.MonkeyPatch, gpu: Gpu) -> tuple[FakeMigDevice, ...]:
    """Stand in for NVML on an H100 an admin carved by hand: GI 1 (2g.20gb at 2) split into
    two 1-slice compute instances (``nvidia-smi mig -cgi 14 && nvidia-smi mig -gi 1 -cci
    0,0``), GI 2 (3g.40gb at 4) with one spanning compute instance. The stand-in library
    makes only spanning compute instances, so pynvml itself is replaced."""
    profiles = {p.profile_id: p for p in gpu.mig_profiles}
    gis = {
        1: (profiles[14], Placement(start=2, size=2)),
        2: (profiles[9], Placement(start=4, size=4)),
    }
    devices = (
        FakeMigDevice("MIG-aaaaaaaa-0000-5000-8000-000000000000", gi=1, ci=0, compute_slices=1),
        FakeMigDevice("MIG-bbbbbbbb-0000-5000-8000-000000000000", gi=1, ci=1, compute_slices=1),
        FakeMigDevice("MIG-cccccccc-0000-5000-8000-000000000000", gi=2, ci=0, compute_slices=3),
    )

    def by_index(_handle: object, index: int) -> FakeMigDevice:
        if index >= len(devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return devices[index]

    def attributes(mig: FakeMigDevice) -> SimpleNamespace:
        profile = gis[mig.gi][0]
        return SimpleNamespace(
            memorySizeMB=profile.memory_bytes // MIB,
            gpuInstanceSliceCount=profile.slice_count,
            computeInstanceSliceCount=mig.compute_slices,
            multiprocessorCount=profile.multiprocessors * mig.compute_slices // profile.slice_count,
            sharedCopyEngineCount=profile.copy_engines,
            sharedDecoderCount=profile.decoders,
            sharedEncoderCount=profile.encoders,
            sharedJpegCount=profile.jpeg_engines,
            sharedOfaCount=profile.ofa_engines,
        )

    indexed = {p.nvml_index: p for p in gpu.mig_profiles}

    def profile_info(_handle: object, index: int) -> SimpleNamespace:
        if index not in indexed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=indexed[index].profile_id)

    def gi_handle(gi_id: int) -> object:
        return ctypes.cast(gi_id, pynvml.c_nvmlGpuInstance_t)

    def gi_info(handle: object) -> SimpleNamespace:
        gi_id = ctypes.cast(handle, ctypes.c_void_p).value
        assert gi_id is not None
        profile, placement = gis[gi_id]
        return SimpleNamespace(id=gi_id, profileId=profile.profile_id, placement=placement)

    def gpu_instances(_handle: object, profile_id: int, array: Any, count: Any) -> None:
        found = [gi for gi, (profile, _) in gis.items() if profile.profile_id == profile_id]
        for i, gi_id in enumerate(found):
            array[i] = gi_handle(gi_id)
        count._obj.value = len(found)

    for name, fn in {
        "nvmlDeviceGetMigMode": lambda _h: (1, 1),
        "nvmlDeviceGetMaxMigDeviceCount": lambda _h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": by_index,
        "nvmlDeviceGetUUID": lambda m: m.uuid,
        "nvmlDeviceGetGpuInstanceId": lambda m: m.gi,
        "nvmlDeviceGetComputeInstanceId": lambda m: m.ci,
        "nvmlDeviceGetAttributes": attributes,
        "nvmlDeviceGetGpuInstanceById": lambda _h, gi_id: gi_handle(gi_id),
        "nvmlGpuInstanceGetInfo": gi_info,
        "nvmlDeviceGetGpuInstances": gpu_instances,
        "nvmlDeviceGetGpuInstanceProfileInfo": profile_info,
    }.items():
        monkeypatch.setattr(pynvml, name, fn)
    return devices


def test_compute_instances_smaller_than_their_gpu_instance_are_not_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Both 1-slice CIs would be named after GI 1's profile (one device name per GI) and
    # advertised as a whole 2g.20gb: neither is published, each is named in a warning.
    inventory = build_inventory(load_profile(SINGLE_H100), NODE)
    gpu = inventory.gpus[0]
    split_a, split_b, whole = fake_split_layout(monkeypatch, gpu)
    three_g = next(p for p in gpu.mig_profiles if p.profile_id == 9)
    with structlog.testing.capture_logs() as logs:
        devices = NvmlDiscovery()._mig_devices("gpu-0", gpu.uuid, "GPU 0", gpu.mig_profiles)
    assert [(d.uuid, d.profile_name, d.multiprocessors) for d in devices] == [
        (whole.uuid, "3g.40gb", three_g.multiprocessors)
    ]
    fields = ("log_level", "gpu", "gpu_instance", "compute_instance", "uuid")
    assert [tuple(entry[f] for f in fields) for entry in logs] == [
        ("warning", gpu.uuid, 1, 0, split_a.uuid),
        ("warning", gpu.uuid, 1, 1, split_b.uuid),
    ]
    # Static MIG: the pool the agent publishes has GI 2's device only.
    mig_on = MigState(capable=True, current_enabled=True, pending_enabled=True)
    gpu = gpu.model_copy(update={"mig": mig_on, "mig_devices": devices})
    slices = render_pool(
        build_catalog(inventory.model_copy(update={"gpus": (gpu,)})).pool(NODE, DRIVER)
    )
    assert check_pool(slices) == []
    published = [d["attributes"]["uuid"]["string"] for sl in slices for d in sl["spec"]["devices"]]
    assert published == [whole.uuid]


# -- pure helpers (no NVML) ----------------------------------------------------------------


def test_importing_the_backend_does_not_load_nvml() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import dra_driver.gpu.discovery.nvml, pynvml; print(pynvml.nvmlLib)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"


@pytest.mark.parametrize(
    ("nvml", "expected"),
    [
        ("00000000:07:00.0", "0000:07:00.0"),
        ("00000000:1B:00.0", "0000:1b:00.0"),
        ("00000001:C1:1F.7", "0001:c1:1f.7"),
        ("0000:07:00.0", "0000:07:00.0"),
    ],
)
def test_normalize_bus_id(nvml: str, expected: str) -> None:
    assert normalize_bus_id(nvml) == expected


@pytest.mark.parametrize(("arch", "name"), [(13, "Rubin"), (0xFFFFFFFF, "Unknown")])
def test_architecture_names_are_the_nvidia_drivers(
    tmp_path: Path, fake_lib_dir: Path, arch: int, name: str
) -> None:
    # go-nvlib's GetArchitectureAsString, which the NVIDIA DRA driver publishes as
    # `architecture`: a selector comparing it must match here too.
    node = make_node("l4x4", tmp_path, fake_lib_dir)
    node.data.write_text(re.sub(r"(?m)^arch \d+$", f"arch {arch}", node.data.read_text()))
    assert {gpu.architecture for gpu in node.discover().gpus} == {name}


def test_small_conversions() -> None:
    assert cuda_version_string(12060) == "12.6"
    assert cuda_version_string(13000) == "13.0"
    assert mig_profile_name("MIG 1g.10gb+me") == "1g.10gb+me"
    assert mig_profile_name("1g.5gb") == "1g.5gb"
    assert spans_gpu_instance(3, 3) and not spans_gpu_instance(1, 2)
    assert [
        cores_per_sm(*cc)
        for cc in [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]
    ] == [
        64,
        64,
        64,
        128,
        128,
        128,
        128,
        128,
    ]


def test_sysfs_numa_minus_one_is_none(tmp_path: Path) -> None:
    device = tmp_path / "devices" / "pci0000:40" / "0000:40:01.0" / "0000:41:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("-1\n")
    link = tmp_path / "bus" / "pci" / "devices" / "0000:41:00.0"
    link.parent.mkdir(parents=True)
    link.symlink_to(Path("../../..") / device.relative_to(tmp_path))
    discovery = NvmlDiscovery(sysfs_root=tmp_path)
    assert discovery._pci_topology("0000:41:00.0") == ("pci0000:40", None)
    assert discovery._pci_topology("0000:99:00.0") == (None, None)


def test_rendered_data_round_trips_through_json(mixed: FakeNode) -> None:
    # The data file carries everything the comparison needs; sanity-check one record.
    text = mixed.data.read_text()
    assert "pci 00000000:07:00.0" in text
    assert "profile 7 20 1 1 14 1 1 0 1 1 9728 0,1,2,3,4,5,6:1 MIG 1g.10gb+me" in text
    assert json.loads(mixed.inventory.model_dump_json())["driver_version"] == "580.95.05"


# -- the stand-in's MIG changes persist ----------------------------------------------------

_CREATE_DESTROY = """
import ctypes, json, pynvml
pynvml.nvmlInit()
h100 = pynvml.nvmlDeviceGetHandleByIndex(1)
out = {}
def attempt(name, fn):
    try:
        out[name] = fn()
    except pynvml.NVMLError as exc:
        out[name] = exc.value
def create(profile_id, start, size):
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h100, profile_id, ctypes.byref(placement))
gi = create(19, 6, 1)
out["created"] = pynvml.nvmlGpuInstanceGetInfo(gi).id
attempt("overlap", lambda: create(19, 0, 1))
attempt("bad_placement", lambda: create(9, 2, 4))
attempt("busy", lambda: pynvml.nvmlGpuInstanceDestroy(pynvml.nvmlDeviceGetGpuInstanceById(h100, 1)))
with open(__import__("os").environ["FAKE_NVML_DATA"]) as f:
    out["persisted"] = "gi 4 19 6 1" in f.read()
pynvml.nvmlGpuInstanceDestroy(gi)
pynvml.nvmlShutdown()
print(json.dumps(out))
"""


def test_fake_creates_and_destroys_gpu_instances(mixed: FakeNode) -> None:
    original = mixed.data.read_text()
    result = mixed.python("-c", _CREATE_DESTROY)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "created": 4,
        "overlap": 23,  # NVML_ERROR_INSUFFICIENT_RESOURCES
        "bad_placement": 2,  # NVML_ERROR_INVALID_ARGUMENT
        "busy": 19,  # NVML_ERROR_IN_USE: GI 1 still has its compute instance
        "persisted": True,
    }
    # Written back in the format it was read in: same records, same inventory.
    records = [line for line in original.splitlines() if not line.startswith("#")]
    assert mixed.data.read_text().splitlines() == records
    assert mixed.discover() == mixed.inventory


# -- a GPU fallen off the bus ------------------------------------------------------------

_LOSE_GPU_1 = """
import sys, pynvml
from dra_driver.gpu.discovery.nvml import NvmlDiscovery
seen = {"index": -1}
by_index = pynvml.nvmlDeviceGetHandleByIndex
def handle(index):
    seen["index"] = index
    return by_index(index)
pynvml.nvmlDeviceGetHandleByIndex = handle
call = getattr(pynvml, sys.argv[1])
def lost(*args):
    if (args[0] if call is handle else seen["index"]) == 1:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    return call(*args)
setattr(pynvml, sys.argv[1], lost)
print(NvmlDiscovery().discover().model_dump_json())
"""


@pytest.mark.parametrize(
    "call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetGpuFabricInfoV"]
)
def test_a_lost_gpu_does_not_hide_the_others(mixed: FakeNode, call: str) -> None:
    # NVML answers GPU_IS_LOST for a GPU that fell off the bus (nvidia-smi shows it as
    # "Unable to determine the device handle ... GPU is lost" and lists the rest).
    result = mixed.python("-c", _LOSE_GPU_1, call)
    assert result.returncode == 0, result.stderr
    got = Inventory.model_validate_json(result.stdout.splitlines()[-1])
    assert list(got.gpus) == [g for g in mixed.inventory.gpus if g.index != 1]
    warnings = [line for line in result.stdout.splitlines() if "GPU is lost" in line]
    assert len(warnings) == 1 and "GPU 1" in warnings[0], result.stdout
