"""Build the stand-in ``libnvidia-ml.so.1`` from ``fakenvml.c`` into a git-ignored cache."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("fakenvml.c")
REPO_ROOT = SOURCE.parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "fakenvml"
LIBRARY_NAME = "libnvidia-ml.so.1"


class CompilerMissing(RuntimeError):
    """No C compiler on this machine."""


def build_library(cache_dir: Path = CACHE_DIR) -> Path:
    """Path of the built library; (re)builds it when missing or older than its source."""
    library = cache_dir / LIBRARY_NAME
    if library.exists() and library.stat().st_mtime >= SOURCE.stat().st_mtime:
        return library
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise CompilerMissing("gcc not found: cannot build the stand-in libnvidia-ml.so.1")
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Build under a unique name, then rename: concurrent test runs never see half a file.
    tmp = cache_dir / f".{LIBRARY_NAME}.{os.getpid()}"
    result = subprocess.run(
        [
            compiler,
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(tmp),
            str(SOURCE),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {LIBRARY_NAME} failed:\n{result.stderr}")
    tmp.replace(library)
    return library
