"""CDI specs bring the driver's files themselves: found under a simulated driver root.

The driver root is made by tests/driverroot.py (real shared objects with the real names and
sonames). Whether a container's loader then resolves them is the real-node tier's test.
"""

from __future__ import annotations

import ctypes
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.agent import driver_files
from dra_driver.cdi.spec import NO_EDITS, ContainerEdits
from dra_driver.gpu import driverroot
from dra_driver.gpu.allocation import AllocatedDevice
from dra_driver.gpu.container import ctk, driverfiles
from dra_driver.gpu.container.claim_spec import build_claim_spec
from dra_driver.gpu.container.elf import soname
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.settings import Settings
from tests.driverroot import (
    BINARIES,
    FIRMWARE,
    LIBRARIES,
    OLD_VERSION,
    VERSION,
    DriverRoot,
    compiler,
    make_driver_root,
)
from tests.unit.cdi_schema import schema_errors

HOST_ROOT = Path("/run/nvidia/driver")
TRIPLET_DIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def short_tmp() -> Iterator[Path]:
    """Unix socket paths are limited to 108 bytes: keep the root's path short."""
    path = Path(tempfile.mkdtemp(prefix="drv", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def driver_root(short_tmp: Path) -> DriverRoot:
    if compiler() is None:
        pytest.skip("no C compiler for the simulated driver libraries")
    return make_driver_root(short_tmp / "deb")


def mounts_by_target(edits: ContainerEdits) -> dict[str, tuple[str, tuple[str, ...]]]:
    targets = [m.container_path for m in edits.mounts]
    assert len(targets) == len(set(targets)), "a container path mounted twice"
    return {m.container_path: (m.host_path, m.options) for m in edits.mounts}


def test_soname_of_real_and_other_files(driver_root: DriverRoot, tmp_path: Path) -> None:
    assert soname(driver_root.library_dir / f"libcuda.so.{VERSION}") == "libcuda.so.1"
    assert soname(driver_root.library_dir / f"libnvidia-nvvm.so.{VERSION}") == "libnvidia-nvvm.so.4"
    (tmp_path / "text").write_text("not an ELF file")
    truncated = tmp_path / "truncated"
    truncated.write_bytes((driver_root.library_dir / f"libcuda.so.{VERSION}").read_bytes()[:80])
    assert soname(tmp_path / "text") is None
    assert soname(truncated) is None
    assert soname(tmp_path / "absent") is None


def test_files_of_the_kernel_module_version(driver_root: DriverRoot) -> None:
    files = driverfiles.find_driver_files(driver_root.root, machine="x86_64")
    assert files.version == VERSION  # from /proc/driver/nvidia/version
    by_name = {lib.names[0]: lib for lib in files.libraries}
    assert set(by_name) == {f"{name}.so.{VERSION}" for name, _, _ in LIBRARIES}
    assert f"libcuda.so.{OLD_VERSION}" not in by_name
    assert by_name[f"libcuda.so.{VERSION}"].names == (
        f"libcuda.so.{VERSION}",
        "libcuda.so.1",
        "libcuda.so",
    )
    assert by_name[f"libnvidia-ml.so.{VERSION}"].names[1:] == (
        "libnvidia-ml.so.1",
        "libnvidia-ml.so",
    )
    assert by_name[f"libnvidia-nvvm.so.{VERSION}"].names[1:] == ("libnvidia-nvvm.so.4",)
    # The soname equals the file name: no second name.
    assert by_name[f"libnvidia-gpucomp.so.{VERSION}"].names == (f"libnvidia-gpucomp.so.{VERSION}",)
    assert {b.name for b in files.binaries} == set(BINARIES)
    assert {f.name for f in files.firmware} == set(FIRMWARE)
    assert [target for _, target in files.sockets] == list(driverfiles.SOCKETS)


def test_edits_mount_every_name_where_any_loader_looks(driver_root: DriverRoot) -> None:
    files = driverfiles.find_driver_files(driver_root.root, machine="x86_64")
    edits = driverfiles.driver_edits(files, driver_root.root, HOST_ROOT, machine="x86_64")
    mounts = mounts_by_target(edits)
    for directory in (TRIPLET_DIR, "/usr/lib64"):
        for name in ("libcuda.so.1", "libcuda.so", f"libcuda.so.{VERSION}", "libnvidia-ml.so.1"):
            host, options = mounts[f"{directory}/{name}"]
            assert options == ("ro", "nosuid", "nodev", "bind")
            assert host.startswith(f"{HOST_ROOT}/usr/lib/x86_64-linux-gnu/")
            # Every name is a bind of the real file of the driver's version, never the link.
            agent_view = driver_root.root / Path(host).relative_to(HOST_ROOT)
            assert not agent_view.is_symlink() and agent_view.name.endswith(VERSION)
            assert soname(agent_view) == name.split(".so")[0] + ".so.1"
    assert mounts["/usr/bin/nvidia-smi"] == (
        f"{HOST_ROOT}/usr/bin/nvidia-smi",
        driverfiles.READ_ONLY,
    )
    assert mounts[f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"][0] == (
        f"{HOST_ROOT}/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"
    )
    assert mounts["/run/nvidia-persistenced/socket"] == (
        f"{HOST_ROOT}/run/nvidia-persistenced/socket",
        driverfiles.SOCKET_OPTIONS,
    )


def test_the_soname_mount_is_a_loadable_library(driver_root: DriverRoot) -> None:
    """What a program gets when it opens libcuda.so.1 / libnvidia-ml.so.1: the driver's
    library of the right version, exporting the entry point."""
    files = driverfiles.find_driver_files(driver_root.root, machine="x86_64")
    edits = driverfiles.driver_edits(files, driver_root.root, driver_root.root, machine="x86_64")
    mounts = mounts_by_target(edits)
    for name, symbol in (("libcuda.so.1", "cuInit"), ("libnvidia-ml.so.1", "nvmlInit_v2")):
        host, _ = mounts[f"{TRIPLET_DIR}/{name}"]
        library = ctypes.CDLL(host)
        assert getattr(library, symbol)() == 0
        library.simulated_driver_version.restype = ctypes.c_char_p
        assert library.simulated_driver_version() == VERSION.encode()
        assert soname(Path(host)) == name


def test_red_hat_layout_and_absolute_links(short_tmp: Path) -> None:
    if compiler() is None:
        pytest.skip("no C compiler")
    made = make_driver_root(short_tmp / "rhel", library_dir="usr/lib64", sockets=False)
    # A driver container's root with absolute links (resolved inside the root, not the agent's).
    lib64 = made.library_dir
    real = lib64 / f"libnvidia-ml.so.{VERSION}"
    moved = made.root / "opt" / real.name
    moved.parent.mkdir()
    real.rename(moved)
    real.symlink_to(f"/opt/{real.name}")
    files = driverfiles.find_driver_files(made.root, machine="aarch64")
    by_name = {lib.names[0]: lib for lib in files.libraries}
    assert by_name[real.name].path == moved
    edits = driverfiles.driver_edits(files, made.root, Path("/"), machine="aarch64")
    mounts = mounts_by_target(edits)
    assert mounts["/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"][0] == f"/opt/{real.name}"
    assert mounts["/usr/lib64/libcuda.so.1"][0] == f"/usr/lib64/libcuda.so.{VERSION}"
    assert files.sockets == ()


def test_without_a_known_version_nothing_is_mounted(tmp_path: Path) -> None:
    assert driverfiles.find_driver_files(tmp_path).libraries == ()
    assert driverfiles.discover_edits(tmp_path) == ContainerEdits()


def test_a_given_version_wins_over_the_proc_file(driver_root: DriverRoot) -> None:
    files = driverfiles.find_driver_files(driver_root.root, OLD_VERSION, machine="x86_64")
    assert [lib.names[0] for lib in files.libraries] == [f"libcuda.so.{OLD_VERSION}"]


def test_without_nvidia_ctk_the_agent_mounts_what_it_found(
    driver_root: DriverRoot, tmp_path: Path
) -> None:
    edits = ctk.common_edits(
        str(driver_root.root), executable=str(tmp_path / "missing"), host_root=HOST_ROOT
    )
    assert f"{HOST_ROOT}/usr/bin/nvidia-smi" in {m.host_path for m in edits.mounts}
    # The claim's spec carries them, and stays valid CDI.
    inventory = SimulatedDiscovery("l4x4", "n1").discover()
    device = AllocatedDevice(requests=("gpu",), device_name="gpu-0", gpu=inventory.gpus[0])
    spec = build_claim_spec("uid", [device], common=edits).to_json()
    assert schema_errors(spec) == []
    targets = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert {f"{TRIPLET_DIR}/libcuda.so.1", f"{TRIPLET_DIR}/libnvidia-ml.so.1"} <= targets


@pytest.mark.parametrize("backend", ["simulated", "nvml"])
def test_the_agent_mounts_a_driver_roots_files_with_either_backend(
    driver_root: DriverRoot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Simulated GPUs get the driver's files too when the driver root has a driver (the
    real-node tier's simulated driver root); the kernel module's version picks them."""

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-ctk
    settings = Settings(
        backend=backend,  # type: ignore[arg-type]
        driver_root=driver_root.root,
        host_driver_root=HOST_ROOT,
        node_name="n1",
    )
    inventory = SimulatedDiscovery("l4x4", "n1").discover()
    inventory = inventory.model_copy(update={"driver_version": driver_root.version})
    targets = {m.container_path for m in driver_files(settings, inventory).mounts}
    assert f"{TRIPLET_DIR}/libcuda.so.1" in targets


def test_simulated_gpus_without_a_driver_get_no_driver_files(tmp_path: Path) -> None:

    settings = Settings(backend="simulated", driver_root=tmp_path, node_name="n1")
    inventory = SimulatedDiscovery("l4x4", "n1").discover()
    assert driver_files(settings, inventory) == NO_EDITS


def test_a_relative_link_climbing_past_the_root_stays_inside_it(tmp_path: Path) -> None:
    """On the host ``..`` at ``/`` stays at ``/``: a link with more ``..`` than its depth
    still names a file of the driver root, never one of the agent's filesystem."""
    root = tmp_path / "root"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {VERSION}  Release Build\n"
    )
    real = root / "opt/nvidia/bin/nvidia-smi"
    real.parent.mkdir(parents=True)
    real.write_text("#!/bin/sh\n")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").symlink_to("../" * 20 + "opt/nvidia/bin/nvidia-smi")
    assert driverfiles.resolve_in(root, root / "usr/bin/nvidia-smi") == real
    files = driverfiles.find_driver_files(root, machine="x86_64")
    assert files.binaries == (root / "usr/bin/nvidia-smi",)
    mounts = mounts_by_target(driverfiles.driver_edits(files, root, HOST_ROOT, machine="x86_64"))
    assert mounts["/usr/bin/nvidia-smi"][0] == f"{HOST_ROOT}/opt/nvidia/bin/nvidia-smi"


def test_a_tools_preloaded_library_is_the_driver_roots_through_absolute_links(
    tmp_path: Path,
) -> None:
    """A driver container's root links to its own absolute paths (as
    test_red_hat_layout_and_absolute_links): the library a tool of the root gets preloaded
    (the agent's NVML, the MPS daemon started on the host) is the root's file, found and
    named inside the root, never the file the link names in the agent's or the host's ``/``."""
    root = tmp_path / "root"
    real = root / "opt" / f"libnvidia-ml.so.{VERSION}"
    real.parent.mkdir(parents=True)
    real.write_bytes(b"\x7fELF")
    (root / "usr/lib64").mkdir(parents=True)
    (root / "usr/lib64" / driverroot.NVML).symlink_to(f"/opt/{real.name}")
    assert driverroot.find_library(root, driverroot.NVML) == real
    env = driverroot.tool_env(root, seen_as=HOST_ROOT)
    assert env["LD_PRELOAD"] == f"{HOST_ROOT}/opt/{real.name}"
