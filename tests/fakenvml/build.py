"""Build the stand-in ``libnvidia-ml.so.1`` from ``fakenvml.c``, and the stand-in driver's
tools from ``tools/``, into a git-ignored cache (docs/standin-driver.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

SOURCE = Path(__file__).resolve().with_name("fakenvml.c")
TOOLS_DIR = SOURCE.with_name("tools")
REPO_ROOT = SOURCE.parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "fakenvml"
LIBRARY_NAME = "libnvidia-ml.so.1"
WARNINGS = ("-Wall", "-Wextra", "-Werror")
#: Each tool of the stand-in driver root: its real name -> its source under tools/.
TOOLS = {
    "nvidia-smi": "nvidia-smi.c",  # compiles fakenvml.c in
    "nvidia-cuda-mps-control": "mps-control.c",
    "nvidia-cuda-mps-server": "mps-server.c",
    "nvidia-debugdump": "debugdump.c",
    "nvidia-imex": "imex.c",
    "nvidia-imex-ctl": "imex-ctl.c",
}


class CompilerMissing(RuntimeError):
    """No C compiler on this machine."""


class StandIn(NamedTuple):
    """The stand-in driver's build products, for one driver version. (Not a dataclass: some
    tests load this file by path, without a module in ``sys.modules`` for it.)"""

    library: Path  # libnvidia-ml.so.1 (soname libnvidia-ml.so.1)
    tools: dict[str, Path]  # real tool name -> executable
    static: bool  # the tools are statically linked (else: against this machine's libc)


def find_compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise CompilerMissing("gcc not found: cannot build the stand-in NVIDIA driver")
    return compiler


def _compile(compiler: str, args: list[str], output: Path) -> None:
    """Run ``compiler args -o output``, building under a unique name and renaming it, so a
    concurrent build or test run never sees half a file."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}")
    result = subprocess.run(
        [compiler, *args, "-o", str(tmp)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {output.name} failed:\n{result.stderr}")
    tmp.replace(output)


def _fresh(products: list[Path], sources: list[Path]) -> bool:
    newest = max(s.stat().st_mtime for s in sources)
    return all(p.exists() and p.stat().st_mtime >= newest for p in products)


def build_library(cache_dir: Path = CACHE_DIR) -> Path:
    """Path of the built library; (re)builds it when missing or older than its source."""
    library = cache_dir / LIBRARY_NAME
    if _fresh([library], [SOURCE]):
        return library
    _compile(find_compiler(), ["-shared", "-fPIC", "-O1", *WARNINGS, str(SOURCE)], library)
    return library


def static_libc(compiler: str) -> bool:
    """Whether ``compiler -static`` can link: the C library's archive (libc.a) is installed."""
    found = subprocess.run(
        [compiler, "-print-file-name=libc.a"], capture_output=True, text=True, check=False
    ).stdout.strip()
    # Without it the compiler echoes the bare name back.
    return found != "libc.a" and Path(found).is_file()


def build_standin(version: str, cache_dir: Path = CACHE_DIR, cc: str | None = None) -> StandIn:
    """The stand-in libnvidia-ml (soname ``libnvidia-ml.so.1``) and tools for driver
    ``version``, (re)built when missing or older than a source.

    The tools are linked with ``-static`` when this machine has libc.a, so the same files
    run on the host and in any container that mounts them; otherwise against this machine's
    C library (``StandIn.static`` says which).
    """
    if not re.fullmatch(r"[0-9A-Za-z._-]+", version):
        raise ValueError(f"driver version {version!r}: letters, digits, '.', '_' and '-' only")
    compiler = cc or find_compiler()
    static = static_libc(compiler)
    out = cache_dir / f"standin-{version}-{'static' if static else 'dynamic'}"
    library = out / LIBRARY_NAME
    tools = {name: out / "bin" / name for name in TOOLS}
    sources = [SOURCE, Path(__file__).resolve(), *sorted(TOOLS_DIR.glob("*.[ch]"))]
    standin = StandIn(library=library, tools=tools, static=static)
    if _fresh([library, *tools.values()], sources):
        return standin
    _compile(
        compiler,
        [
            "-shared",
            "-fPIC",
            "-O1",
            *WARNINGS,
            f"-Wl,-soname,{LIBRARY_NAME}",
            f'-DFAKE_NVML_VERSION="{version}"',
            str(SOURCE),
        ],
        library,
    )
    for name, source in TOOLS.items():
        _compile(
            compiler,
            [
                "-O1",
                *WARNINGS,
                *(["-static"] if static else []),
                f"-I{SOURCE.parent}",
                f'-DSTANDIN_DRIVER_VERSION="{version}"',
                f'-DFAKE_NVML_VERSION="{version}"',
                str(TOOLS_DIR / source),
            ],
            tools[name],
        )
    return standin
