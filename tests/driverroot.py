"""A simulated NVIDIA driver root: the files a real driver installs, made by the tests.

The libraries are real shared objects (built with the C compiler) with the real file names
(``libcuda.so.<version>``) and sonames (``libcuda.so.1``), each exporting the function a
program would look up first (``cuInit``, ``nvmlInit_v2``, ...) returning 0, and
``simulated_driver_version()`` returning the version it was built as (so a program can tell
which file the loader gave it: the leftover of an older driver has the same soname). Next to
them are
the soname symlinks a driver install creates, an older driver's leftover that must be
ignored, the tools as shell scripts, GSP firmware, ``/proc/driver/nvidia/version`` and the
daemons' unix sockets.

With ``--nvml STATE_DIR`` it is the stand-in driver (docs/standin-driver.md):
``libnvidia-ml.so.<version>`` is the stand-in NVML (tests/fakenvml/fakenvml.c) and the tools are
ELF programs built from tests/fakenvml/tools/ (``nvidia-smi`` with the stand-in NVML compiled
in, an MPS control daemon and server), statically linked where libc.a is installed. The GPUs are
a simulated profile's (default ``mixed``), rendered into ``STATE_DIR/nvml-data``; STATE_DIR
also gets the empty ``events`` and ``health`` files a test writes to inject faults, and the
GPUs' sysfs entries under ``sys/`` (for ``DRA_SYSFS_ROOT``). A program uses it with
``FAKE_NVML_DATA=STATE_DIR/nvml-data FAKE_NVML_EVENTS=STATE_DIR/events
FAKE_NVML_HEALTH=STATE_DIR/health``.

Used by the unit tests of dra_driver/gpu/container/driverfiles.py and tests/unit/
test_standin_driver.py, and by the real node (``testenv/node/realnode.py`` makes its driver
root with ``python -m tests.driverroot DIR [--nvml STATE_DIR]``), where
tests/node/test_driver_files.py checks that a container sees each library and that its loader
resolves ``libcuda.so.1`` and ``libnvidia-ml.so.1``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

VERSION = "580.95.05"
OLD_VERSION = "535.104.05"

#: Library, soname, the symbol it exports.
LIBRARIES = (
    ("libcuda", "libcuda.so.1", "cuInit"),
    ("libnvidia-ml", "libnvidia-ml.so.1", "nvmlInit_v2"),
    ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1", "__cudaPtxJitCompile"),
    ("libnvidia-nvvm", "libnvidia-nvvm.so.4", "nvvmVersion"),
    ("libnvidia-gpucomp", "libnvidia-gpucomp.so." + VERSION, "gpucompInit"),
    ("libcudadebugger", "libcudadebugger.so.1", "cudbgInit"),
    ("libnvidia-cfg", "libnvidia-cfg.so.1", "nvCfgOpenDevice"),
    ("libnvidia-opencl", "libnvidia-opencl.so.1", "clGetPlatformIDs"),
    ("libnvcuvid", "libnvcuvid.so.1", "cuvidCreateDecoder"),
    ("libnvidia-encode", "libnvidia-encode.so.1", "NvEncodeAPICreateInstance"),
)
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
#: The IMEX daemon and its control tool (the nvidia-imex package puts them in /usr/bin next to
#: the driver's tools): only in the stand-in driver root, and not among the tools a claim's
#: container gets.
IMEX_BINARIES = ("nvidia-imex", "nvidia-imex-ctl")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
SOCKETS = ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket")
#: The stand-in's defaults: the real-node tier's profile and node (testenv/node/nodeconfig.py);
#: the simulated backend derives the GPUs' UUIDs from the node name.
PROFILE = "mixed"
NODE_NAME = "dra-node-0"
#: The stand-in's mutable state, in its STATE_DIR.
NVML_DATA = "nvml-data"
NVML_EVENTS = "events"
NVML_HEALTH = "health"
NVML_FAIL = "fail"
SYSFS_DIR = "sys"


@dataclass(frozen=True)
class DriverRoot:
    root: Path
    version: str
    library_dir: Path  # where the libraries are, under root
    nvml_state: Path | None = None  # the stand-in's STATE_DIR (--nvml), else None
    static_tools: bool = False  # the stand-in's tools are statically linked


def nvml_env(state: Path) -> dict[str, str]:
    """The environment that points the stand-in NVML (and nvidia-smi) at ``state``."""
    return {
        "FAKE_NVML_DATA": str(state / NVML_DATA),
        "FAKE_NVML_EVENTS": str(state / NVML_EVENTS),
        "FAKE_NVML_HEALTH": str(state / NVML_HEALTH),
        "FAKE_NVML_FAIL_FILE": str(state / NVML_FAIL),
    }


def write_nvml_state(
    state: Path, version: str = VERSION, profile: str = PROFILE, node_name: str = NODE_NAME
) -> list[int]:
    """The stand-in's STATE_DIR: the simulated ``profile``'s GPUs as the stand-in NVML's data
    file (driver ``version``, as the driver root's), empty events and health files, and the
    GPUs' PCIe root and NUMA node as a sysfs tree."""
    # Imported here: the driver root without --nvml needs nothing but the standard library.
    from dra_driver.gpu.discovery.simulated import build_inventory, load_profile
    from tests.fakenvml.render import render, render_sysfs

    inventory = build_inventory(load_profile(profile), node_name)
    inventory = inventory.model_copy(update={"driver_version": version})
    state.mkdir(parents=True, exist_ok=True)
    data = state / NVML_DATA
    tmp = data.with_name(f".{data.name}.{os.getpid()}")
    tmp.write_text(render(inventory))
    tmp.replace(data)
    for name in (NVML_EVENTS, NVML_HEALTH, NVML_FAIL):
        (state / name).write_text("")
    render_sysfs(inventory, state / SYSFS_DIR)
    return [gpu.minor for gpu in inventory.gpus]


#: Majors of the kernel modules' device nodes: nvidia's is fixed, nvidia-uvm's and
#: nvidia-caps' are dynamic (these are the numbers simulated nodes use).
NVIDIA_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 509, 508
#: The IMEX channels' major (dynamic on a GPU node): the simulated backend's stand-in.
IMEX_CHANNELS_MAJOR = 507
#: The nvidia-caps minor of the IMEX daemon's fabric-imex-mgmt capability (past the MIG
#: table's minors; the compute domain plugin gives the daemon the device with it).
IMEX_MGMT_MINOR = 4095
#: /proc/driver/nvidia-caps/mig-minors: after config and monitor, 15 GPU instances per GPU,
#: each an access minor followed by the minors of its 8 compute instances.
GIS_PER_GPU, CIS_PER_GI = 15, 8


def mig_minors(gpu_minors: Sequence[int]) -> dict[str, int]:
    """The ``mig-minors`` table of GPUs ``gpu_minors``, as the nvidia-caps module lays it out."""
    table = {"config": 1, "monitor": 2}
    for gpu in gpu_minors:
        for gi in range(GIS_PER_GPU):
            access = 3 + (gpu * GIS_PER_GPU + gi) * (1 + CIS_PER_GI)
            table[f"gpu{gpu}/gi{gi}/access"] = access
            for ci in range(CIS_PER_GI):
                table[f"gpu{gpu}/gi{gi}/ci{ci}/access"] = access + 1 + ci
    return table


def make_device_nodes(root: Path, gpu_minors: Sequence[int]) -> None:
    """The driver's device nodes under ``root/dev``, and under ``root/proc`` the MIG capability
    table, the IMEX daemon's fabric-imex-mgmt capability and the character device majors, as
    a driver root mounted from a driver container has them; the agent reads their numbers and
    hands the runtime their host paths. Device nodes need root (skipped
    otherwise: the table is still written)."""
    table = mig_minors(gpu_minors)
    caps = root / "proc/driver/nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    (caps / "mig-minors").write_text("".join(f"{k} {v}\n" for k, v in table.items()))
    # The capability file the driver makes on an IMEX-capable node (mode 0444, as decimal).
    capabilities = root / "proc/driver/nvidia/capabilities"
    capabilities.mkdir(parents=True, exist_ok=True)
    (capabilities / "fabric-imex-mgmt").write_text(
        f"DeviceFileMinor: {IMEX_MGMT_MINOR}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    )
    # The host's character device majors, where the compute domain plugin reads the IMEX
    # channels' (the host's own /proc/devices has no NVIDIA driver here).
    majors = {
        NVIDIA_MAJOR: "nvidia-frontend",
        UVM_MAJOR: "nvidia-uvm",
        CAPS_MAJOR: "nvidia-caps",
        IMEX_CHANNELS_MAJOR: "nvidia-caps-imex-channels",
    }
    (root / "proc/devices").write_text(
        "Character devices:\n"
        + "".join(f"{major:3d} {name}\n" for major, name in sorted(majors.items()))
        + "\nBlock devices:\n"
    )
    if os.geteuid() != 0:
        return
    nodes = {f"nvidia{m}": (NVIDIA_MAJOR, m) for m in gpu_minors}
    nodes |= {
        "nvidiactl": (NVIDIA_MAJOR, 255),
        "nvidia-uvm": (UVM_MAJOR, 0),
        "nvidia-uvm-tools": (UVM_MAJOR, 1),
    }
    nodes |= {f"nvidia-caps/nvidia-cap{n}": (CAPS_MAJOR, n) for n in table.values()}
    for name, (major, minor) in nodes.items():
        path = root / "dev" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.mknod(path, stat.S_IFCHR, os.makedev(major, minor))
            path.chmod(0o666)  # as the driver makes them (mknod's mode is masked)


def _install(source: Path, target: Path) -> None:
    """Copy an executable or library into place by renaming a copy over it: a process still
    running (or mapping) the old file keeps it."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copyfile(source, tmp)
    tmp.chmod(0o755)
    tmp.replace(target)


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def build_library(path: Path, soname: str, symbol: str, cc: str, version: str = VERSION) -> None:
    """A shared object with ``soname`` that exports ``int symbol(void)`` returning 0 and
    ``const char *simulated_driver_version(void)`` returning ``version``."""
    source = path.with_suffix(".c")
    source.write_text(
        f"int {symbol}(void) {{ return 0; }}\n"
        f'const char *simulated_driver_version(void) {{ return "{version}"; }}\n'
    )
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(path), f"-Wl,-soname,{soname}", str(source)],
        check=True,
        capture_output=True,
    )
    source.unlink()


def make_driver_root(
    root: Path,
    version: str = VERSION,
    *,
    library_dir: str = "usr/lib/x86_64-linux-gnu",
    cc: str | None = None,
    sockets: bool = True,
    nvml_state: Path | None = None,
    profile: str = PROFILE,
    node_name: str = NODE_NAME,
) -> DriverRoot:
    """Create the driver's files under ``root`` (made if missing); needs a C compiler.

    With ``nvml_state`` it is the stand-in driver: the stand-in libnvidia-ml and tools, the
    simulated ``profile``'s GPUs (on node ``node_name``) in ``nvml_state`` (see
    :func:`write_nvml_state`).
    """
    cc = cc or compiler()
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) to build the simulated driver libraries")
    standin = None
    if nvml_state is not None:
        from tests.fakenvml.build import build_standin

        standin = build_standin(version, cc=cc)
        make_device_nodes(root, write_nvml_state(nvml_state, version, profile, node_name))
    libs = root / library_dir
    libs.mkdir(parents=True, exist_ok=True)
    for name, soname, symbol in LIBRARIES:
        real = libs / f"{name}.so.{version}"
        if standin is not None and soname == standin.library.name:
            _install(standin.library, real)
        else:
            build_library(real, soname, symbol, cc, version)
        if soname != real.name:
            (libs / soname).symlink_to(real.name)  # as the driver's installer does
    # A previous driver's library left behind: not the loaded kernel module's version.
    build_library(libs / f"libcuda.so.{OLD_VERSION}", "libcuda.so.1", "cuInit", cc, OLD_VERSION)

    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for binary in BINARIES:
        tool = bin_dir / binary
        if standin is not None:
            _install(standin.tools[binary], tool)
            continue
        tool.write_text(f"#!/bin/sh\necho {binary} {version}\n")
        tool.chmod(0o755)
    if standin is not None:
        for binary in IMEX_BINARIES:
            _install(standin.tools[binary], bin_dir / binary)

    firmware = root / "lib/firmware/nvidia" / version
    firmware.mkdir(parents=True, exist_ok=True)
    for blob in FIRMWARE:
        (firmware / blob).write_bytes(b"\0" * 64)

    proc = root / "proc/driver/nvidia"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build\n"
        "GCC version:  gcc version 12.2.0\n"
    )

    if sockets:
        for relative in SOCKETS:
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with socket.socket(socket.AF_UNIX) as server:
                server.bind(str(path))  # the file stays after close, as a daemon's would
    return DriverRoot(
        root=root,
        version=version,
        library_dir=libs,
        nvml_state=nvml_state,
        static_tools=standin is not None and standin.static,
    )


def _one_line(exc: Exception) -> str:
    """An error as one line: its first, and the compiler's first error when it has one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [repr(exc)]
    error = next((line for line in lines[1:] if "error" in line), None)
    return f"{lines[0]} {error}" if error else lines[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="directory to create the driver's files in")
    parser.add_argument("--version", default=VERSION)
    parser.add_argument(
        "--nvml",
        type=Path,
        metavar="STATE_DIR",
        help="the stand-in driver (NVML, nvidia-smi, MPS) with its mutable state in STATE_DIR",
    )
    parser.add_argument(
        "--profile", default=PROFILE, help=f"simulated node profile (--nvml; default {PROFILE})"
    )
    parser.add_argument(
        "--node-name",
        default=NODE_NAME,
        help=f"node the profile's UUIDs derive from (--nvml; default {NODE_NAME})",
    )
    args = parser.parse_args(argv)
    try:
        # Where Debian-family hosts keep the driver of this machine's architecture.
        made = make_driver_root(
            args.root,
            args.version,
            library_dir=f"usr/lib/{platform.machine()}-linux-gnu",
            nvml_state=args.nvml.absolute() if args.nvml else None,
            profile=args.profile,
            node_name=args.node_name,
        )
    except Exception as exc:  # one line, whatever went wrong
        print(f"driverroot: {_one_line(exc)}", file=sys.stderr)
        return 1
    if made.nvml_state is None:
        print(f"simulated NVIDIA driver {made.version} in {made.root}")
    else:
        linked = "" if made.static_tools else " (tools linked dynamically: no libc.a)"
        print(
            f"stand-in NVIDIA driver {made.version} in {made.root}, "
            f"NVML state in {made.nvml_state}{linked}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
