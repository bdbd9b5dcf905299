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

Used by the unit tests of dra_driver/gpu/container/driverfiles.py and by the real node
(``testenv/node/realnode.py`` makes its driver root with ``python -m tests.driverroot DIR``),
where tests/node/test_driver_files.py checks that a container sees each library and that its
loader resolves ``libcuda.so.1`` and ``libnvidia-ml.so.1``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
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
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
SOCKETS = ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket")


@dataclass(frozen=True)
class DriverRoot:
    root: Path
    version: str
    library_dir: Path  # where the libraries are, under root


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
) -> DriverRoot:
    """Create the driver's files under ``root`` (made if missing); needs a C compiler."""
    cc = cc or compiler()
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) to build the simulated driver libraries")
    libs = root / library_dir
    libs.mkdir(parents=True, exist_ok=True)
    for name, soname, symbol in LIBRARIES:
        real = libs / f"{name}.so.{version}"
        build_library(real, soname, symbol, cc, version)
        if soname != real.name:
            (libs / soname).symlink_to(real.name)  # as the driver's installer does
    # A previous driver's library left behind: not the loaded kernel module's version.
    build_library(libs / f"libcuda.so.{OLD_VERSION}", "libcuda.so.1", "cuInit", cc, OLD_VERSION)

    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for binary in BINARIES:
        tool = bin_dir / binary
        tool.write_text(f"#!/bin/sh\necho {binary} {version}\n")
        tool.chmod(0o755)

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
    return DriverRoot(root=root, version=version, library_dir=libs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="directory to create the driver's files in")
    parser.add_argument("--version", default=VERSION)
    args = parser.parse_args(argv)
    # Where Debian-family hosts keep the driver of this machine's architecture.
    made = make_driver_root(
        args.root, args.version, library_dir=f"usr/lib/{platform.machine()}-linux-gnu"
    )
    print(f"simulated NVIDIA driver {made.version} in {made.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
