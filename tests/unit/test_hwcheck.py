"""``dra-driver hw-check``: the pure decisions by tables, then the real command end to end
against the stand-in libnvidia-ml.so.1 (tests/fakenvml) with a fake ``nvidia-smi``.

The end-to-end cases render a simulated node into the stand-in's data file, write a shell
script printing that node's ``nvidia-smi -L`` listing into a driver root, and run
``python -m dra_driver.cli hw-check`` in a fresh process (the dynamic loader reads
LD_LIBRARY_PATH only at process start).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dra_driver.gpu import hwcheck_probe
from dra_driver.gpu.discovery.simulated import build_inventory, load_profile
from dra_driver.gpu.hwcheck import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    NO_GPUS,
    PASS_CARVE,
    PASS_MPS,
    CarveTarget,
    NvmlUnavailable,
    Report,
    Row,
    carve_target,
    discovery_row,
    driver_row,
    fail,
    health_row,
    init_failure,
    is_nvidia_gpu,
    leftovers,
    listing_differences,
    mig_rows,
    ok,
    render_table,
    report_json,
    skipped,
    smallest_profile,
    smi_result,
    without_nvml,
)
from dra_driver.gpu.hwcheck_smi import SmiGpu, SmiListing, SmiMig, parse_list
from dra_driver.gpu.inventory import Gpu, Inventory, MigDevice, MigProfile, MigState
from dra_driver.gpu.mig.backend import Instance, check_create
from dra_driver.gpu.sharing.backend import MpsDaemon, SharingError
from tests.fakenvml import build, render
from tests.unit.gpu.discovery.test_nvml_backend import fake_lib_dir


def inventory_of(profile: str) -> Inventory:
    return build_inventory(load_profile(profile), "n1")


MIXED = inventory_of("mixed")


def smi_listing(inventory: Inventory) -> str:
    """What ``nvidia-smi -L`` prints for ``inventory``, written out independently of the
    parser under test."""
    lines = []
    for gpu in inventory.gpus:
        lines.append(f"GPU {gpu.index}: {gpu.product_name} (UUID: {gpu.uuid})")
        for n, mig in enumerate(gpu.mig_devices):
            lines.append(f"  MIG {mig.profile_name:<11} Device {n:>2}: (UUID: {mig.uuid})")
    return "\n".join(lines) + "\n" if lines else "No devices found.\n"


# -- nvidia-smi -L ---------------------------------------------------------------------------

A100 = "GPU-5a3c1b8e-1111-2222-3333-444455556666"
L4 = "GPU-8d021cad-8219-9386-b5ba-97c388bbf706"
MIG_A = "MIG-a6399172-acde-4d55-0248-33f994cfbb3b"
MIG_B = "MIG-112d3c7b-b757-45a4-9eec-8fffbc021d4a"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {A100})\n"
            f"  MIG 1g.10gb     Device  0: (UUID: {MIG_A})\n"
            f"  MIG 1g.10gb+me  Device  1: (UUID: {MIG_B})\n"
            f"GPU 1: NVIDIA L4 (UUID: {L4})\n",
            SmiListing(
                gpus=(
                    SmiGpu(
                        0,
                        "NVIDIA A100-SXM4-80GB",
                        A100,
                        (SmiMig("1g.10gb", 0, MIG_A), SmiMig("1g.10gb+me", 1, MIG_B)),
                    ),
                    SmiGpu(1, "NVIDIA L4", L4),
                )
            ),
        ),
        # Drivers before R470 name MIG devices after their GPU, GI and CI.
        (
            f"GPU 0: A100-SXM4-40GB (UUID: {A100})\n"
            f"  MIG 3g.20gb Device 0: (UUID: MIG-{A100}/1/0)\n",
            SmiListing(
                gpus=(
                    SmiGpu(0, "A100-SXM4-40GB", A100, (SmiMig("3g.20gb", 0, f"MIG-{A100}/1/0"),)),
                )
            ),
        ),
        ("No devices found.\n", SmiListing(no_devices=True)),
        ("No devices were found\n", SmiListing(no_devices=True)),
        ("", SmiListing()),
        # What a failing GPU looks like, and a MIG line without its GPU: kept as not understood.
        (
            f"Unable to determine the device handle for GPU 0000:07:00.0: Unknown Error\n\n"
            f"  MIG 1g.10gb     Device  0: (UUID: {MIG_A})\n"
            f"GPU 1: NVIDIA L4 (UUID: {L4})\n",
            SmiListing(
                gpus=(SmiGpu(1, "NVIDIA L4", L4),),
                unknown=(
                    "Unable to determine the device handle for GPU 0000:07:00.0: Unknown Error",
                    f"MIG 1g.10gb     Device  0: (UUID: {MIG_A})",
                ),
            ),
        ),
    ],
)
def test_parse_list(text: str, expected: SmiListing) -> None:
    assert parse_list(text) == expected


def test_parse_list_reads_the_fake_listing_of_every_gpu_and_mig_device() -> None:
    listing = parse_list(smi_listing(MIXED))
    assert [g.uuid for g in listing.gpus] == [g.uuid for g in MIXED.gpus]
    assert [[m.uuid for m in g.migs] for g in listing.gpus] == [
        [m.uuid for m in g.mig_devices] for g in MIXED.gpus
    ]
    assert listing.unknown == ()


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr", "expected"),
    [
        (0, f"GPU 0: NVIDIA L4 (UUID: {L4})\n", "", SmiListing(gpus=(SmiGpu(0, "NVIDIA L4", L4),))),
        # Without GPUs nvidia-smi exits 6 and says so: an answer, not a failure.
        (6, "No devices were found\n", "", SmiListing(no_devices=True)),
        (
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n",
            "",
            "nvidia-smi -L failed (exit status 9): NVIDIA-SMI has failed because it couldn't "
            "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is "
            "installed and running.",
        ),
        (
            127,
            "",
            "libnvidia-ml.so.1: cannot open shared object file\n",
            "nvidia-smi -L failed (exit status 127): libnvidia-ml.so.1: cannot open shared "
            "object file",
        ),
        (1, "", "", "nvidia-smi -L failed (exit status 1): no output"),
    ],
)
def test_smi_result(returncode: int, stdout: str, stderr: str, expected: object) -> None:
    assert smi_result(returncode, stdout, stderr) == expected


# -- discovery against the listing -----------------------------------------------------------


def _listing(inventory: Inventory) -> SmiListing:
    return parse_list(smi_listing(inventory))


def _gpu(index: int) -> Gpu:
    return MIXED.gpus[index]


def _without_gpu(listing: SmiListing, index: int) -> SmiListing:
    return SmiListing(gpus=tuple(g for g in listing.gpus if g.index != index))


def _moved_mig(listing: SmiListing) -> SmiListing:
    # The first MIG device of GPU 0 listed under GPU 1 instead.
    g0, g1, *rest = listing.gpus
    moved = g0.migs[0]
    return SmiListing(
        gpus=(
            SmiGpu(g0.index, g0.name, g0.uuid, g0.migs[1:]),
            SmiGpu(g1.index, g1.name, g1.uuid, (*g1.migs, moved)),
            *rest,
        )
    )


_SAME = _listing(MIXED)
_L4 = _gpu(3)
_A100_MIG = _gpu(0).mig_devices[0]


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        (_SAME, []),
        (
            SmiListing(gpus=(*_SAME.gpus, SmiGpu(4, "NVIDIA H100", "GPU-extra"))),
            ["nvidia-smi -L lists GPU 4 GPU-extra that discovery does not find"],
        ),
        (
            _without_gpu(_SAME, 3),
            [f"discovery finds gpu-{_L4.minor} {_L4.uuid} that nvidia-smi -L does not list"],
        ),
        (
            SmiListing(
                gpus=(*_SAME.gpus[:3], SmiGpu(7, _L4.product_name, _L4.uuid)),
            ),
            [f"{_L4.uuid} is GPU 7 to nvidia-smi -L, GPU 3 to discovery"],
        ),
        (
            SmiListing(
                gpus=(
                    SmiGpu(
                        0, "x", _gpu(0).uuid, (*_SAME.gpus[0].migs, SmiMig("1g.10gb", 3, "MIG-x"))
                    ),
                    *_SAME.gpus[1:],
                )
            ),
            ["nvidia-smi -L lists MIG device MIG-x on GPU 0 that discovery does not find"],
        ),
        (
            SmiListing(
                gpus=(SmiGpu(0, "x", _gpu(0).uuid, _SAME.gpus[0].migs[1:]), *_SAME.gpus[1:])
            ),
            [
                f"discovery finds MIG device {_A100_MIG.uuid} on gpu-{_gpu(0).minor} "
                "that nvidia-smi -L does not list"
            ],
        ),
        (
            _moved_mig(_SAME),
            [
                f"MIG device {_A100_MIG.uuid} is on GPU 1 to nvidia-smi -L but on "
                f"gpu-{_gpu(0).minor} to discovery"
            ],
        ),
        (
            SmiListing(gpus=_SAME.gpus, unknown=("Unable to determine the device handle",)),
            ["nvidia-smi -L printed 'Unable to determine the device handle'"],
        ),
    ],
)
def test_listing_differences(listing: SmiListing, expected: list[str]) -> None:
    assert listing_differences(MIXED, listing) == expected


def test_discovery_row() -> None:
    assert discovery_row(MIXED, _SAME) == ok(
        "discovery", "4 GPUs, 6 MIG devices, the same as nvidia-smi -L"
    )
    one = inventory_of("l4x4").model_copy(update={"gpus": inventory_of("l4x4").gpus[:1]})
    assert (
        discovery_row(one, _listing(one)).detail
        == "1 GPU, 0 MIG devices, the same as nvidia-smi -L"
    )
    assert discovery_row(MIXED, "nvidia-smi not found") == fail(
        "discovery", "found 4 GPUs, 6 MIG devices; cannot compare: nvidia-smi not found"
    )
    # Six GPUs nobody else knows: four spelt out, the rest counted.
    extra = tuple(SmiGpu(10 + i, "x", f"GPU-extra-{i}") for i in range(6))
    row = discovery_row(MIXED, SmiListing(gpus=(*_SAME.gpus, *extra)))
    assert row.verdict == "fail"
    assert row.detail.count("that discovery does not find") == 4
    assert row.detail.endswith("GPU 13 GPU-extra-3 that discovery does not find (and 2 more)")


def test_mig_devices_split_into_compute_instances_are_named_not_failed() -> None:
    # An admin split a GPU instance into compute instances (static MIG): nvidia-smi -L lists
    # each as a MIG device (1c.3g.40gb); discovery leaves them out by design
    # (docs/reliability.md), so the agent runs all the same and the node is healthy.
    g0 = _SAME.gpus[0]
    split = (SmiMig("1c.3g.40gb", 3, "MIG-split-a"), SmiMig("2c.3g.40gb", 4, "MIG-split-b"))
    listing = SmiListing(gpus=(SmiGpu(0, g0.name, g0.uuid, (*g0.migs, *split)), *_SAME.gpus[1:]))
    assert listing_differences(MIXED, listing) == []
    assert discovery_row(MIXED, listing) == ok(
        "discovery",
        "4 GPUs, 6 MIG devices, the same as nvidia-smi -L but for 2 MIG devices split into "
        "compute instances, which the agent does not publish: MIG-split-a, MIG-split-b",
    )
    # A whole-instance MIG device discovery misses still fails.
    missed = SmiGpu(0, g0.name, g0.uuid, (*g0.migs, SmiMig("1g.10gb", 5, "MIG-x")))
    extra = SmiListing(gpus=(missed, *_SAME.gpus[1:]))
    assert discovery_row(MIXED, extra).verdict == "fail"


# -- the driver, or no GPU -----------------------------------------------------------------

_ABSENT = NvmlUnavailable("libnvidia-ml.so.1 not found", absent=True)
_BROKEN = NvmlUnavailable("NVML call nvmlInit failed: Insufficient Permissions", absent=False)


@pytest.mark.parametrize(
    ("code", "root", "expected"),
    [
        (12, "/", NvmlUnavailable("libnvidia-ml.so.1 not found", absent=True)),
        (
            12,
            "/run/nvidia/driver",
            NvmlUnavailable(
                "libnvidia-ml.so.1 not found in the driver root /run/nvidia/driver or the "
                "library path",
                absent=True,
            ),
        ),
        (9, "/", NvmlUnavailable("nvmlInit: the NVIDIA kernel driver is not loaded", absent=True)),
        (4, "/", NvmlUnavailable("the loader's message", absent=False)),  # no permission
        (
            18,
            "/",
            NvmlUnavailable(
                "nvmlInit: libnvidia-ml and the loaded NVIDIA kernel module are of different "
                "driver versions (upgraded without a reboot?): reboot the node, or unload and "
                "reload the nvidia kernel modules",
                absent=False,
            ),
        ),
        (999, "/", NvmlUnavailable("the loader's message", absent=False)),
    ],
)
def test_init_failure(code: int, root: str, expected: NvmlUnavailable) -> None:
    assert init_failure(code, "the loader's message", root) == expected


@pytest.mark.parametrize(
    ("vendor", "pci_class", "gpu"),
    [
        ("0x10de\n", "0x030200\n", True),  # 3D controller (data-centre GPUs)
        ("0x10de", "0x030000", True),  # VGA controller
        ("0x10DE", "0x030200", True),
        ("0x10de", "0x068000", False),  # NVSwitch (bridge)
        ("0x10de", "0x040300", False),  # the GPU's audio function
        ("0x8086", "0x030000", False),
        ("0x1af4", "0x010000", False),
    ],
)
def test_is_nvidia_gpu(vendor: str, pci_class: str, gpu: bool) -> None:
    assert is_nvidia_gpu(vendor, pci_class) is gpu


_NEEDS = "needs a working NVML"


@pytest.mark.parametrize(
    ("unavailable", "evidence", "carve", "expected"),
    [
        # Nothing anywhere: the whole run is skipped.
        (_ABSENT, [], False, Report(skipped="no NVIDIA GPU (libnvidia-ml.so.1 not found)")),
        (NO_GPUS, [], True, Report(skipped="no NVIDIA GPU (NVML counts no GPU)")),
        # NVML sees nothing but the node shows a GPU: the driver check fails.
        (
            _ABSENT,
            ["/dev/nvidiactl", "/dev/nvidia0", "PCI 0000:07:00.0", "PCI 0000:1b:00.0"],
            False,
            Report(
                rows=(
                    fail(
                        "driver",
                        "libnvidia-ml.so.1 not found; but the node shows an NVIDIA GPU: "
                        "/dev/nvidiactl, /dev/nvidia0, PCI 0000:07:00.0 and 1 more (is the "
                        "driver loaded, and --driver-root where its files are?)",
                    ),
                    skipped("discovery", _NEEDS),
                    skipped("mig", _NEEDS),
                    skipped("mig-carve", PASS_CARVE),
                    skipped("mps", PASS_MPS),
                    skipped("health", _NEEDS),
                )
            ),
        ),
        # A broken NVML fails whatever the node shows.
        (
            _BROKEN,
            [],
            True,
            Report(
                rows=(
                    fail("driver", "NVML call nvmlInit failed: Insufficient Permissions"),
                    skipped("discovery", _NEEDS),
                    skipped("mig", _NEEDS),
                    skipped("mig-carve", _NEEDS),
                    skipped("mps", PASS_MPS),
                    skipped("health", _NEEDS),
                )
            ),
        ),
    ],
)
def test_without_nvml(
    unavailable: NvmlUnavailable, evidence: list[str], carve: bool, expected: Report
) -> None:
    report = without_nvml(unavailable, evidence, carve=carve, mps=False)
    assert report == expected
    assert report.failed is (not expected.skipped)


def test_broken_nvml_with_evidence_gives_no_driver_hint() -> None:
    report = without_nvml(_BROKEN, ["/dev/nvidiactl"], carve=False, mps=False)
    assert report.rows[0].detail == (
        "NVML call nvmlInit failed: Insufficient Permissions; but the node shows an NVIDIA "
        "GPU: /dev/nvidiactl"
    )


def test_driver_row() -> None:
    assert driver_row("580.95.05", "13.0", 1, "") == ok(
        "driver", "NVIDIA driver 580.95.05, CUDA 13.0, 1 GPU"
    )
    assert driver_row("580.95.05", "13.0", 8, "/usr/lib64/libnvidia-ml.so.1").detail == (
        "NVIDIA driver 580.95.05, CUDA 13.0, 8 GPUs (/usr/lib64/libnvidia-ml.so.1)"
    )


def test_gpu_evidence_reads_device_nodes_and_the_pci_bus(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"):
        (root / "dev" / name).touch()
    sysfs = tmp_path / "sys"
    for bus_id, vendor, pci_class in [
        ("0000:00:02.0", "0x8086", "0x030000"),
        ("0000:07:00.0", "0x10de", "0x030200"),
        ("0000:07:00.1", "0x10de", "0x040300"),
        ("0000:81:00.0", "0x10de", "0x068000"),
    ]:
        function = sysfs / "bus" / "pci" / "devices" / bus_id
        function.mkdir(parents=True)
        (function / "vendor").write_text(vendor + "\n")
        (function / "class").write_text(pci_class + "\n")
    (sysfs / "bus" / "pci" / "devices" / "0000:99:00.0").mkdir()  # unreadable: ignored
    found = hwcheck_probe.gpu_evidence(root, sysfs)
    # The host's own /dev is looked at too; keep to what this test made.
    assert [e for e in found if e.startswith((str(tmp_path), "PCI"))] == [
        f"{root}/dev/nvidiactl",
        f"{root}/dev/nvidia0",
        f"{root}/dev/nvidia1",
        "PCI 0000:07:00.0",
    ]
    empty = tmp_path / "empty"
    assert [
        e for e in hwcheck_probe.gpu_evidence(empty, empty) if e.startswith(str(tmp_path))
    ] == []


# -- MIG -------------------------------------------------------------------------------------


def test_mig_rows() -> None:
    a100, h100, h100_whole, l4 = MIXED.gpus
    pending = h100_whole.model_copy(
        update={"mig": MigState(capable=True, current_enabled=False, pending_enabled=True)}
    )
    no_profiles = a100.model_copy(update={"mig_profiles": (), "mig_devices": ()})
    inventory = MIXED.model_copy(
        update={"gpus": (a100, h100, h100_whole, l4, pending, no_profiles)}
    )
    assert mig_rows(inventory) == [
        ok("mig", "NVIDIA A100-SXM4-80GB: MIG on, 3 MIG devices", "gpu-0"),
        ok("mig", "NVIDIA H100 80GB HBM3: MIG on, 3 MIG devices", "gpu-1"),
        ok("mig", "NVIDIA H100 80GB HBM3: MIG capable, off", "gpu-2"),
        ok("mig", "NVIDIA L4: not MIG capable", "gpu-3"),
        fail(
            "mig",
            "NVIDIA H100 80GB HBM3: MIG off, on after a GPU reset: reset the GPU "
            "(nvidia-smi -r -i 2) or set the mode back (nvidia-smi -i 2 -mig 0)",
            "gpu-2",
        ),
        fail("mig", "NVIDIA A100-SXM4-80GB: MIG capable but NVML lists no MIG profile", "gpu-0"),
    ]


def _instances(gpu: Gpu) -> tuple[Instance, ...]:
    return tuple(Instance(d.gpu_instance_id, d.profile_id, d.placement, d) for d in gpu.mig_devices)


def test_smallest_profile() -> None:
    a100, h100, _, l4 = MIXED.gpus
    assert [smallest_profile(g).name for g in (a100, h100)] == ["1g.10gb", "1g.10gb"]  # type: ignore[union-attr]
    assert smallest_profile(l4) is None


def test_carve_target_is_the_first_free_placement_of_the_smallest_profile() -> None:
    h100 = MIXED.gpus[1]
    # The A100 is full (3g + 2g + 1g); the H100 has 4g at 0, 1g at 4 and 5: 1g fits at 6.
    gpus = [(g, _instances(g)) for g in MIXED.gpus]
    target = carve_target(gpus)
    assert isinstance(target, CarveTarget)
    assert (target.gpu.uuid, target.profile.name, target.start) == (h100.uuid, "1g.10gb", 6)
    assert target.device == "gpu-1" and target.what == "1g.10gb at memory slice 6 on gpu-1"
    assert target.existing == _instances(h100)
    # An empty GPU in MIG mode: the first placement.
    empty = h100.model_copy(update={"mig_devices": ()})
    first = carve_target([(empty, ())])
    assert isinstance(first, CarveTarget) and first.start == 0


@pytest.mark.parametrize(
    ("gpus", "why"),
    [
        ([], "no GPU in MIG mode"),
        ([(MIXED.gpus[2], ()), (MIXED.gpus[3], ())], "no GPU in MIG mode"),
        (
            [(MIXED.gpus[0], _instances(MIXED.gpus[0]))],
            "no room for the smallest MIG profile on any GPU in MIG mode",
        ),
    ],
)
def test_no_carve_target(gpus: list[tuple[Gpu, tuple[Instance, ...]]], why: str) -> None:
    assert carve_target(gpus) == why


def test_leftovers_are_the_new_gpu_instances() -> None:
    h100 = MIXED.gpus[1]
    target = carve_target([(h100, _instances(h100))])
    assert isinstance(target, CarveTarget)
    profile = target.profile
    new = Instance(9, profile.profile_id, profile.placements[6])
    assert leftovers(target, (*_instances(h100), new)) == [9]
    assert leftovers(target, _instances(h100)) == []


# -- health events ---------------------------------------------------------------------------

_XID, _DBE = EVENT_XID_CRITICAL, EVENT_DOUBLE_BIT_ECC


@pytest.mark.parametrize(
    ("supported", "registered", "expected"),
    [
        (0x1F, None, ok("health", "registered for Xid and double-bit ECC events", "gpu-0")),
        (
            _XID,
            None,
            ok(
                "health",
                "registered for Xid events (no ECC events: ECC off or unsupported)",
                "gpu-0",
            ),
        ),
        (
            0x4 | _DBE,
            None,
            fail(
                "health",
                "does not report Xid events (supported event types 0x6): the agent cannot "
                "taint it on errors",
                "gpu-0",
            ),
        ),
        (
            _XID | _DBE,
            "Not Supported",
            fail("health", "registering for Xid events failed: Not Supported", "gpu-0"),
        ),
        (
            "GPU is lost (NVML error 15)",
            None,
            fail("health", "supported event types unknown: GPU is lost (NVML error 15)", "gpu-0"),
        ),
    ],
)
def test_health_row(supported: int | str, registered: str | None, expected: Row) -> None:
    assert health_row("gpu-0", supported, registered) == expected


# -- the report ----------------------------------------------------------------------------


def test_report_verdicts_and_output() -> None:
    rows = (
        ok("driver", "NVIDIA driver 580.95.05, CUDA 13.0, 1 GPU"),
        fail("health", "registering for Xid events failed: Unknown Error", "gpu-0"),
        skipped("mps", PASS_MPS),
    )
    report = Report(rows=rows)
    assert report.failed and report.verdict == "fail"
    assert render_table(report) == [
        "CHECK         VERDICT  DETAIL",
        "driver        ok       NVIDIA driver 580.95.05, CUDA 13.0, 1 GPU",
        "health gpu-0  FAIL     registering for Xid events failed: Unknown Error",
        "mps           skipped  pass --mps (starts and stops one MPS control daemon)",
        "hw-check: FAIL (1 failed, 1 ok, 1 skipped)",
    ]
    assert report_json(report) == {
        "verdict": "fail",
        "checks": [
            {"check": "driver", "device": "", "verdict": "ok", "detail": rows[0].detail},
            {"check": "health", "device": "gpu-0", "verdict": "fail", "detail": rows[1].detail},
            {"check": "mps", "device": "", "verdict": "skipped", "detail": PASS_MPS},
        ],
    }
    passed = Report(rows=(rows[0], rows[2]))
    assert not passed.failed and passed.verdict == "ok"
    assert render_table(passed)[-1] == "hw-check: ok (1 ok, 1 skipped)"
    none = Report(skipped="no NVIDIA GPU (libnvidia-ml.so.1 not found)")
    assert not none.failed and none.verdict == "skipped"
    assert render_table(none) == ["skipped: no NVIDIA GPU (libnvidia-ml.so.1 not found)"]
    assert report_json(none) == {
        "verdict": "skipped",
        "detail": "no NVIDIA GPU (libnvidia-ml.so.1 not found)",
        "checks": [],
    }


# -- MPS, against a stand-in for the sharing backend ---------------------------------------


@dataclass
class FakeMps:
    """Keeps to the public surface hw-check uses: start_mps, mps_running, stop_mps."""

    mps_root: Path
    driver_root: Path
    fail_start: bool = False
    fail_stop: bool = False
    never_stops: bool = False
    running: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)

    def start_mps(self, daemon: MpsDaemon) -> None:
        self.calls.append(f"start {daemon.daemon_id} {','.join(daemon.uuids)}")
        assert daemon.pipe_dir.is_relative_to(self.mps_root)
        if self.fail_start:
            raise SharingError(
                "starting MPS daemon hw-check failed: unshare: Operation not permitted"
            )
        daemon.pipe_dir.mkdir(parents=True)
        self.running.add(daemon.daemon_id)

    def mps_running(self, daemon_id: str, pipe_dir: Path) -> bool:
        return daemon_id in self.running

    def stop_mps(self, daemon_id: str, pipe_dir: Path) -> None:
        self.calls.append(f"stop {daemon_id}")
        if self.fail_stop:
            raise SharingError("stopping MPS daemon hw-check failed: no answer")
        if not self.never_stops:
            self.running.discard(daemon_id)


@pytest.fixture
def mps_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeMps]]:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # so that TMPDIR is read again
    monkeypatch.setattr(hwcheck_probe, "MPS_STOP_WAIT", 0.3)
    yield []


def _run_mps(
    backends: list[FakeMps],
    *,
    fail_start: bool = False,
    fail_stop: bool = False,
    never_stops: bool = False,
) -> Row:
    def make(mps_root: Path, driver_root: Path) -> FakeMps:
        backends.append(FakeMps(mps_root, driver_root, fail_start, fail_stop, never_stops))
        return backends[-1]

    return hwcheck_probe._mps(MIXED, Path("/drv"), make)


def test_mps_starts_and_stops_a_daemon_for_the_first_gpu(
    mps_backends: list[FakeMps], tmp_path: Path
) -> None:
    row = _run_mps(mps_backends)
    assert row == ok("mps", "started an MPS control daemon and stopped it", "gpu-0")
    (backend,) = mps_backends
    assert backend.calls == [f"start hw-check {MIXED.gpus[0].uuid}", "stop hw-check"]
    assert backend.driver_root == Path("/drv")
    # Its directories lived in a temporary directory, removed afterwards.
    assert backend.mps_root.name == "mps" and backend.mps_root.parent.parent == tmp_path
    assert not backend.mps_root.parent.exists()


def test_mps_start_failure_is_reported(mps_backends: list[FakeMps]) -> None:
    row = _run_mps(mps_backends, fail_start=True)
    assert row == fail(
        "mps",
        "starting an MPS control daemon failed: starting MPS daemon hw-check failed: unshare: "
        "Operation not permitted",
        "gpu-0",
    )
    assert mps_backends[0].calls[-1] == "stop hw-check"  # whatever was left is stopped
    assert not mps_backends[0].mps_root.parent.exists()  # nothing worth keeping


def test_mps_start_failure_keeps_the_daemons_log(mps_backends: list[FakeMps]) -> None:
    def start(daemon: MpsDaemon) -> None:
        daemon.log_dir.mkdir(parents=True)
        (daemon.log_dir / "control.log").write_text("[ERROR] no CUDA-capable device\n")
        raise SharingError("MPS daemon hw-check: set_default_active_thread_percentage failed")

    def make(mps_root: Path, driver_root: Path) -> FakeMps:
        backend = FakeMps(mps_root, driver_root)
        backend.start_mps = start  # type: ignore[method-assign]
        mps_backends.append(backend)
        return backend

    row = hwcheck_probe._mps(MIXED, Path("/"), make)
    log_dir = mps_backends[0].mps_root / "hw-check" / "log"
    assert row.detail == (
        "starting an MPS control daemon failed: MPS daemon hw-check: "
        f"set_default_active_thread_percentage failed (its log: {log_dir})"
    )
    assert (log_dir / "control.log").is_file()


def test_mps_stop_failure_says_how_to_stop_it(mps_backends: list[FakeMps]) -> None:
    row = _run_mps(mps_backends, fail_stop=True)
    assert row.verdict == "fail"
    pipe = mps_backends[0].mps_root / "hw-check" / "pipe"
    assert row.detail == (
        "started an MPS control daemon but stopping it failed: stopping MPS daemon hw-check "
        f"failed: no answer (stop it: echo quit | CUDA_MPS_PIPE_DIRECTORY={pipe} "
        "nvidia-cuda-mps-control)"
    )
    assert pipe.is_dir()  # a daemon's directory is not removed under it


def test_mps_daemon_that_stays_fails(mps_backends: list[FakeMps]) -> None:
    row = _run_mps(mps_backends, never_stops=True)
    assert row.verdict == "fail"
    assert row.detail.startswith("MPS control daemon still runs 0 s after stop (pipe directory ")


def _interrupt(how: str) -> None:
    """What the admin does: Ctrl-C (KeyboardInterrupt), or a signal (kill, a closed terminal)."""
    if how == "ctrl-c":
        raise KeyboardInterrupt
    os.kill(os.getpid(), signal.Signals[how])


class _Untouched(Exception):
    """Raised by the test's own handler: the check did not take SIGTERM or SIGHUP over."""


