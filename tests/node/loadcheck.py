"""What a container's dynamic loader makes of the driver libraries a CDI spec mounts.

Two programs built on the host from ``loadcheck.c`` (`build`) run in a glibc container with
`script`, which prints each check between ``CHECK-<NAME>`` lines; `sections`, `loaded` and
`search_of` read that output back. Used by tests/node/test_driver_files.py; the parsers are
also run against the programs on the host by tests/unit/test_realnode.py.
"""

from __future__ import annotations

import platform
import shlex
import subprocess
from pathlib import Path

from tests.driverroot import LIBRARIES, SOCKETS, VERSION

SOURCE = Path(__file__).with_name("loadcheck.c")
CHECK_DIR = "/opt/loadcheck"  # where the programs are mounted in the container
TRIPLET_DIR = f"/usr/lib/{platform.machine()}-linux-gnu"
#: The glibc system directories of Debian- and Red Hat-family images (docs/cdi.md).
LIBRARY_DIRS = (TRIPLET_DIR, "/usr/lib64")
#: The libraries also mounted under their development name (docs/cdi.md).
DEV_NAMES = ("libcuda", "libnvidia-ml")
#: What the programs load, and the entry point they call in each.
LOADED = {"libcuda.so.1": "cuInit", "libnvidia-ml.so.1": "nvmlInit_v2"}
SECTIONS = ("HASHES", "LIST", "LDCONFIG", "DLOPEN", "LINKED", "TRACE", "TOOLS", "ENV", "MOUNTS")


def build(out: Path, library_dir: Path) -> None:
    """``dlopen-check`` and ``linked-check`` in `out`; the latter linked against the driver
    libraries' soname links in `library_dir`, without a run path: where they run, the loader
    has only its own search to find them."""
    out.mkdir(parents=True, exist_ok=True)
    cc = ["gcc", "-O1", "-Wall", "-Werror", str(SOURCE)]
    linked = ["-DLINKED", f"-L{library_dir}", "-l:libcuda.so.1", "-l:libnvidia-ml.so.1"]
    for argv in (
        [*cc, "-o", str(out / "dlopen-check"), "-ldl"],
        [*cc, *linked, "-o", str(out / "linked-check"), "-ldl"],
    ):
        subprocess.run(argv, check=True, capture_output=True, text=True)


def expected_libraries(library_dir: Path, version: str = VERSION) -> dict[str, Path]:
    """Every path a container must see -> the driver root's file of the kernel's version."""
    out: dict[str, Path] = {}
    for name, soname, _ in LIBRARIES:
        real = library_dir / f"{name}.so.{version}"
        names = {real.name, soname} | ({f"{name}.so"} if name in DEV_NAMES else set())
        out |= {f"{d}/{n}": real for d in LIBRARY_DIRS for n in names}
    return out


def script(paths: list[str], check_dir: str = CHECK_DIR, *, wait: bool = True) -> str:
    """What the container runs: each check between ``CHECK-<NAME>`` lines, then (`wait`) it
    waits to be deleted."""
    loaded = " ".join(f"{soname}:{symbol}" for soname, symbol in LOADED.items())
    patterns = " ".join(f"{d}/{p}*" for d in LIBRARY_DIRS for p in ("libcuda", "libnv"))
    sockets = " ".join(f"/{s}" for s in SOCKETS)
    return "; ".join(
        [
            "echo CHECK-HASHES",
            f"sha256sum {' '.join(shlex.quote(p) for p in paths)} 2>&1",
            "echo CHECK-LIST",
            f'for f in {patterns}; do [ -e "$f" ] && echo "$f"; done',
            "echo CHECK-LDCONFIG",
            "ldconfig -p 2>&1",
            "echo CHECK-DLOPEN",
            f"{check_dir}/dlopen-check {loaded} 2>&1",
            'echo "exit=$?"',
            "echo CHECK-LINKED",
            f"{check_dir}/linked-check 2>&1",
            'echo "exit=$?"',
            "echo CHECK-TRACE",
            # The loader's own account of its search, in a file of its own.
            "trace=$(mktemp -d)",
            f'LD_DEBUG=libs LD_DEBUG_OUTPUT="$trace/ld" {check_dir}/dlopen-check {loaded} >/dev/null',
            'cat "$trace"/ld.*',
            "echo CHECK-TOOLS",
            "nvidia-smi --version 2>&1",
            f"ls /lib/firmware/nvidia/{VERSION}/ 2>&1",
            f'for s in {sockets}; do [ -S "$s" ] && echo "socket $s"; done',
            "echo CHECK-ENV",
            "env | sort",
            "echo CHECK-MOUNTS",
            "cat /proc/mounts",
            "echo CHECK-END",
        ]
        + (["trap 'exit 0' TERM", "while true; do sleep 1; done"] if wait else [])
    )


def sections(log: str) -> dict[str, list[str]]:
    """The output of `script` split at its ``CHECK-<NAME>`` lines."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in log.splitlines():
        name = line.removeprefix("CHECK-")
        if line.startswith("CHECK-") and name in (*SECTIONS, "END"):
            current = out.setdefault(name, [])
        elif current is not None:
            current.append(line)
    if "END" not in out:
        raise ValueError(f"incomplete output:\n{log}")
    return out


def loaded(lines: list[str]) -> dict[str, dict[str, str]]:
    """``LOADED <soname> key=value...`` lines of loadcheck.c -> soname -> fields."""
    out = {}
    for line in lines:
        if line.startswith("LOADED "):
            _, soname, *fields = line.split()
            out[soname] = dict(f.split("=", 1) for f in fields)
    return out


def search_of(trace: list[str], soname: str) -> list[str]:
    """The loader's ``LD_DEBUG=libs`` lines (``<pid>: <message>``) of its search for
    `soname`, up to the next library's; [] when it did not search for it."""
    lines = [line.split(":", 1)[-1].strip() for line in trace]
    start = f"find library={soname} [0]; searching"
    if start not in lines:
        return []
    rest = lines[lines.index(start) + 1 :]
    end = next((i for i, line in enumerate(rest) if line.startswith("find library=")), len(rest))
    return rest[:end]