@pytest.fixture
def signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise _Untouched rather than end the test run."""

    def untouched(signum: int, frame: object) -> None:
        raise _Untouched(signal.Signals(signum).name)

    previous = {s: signal.signal(s, untouched) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, handler in previous.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("how", ["ctrl-c", "SIGTERM", "SIGHUP"])
def test_mps_stops_its_daemon_when_interrupted(
    mps_backends: list[FakeMps], signals: None, how: str
) -> None:
    def make(mps_root: Path, driver_root: Path) -> FakeMps:
        backend = FakeMps(mps_root, driver_root)
        running = backend.mps_running

        def mps_running(daemon_id: str, pipe_dir: Path) -> bool:
            if backend.calls == [f"start hw-check {MIXED.gpus[0].uuid}"]:
                _interrupt(how)  # just after the daemon started
            return running(daemon_id, pipe_dir)

        backend.mps_running = mps_running  # type: ignore[method-assign]
        mps_backends.append(backend)
        return backend

    with pytest.raises(KeyboardInterrupt):
        hwcheck_probe._mps(MIXED, Path("/drv"), make)
    (backend,) = mps_backends
    assert backend.running == set()  # no MPS daemon outlives the check
    assert backend.calls[-1] == "stop hw-check"
    assert not backend.mps_root.parent.exists()
    assert signal.getsignal(signal.SIGTERM).__name__ == "untouched"  # type: ignore[union-attr]


# -- MIG steps against a stand-in MIG backend: interruptions, other tools' MIG devices -------

_H100 = MIXED.gpus[1]


@dataclass
class FakeMig:
    """The MIG backend's surface _carve uses, over GPU instances held in memory; ``hooks``
    run at the start of a method, with how many times it was called (from 1)."""

    instances: dict[str, list[Instance]]
    hooks: dict[str, Callable[[int], None]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    next_id: int = 20

    @classmethod
    def of(cls, inventory: Inventory) -> FakeMig:
        return cls({g.uuid: list(_instances(g)) for g in inventory.gpus})

    def _call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        hook = self.hooks.get(name)
        if hook is not None:
            hook(self.calls[name])

    def add(self, gpu: Gpu, profile: MigProfile, start: int, uuid: str = "") -> Instance:
        """A MIG device made (by the check, or by another tool when a hook calls it)."""
        self.next_id += 1
        template = _H100.mig_devices[-1]
        placement = next(p for p in profile.placements if p.start == start)
        device = template.model_copy(
            update={
                "uuid": uuid or f"MIG-made-{self.next_id}",
                "gpu_instance_id": self.next_id,
                "profile_id": profile.profile_id,
                "profile_name": profile.name,
                "placement": placement,
            }
        )
        instance = Instance(self.next_id, profile.profile_id, placement, device)
        self.instances[gpu.uuid].append(instance)
        return instance

    def mig_enabled(self, gpu: Gpu) -> bool:
        return gpu.mig_enabled

    def set_mig_mode(self, gpu: Gpu, enabled: bool) -> None:
        raise AssertionError("hw-check never changes MIG mode")

    def create(self, gpu: Gpu, profile: MigProfile, start: int) -> MigDevice:
        self._call("create")
        check_create(gpu, profile, start, self.instances[gpu.uuid])
        device = self.add(gpu, profile, start).device
        assert device is not None
        return device

    def destroy(self, gpu: Gpu, gpu_instance_id: int) -> None:
        self._call("destroy")
        self.instances[gpu.uuid] = [
            i for i in self.instances[gpu.uuid] if i.gpu_instance_id != gpu_instance_id
        ]

    def list(self, gpu: Gpu) -> tuple[Instance, ...]:
        self._call("list")
        return tuple(self.instances[gpu.uuid])


def _smallest(gpu: Gpu) -> MigProfile:
    profile = smallest_profile(gpu)
    assert profile is not None
    return profile


@pytest.mark.parametrize("how", ["ctrl-c", "SIGTERM", "SIGHUP"])
def test_carve_destroys_its_mig_device_when_interrupted(signals: None, how: str) -> None:
    mig = FakeMig.of(MIXED)
    before = list(mig.instances[_H100.uuid])

    def destroy(n: int) -> None:
        if n == 1:  # interrupted after the create, before the destroy
            _interrupt(how)

    mig.hooks["destroy"] = destroy
    with pytest.raises(KeyboardInterrupt):
        hwcheck_probe._carve(MIXED, mig)
    assert mig.calls["create"] == 1
    assert mig.instances[_H100.uuid] == before  # no MIG device outlives the check
    assert signal.getsignal(signal.SIGTERM).__name__ == "untouched"  # type: ignore[union-attr]


def test_carve_never_destroys_a_mig_device_another_tool_made_at_its_placement() -> None:
    # The agent (dynamic MIG) makes a pod's MIG device at the very placement the check chose,
    # between the check's listing and its create: the create fails; the pod's device stays.
    mig = FakeMig.of(MIXED)
    theirs: list[Instance] = []

    def agent(n: int) -> None:
        theirs.append(mig.add(_H100, _smallest(_H100), 6, "MIG-a-pods"))

    mig.hooks["create"] = agent
    row = hwcheck_probe._carve(MIXED, mig)
    assert row.verdict == "fail"
    assert row.detail.startswith("creating 1g.10gb at memory slice 6 on gpu-1 failed: ")
    assert "overlaps GPU instance" in row.detail and "removed" not in row.detail
    assert theirs[0] in mig.instances[_H100.uuid]


def test_carve_does_not_blame_a_mig_device_another_tool_made_meanwhile() -> None:
    # The check's MIG device is gone; the agent took the placement for a pod right after.
    # That device is not the check's, and the admin must not be told to destroy it.
    mig = FakeMig.of(MIXED)

    def agent(n: int) -> None:
        if mig.calls.get("destroy") and not mig.calls.get("agent"):  # after the destroy
            mig.calls["agent"] = 1
            mig.add(_H100, _smallest(_H100), 6, "MIG-a-pods")

    mig.hooks["list"] = agent
    row = hwcheck_probe._carve(MIXED, mig)
    assert row.verdict == "ok", row.detail
    assert row.detail.startswith("created gpu-1-mig-1g10gb-19-6 (MIG-made-")


def test_leftovers_are_only_what_the_check_may_have_made() -> None:
    target = carve_target([(_H100, _instances(_H100))])
    assert isinstance(target, CarveTarget)
    profile = target.profile
    at = profile.placements[6]
    mine = _H100.mig_devices[-1].model_copy(update={"uuid": "MIG-mine", "placement": at})
    theirs = mine.model_copy(update={"uuid": "MIG-theirs"})
    now = [
        *_instances(_H100),
        Instance(9, profile.profile_id, at),  # no MIG device: a create cut short
        Instance(10, profile.profile_id, at, mine),
        Instance(11, profile.profile_id, at, theirs),  # a complete MIG device of another
        Instance(12, profile.profile_id + 1, at),  # another profile
    ]
    assert leftovers(target, now) == [9]
    assert leftovers(target, now, mine) == [9, 10]


# -- the command end to end, against the stand-in NVML ---------------------------------------

__all__ = ["fake_lib_dir"]  # the stand-in library's fixture, shared with the backend tests

_HOST_HAS_GPU = (
    ctypes.util.find_library("nvidia-ml") is not None
    or Path("/dev/nvidiactl").exists()
    or any(Path("/dev").glob("nvidia[0-9]*"))
)
needs_no_host_gpu = pytest.mark.skipif(
    _HOST_HAS_GPU, reason="this machine has an NVIDIA driver or GPU: it cannot be hidden"
)


@dataclass
class Node:
    """A stand-in GPU node: NVML's data file, sysfs, and a driver root with nvidia-smi."""

    inventory: Inventory
    data: Path
    sysfs: Path
    root: Path
    lib_dir: Path

    def listing(self, text: str) -> None:
        """Make the driver root's nvidia-smi print ``text`` for ``-L``."""
        script = self.root / "usr" / "bin" / "nvidia-smi"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(
            "#!/bin/sh\n"
            '[ "$1" = "-L" ] || { echo "fake nvidia-smi: only -L" >&2; exit 2; }\n'
            f"cat <<'EOF'\n{text}EOF\n"
        )
        script.chmod(0o755)

    def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "DRA_"))}
        env.update(
            LD_LIBRARY_PATH=str(self.lib_dir),
            FAKE_NVML_DATA=str(self.data),
            DRA_SYSFS_ROOT=str(self.sysfs),
            DRA_DRIVER_ROOT=str(self.root),
        )
        env.update(extra)
        return subprocess.run(
            [sys.executable, "-m", "dra_driver.cli", "hw-check", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def gi_lines(self) -> list[str]:
        return [
            line for line in self.data.read_text().splitlines() if line.startswith(("gi ", "ci "))
        ]


def make_node(profile: str, tmp_path: Path, lib_dir: Path) -> Node:
    inventory = inventory_of(profile)
    data = tmp_path / "nvml.data"
    data.write_text(render.render(inventory))
    sysfs = tmp_path / "sys"
    render.render_sysfs(inventory, sysfs)
    node = Node(inventory, data, sysfs, tmp_path / "driver-root", lib_dir)
    node.listing(smi_listing(inventory))
    return node


@pytest.fixture
def mixed(tmp_path: Path, fake_lib_dir: Path) -> Node:
    return make_node("mixed", tmp_path, fake_lib_dir)


def _table(stdout: str) -> dict[str, tuple[str, str]]:
    """Check name -> (verdict, detail), from the table."""
    lines = stdout.splitlines()
    assert lines[0].split() == ["CHECK", "VERDICT", "DETAIL"]
    verdict_at = lines[0].index("VERDICT")
    detail_at = lines[0].index("DETAIL")
    return {
        line[:verdict_at].strip(): (line[verdict_at:detail_at].strip(), line[detail_at:])
        for line in lines[1:-1]
    }


def test_every_check_passes_on_the_stand_in(mixed: Node) -> None:
    result = mixed.run()
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stderr == ""
    rows = _table(result.stdout)
    assert rows == {
        "driver": (
            "ok",
            "NVIDIA driver 580.95.05, CUDA 13.0, 4 GPUs (" + rows["driver"][1].split("(")[1],
        ),
        "discovery": ("ok", "4 GPUs, 6 MIG devices, the same as nvidia-smi -L"),
        "mig gpu-0": ("ok", "NVIDIA A100-SXM4-80GB: MIG on, 3 MIG devices"),
        "mig gpu-1": ("ok", "NVIDIA H100 80GB HBM3: MIG on, 3 MIG devices"),
        "mig gpu-2": ("ok", "NVIDIA H100 80GB HBM3: MIG capable, off"),
        "mig gpu-3": ("ok", "NVIDIA L4: not MIG capable"),
        "mig-carve": ("skipped", PASS_CARVE),
        "mps": ("skipped", PASS_MPS),
        "health gpu-0": ("ok", "registered for Xid and double-bit ECC events"),
        "health gpu-1": ("ok", "registered for Xid and double-bit ECC events"),
        "health gpu-2": ("ok", "registered for Xid and double-bit ECC events"),
        "health gpu-3": ("ok", "registered for Xid and double-bit ECC events"),
    }
    # The library the loader found (through LD_LIBRARY_PATH here).
    assert rows["driver"][1].endswith(f"({mixed.lib_dir}/libnvidia-ml.so.1)")
    assert result.stdout.splitlines()[-1] == "hw-check: ok (10 ok, 2 skipped)"


def test_json_output(mixed: Node) -> None:
    result = mixed.run("-o", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "ok"
    assert [(c["check"], c["device"], c["verdict"]) for c in report["checks"]][:3] == [
        ("driver", "", "ok"),
        ("discovery", "", "ok"),
        ("mig", "gpu-0", "ok"),
    ]
    assert len(report["checks"]) == 12


def test_a_gpu_nvidia_smi_lists_and_discovery_does_not_fails(mixed: Node) -> None:
    extra = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
    mixed.listing(smi_listing(mixed.inventory) + f"GPU 4: NVIDIA H100 80GB HBM3 (UUID: {extra})\n")
    result = mixed.run()
    assert result.returncode == 1, (result.stdout, result.stderr)
    rows = _table(result.stdout)
    assert rows["discovery"] == (
        "FAIL",
        f"nvidia-smi -L lists GPU 4 {extra} that discovery does not find",
    )
    assert rows["driver"][0] == "ok" and rows["mig gpu-0"][0] == "ok"
    assert result.stdout.splitlines()[-1] == "hw-check: FAIL (1 failed, 9 ok, 2 skipped)"
    assert json.loads(mixed.run("-o", "json").stdout)["verdict"] == "fail"


def test_nvidia_smi_from_path_when_the_driver_root_has_none(mixed: Node, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.move(mixed.root / "usr" / "bin" / "nvidia-smi", bin_dir / "nvidia-smi")
    assert mixed.run(PATH=f"{bin_dir}:{os.defpath}").returncode == 0  # the script needs cat
    result = mixed.run(PATH=str(tmp_path / "nothing"))
    assert result.returncode == 1
    verdict, detail = _table(result.stdout)["discovery"]
    assert verdict == "FAIL"
    assert detail.startswith("found 4 GPUs, 6 MIG devices; cannot compare: nvidia-smi not found in")


def test_carve_creates_and_destroys_a_mig_device(mixed: Node) -> None:
    before = mixed.gi_lines()
    result = mixed.run("--carve")
    assert result.returncode == 0, (result.stdout, result.stderr)
    verdict, detail = _table(result.stdout)["mig-carve gpu-1"]
    assert verdict == "ok"
    # The A100 is full; on the H100 the 1g.10gb placement at memory slice 6 is free.
    assert detail.startswith("created gpu-1-mig-1g10gb-19-6 (MIG-") and detail.endswith(
        ") and destroyed it"
    )
    new_uuid = detail.split("(")[1].split(")")[0]
    assert new_uuid not in {m.uuid for g in mixed.inventory.gpus for m in g.mig_devices}
    # The stand-in wrote its state back (its own format, without the rendered comment) and
    # what it holds now is what was there before.
    assert not mixed.data.read_text().startswith("#")
    assert mixed.gi_lines() == before


def test_carve_that_cannot_destroy_says_how(mixed: Node) -> None:
    result = mixed.run("--carve", FAKE_NVML_FAIL="nvmlGpuInstanceDestroy")
    assert result.returncode == 1, (result.stdout, result.stderr)
    verdict, detail = _table(result.stdout)["mig-carve gpu-1"]
    assert verdict == "FAIL"
    assert "1g.10gb at memory slice 6 on gpu-1 (MIG-" in detail
    assert detail.endswith(
        "but destroying it failed: GPU GPU-"
        + detail.split("GPU GPU-")[1].split(" ")[0]
        + " GPU instance 4: NVML nvmlGpuInstanceDestroy failed: Unknown Error; destroy it by "
        "hand: nvidia-smi mig -i 1 -dci -gi 4; nvidia-smi mig -i 1 -dgi -gi 4"
    )
    # The GPU instance is there in the stand-in's state, as it would be on the GPU.
    assert "gi 4 19 6 1" in mixed.gi_lines()


def test_carve_removes_what_a_failed_create_left(mixed: Node) -> None:
    before = mixed.gi_lines()
    result = mixed.run("--carve", FAKE_NVML_FAIL="nvmlGpuInstanceCreateComputeInstance")
    assert result.returncode == 1, (result.stdout, result.stderr)
    verdict, detail = _table(result.stdout)["mig-carve gpu-1"]
    assert verdict == "FAIL"
    assert detail.startswith("creating 1g.10gb at memory slice 6 on gpu-1 failed: ")
    assert "nvmlGpuInstanceCreateComputeInstance failed: Unknown Error" in detail
    # The failed create destroyed its GPU instance itself: the check found nothing left.
    assert "removed the GPU instance" not in detail and "may remain" not in detail
    assert mixed.gi_lines() == before


def test_carve_without_a_gpu_in_mig_mode_is_skipped(tmp_path: Path, fake_lib_dir: Path) -> None:
    node = make_node("l4x4", tmp_path, fake_lib_dir)
    result = node.run("--carve")
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert _table(result.stdout)["mig-carve"] == ("skipped", "no GPU in MIG mode")


def test_discovery_failure_fails_and_skips_what_needs_it(mixed: Node) -> None:
    result = mixed.run("--carve", FAKE_NVML_FAIL="nvmlDeviceGetMemoryInfo")
    assert result.returncode == 1
    rows = _table(result.stdout)
    assert rows["driver"][0] == "ok"
    assert rows["discovery"][0] == "FAIL"
    assert rows["discovery"][1].startswith(
        "NVML discovery failed: NVML call nvmlDeviceGetMemoryInfo failed for GPU 0 (GPU-"
    )
    assert rows["mig"] == ("skipped", "needs discovery")
    assert rows["mig-carve"] == ("skipped", "needs discovery")
    assert rows["mps"] == ("skipped", PASS_MPS)
    assert rows["health gpu-3"][0] == "ok"  # it asks NVML on its own


def test_a_gpu_without_xid_events_fails_its_health_check(mixed: Node) -> None:
    l4 = mixed.inventory.gpus[3]
    # nvmlEventTypePState only.
    text = mixed.data.read_text().replace(f"gpu {l4.uuid}\n", f"gpu {l4.uuid}\nevents 0x4\n")
    mixed.data.write_text(text)
    result = mixed.run()
    assert result.returncode == 1
    rows = _table(result.stdout)
    assert rows["health gpu-3"] == (
        "FAIL",
        "does not report Xid events (supported event types 0x4): the agent cannot taint it "
        "on errors",
    )
    assert rows["health gpu-0"][0] == "ok"


def test_no_event_set_is_one_failed_health_check(mixed: Node) -> None:
    result = mixed.run(FAKE_NVML_FAIL="nvmlEventSetCreate")
    assert result.returncode == 1
    rows = _table(result.stdout)
    assert rows["health"] == ("FAIL", "cannot create an NVML event set: Unknown Error")
    assert "health gpu-0" not in rows


def test_library_from_the_driver_root(mixed: Node, tmp_path: Path) -> None:
    # A copy of the stand-in with the soname a real libnvidia-ml has, so that the project's
    # loader can preload it from the driver root; nothing on LD_LIBRARY_PATH.
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = mixed.root / "usr" / "lib64" / "libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True)
    flags = ["-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1"]
    subprocess.run(
        [cc, *flags, "-o", str(lib), str(build.SOURCE)],
        check=True,
        capture_output=True,
    )
    result = mixed.run(LD_LIBRARY_PATH=str(tmp_path / "nothing"))
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert _table(result.stdout)["driver"] == (
        "ok",
        f"NVIDIA driver 580.95.05, CUDA 13.0, 4 GPUs ({lib})",
    )


# -- no GPU ------------------------------------------------------------------------------------


@needs_no_host_gpu
def test_without_the_library_the_run_is_skipped(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    node = Node(MIXED, tmp_path / "no-data", empty, tmp_path / "driver-root", empty)
    result = node.run()
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        "skipped: no NVIDIA GPU (libnvidia-ml.so.1 not found in the driver root "
        f"{tmp_path}/driver-root or the library path)\n",
        "",
    )
    report = json.loads(node.run("-o", "json").stdout)
    assert report["verdict"] == "skipped" and report["checks"] == []


@needs_no_host_gpu
def test_driver_not_loaded_without_a_gpu_is_skipped(mixed: Node, tmp_path: Path) -> None:
    empty = tmp_path / "empty-sys"
    empty.mkdir()
    result = mixed.run(FAKE_NVML_FAIL="nvmlInitWithFlags=9", DRA_SYSFS_ROOT=str(empty))
    assert result.returncode == 0, result.stdout
    assert result.stdout == (
        "skipped: no NVIDIA GPU (nvmlInit: the NVIDIA kernel driver is not loaded)\n"
    )


@needs_no_host_gpu
def test_without_the_library_on_a_node_with_a_gpu_fails(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    function = sysfs / "bus" / "pci" / "devices" / "0000:07:00.0"
    function.mkdir(parents=True)
    (function / "vendor").write_text("0x10de\n")
    (function / "class").write_text("0x030200\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    node = Node(MIXED, tmp_path / "no-data", sysfs, tmp_path / "driver-root", empty)
    result = node.run()
    assert result.returncode == 1, result.stdout
    rows = _table(result.stdout)
    assert rows["driver"] == (
        "FAIL",
        f"libnvidia-ml.so.1 not found in the driver root {tmp_path}/driver-root or the library "
        "path; but the node shows an NVIDIA GPU: PCI 0000:07:00.0 (is the driver loaded, and "
        "--driver-root where its files are?)",
    )
    assert rows["discovery"] == ("skipped", "needs a working NVML")


def test_other_nvml_start_failures_fail(mixed: Node) -> None:
    # 4 = NVML_ERROR_NO_PERMISSION: a driver is there, and the agent could not use it.
    result = mixed.run(FAKE_NVML_FAIL="nvmlInitWithFlags=4")
    assert result.returncode == 1
    verdict, detail = _table(result.stdout)["driver"]
    assert verdict == "FAIL"
    assert detail == "NVML call nvmlInit failed: Insufficient Permissions"


def test_nvml_start_failures_say_what_to_fix_in_hw_checks_terms(mixed: Node) -> None:
    # After a driver upgrade without a reboot (18 = NVML_ERROR_LIB_RM_VERSION_MISMATCH), and
    # any other start failure: no advice meant for the agent's flags (hw-check has no
    # --backend).
    result = mixed.run(FAKE_NVML_FAIL="nvmlInitWithFlags=18")
    assert result.returncode == 1
    verdict, detail = _table(result.stdout)["driver"]
    assert (verdict, detail) == ("FAIL", init_failure(18, "").reason)
    result = mixed.run(FAKE_NVML_FAIL="nvmlInitWithFlags=999")
    assert _table(result.stdout)["driver"] == ("FAIL", "NVML call nvmlInit failed: Unknown Error")


def test_nvml_with_no_gpu_and_nothing_else_is_skipped(tmp_path: Path, fake_lib_dir: Path) -> None:
    if _HOST_HAS_GPU:
        pytest.skip("this machine has an NVIDIA GPU")
    empty = inventory_of("l4x4").model_copy(update={"gpus": ()})
    data = tmp_path / "nvml.data"
    data.write_text(render.render(empty))
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    node = Node(empty, data, sysfs, tmp_path / "driver-root", fake_lib_dir)
    result = node.run()
    assert (result.returncode, result.stdout) == (
        0,
        "skipped: no NVIDIA GPU (NVML counts no GPU)\n",
    )
