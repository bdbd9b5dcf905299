"""Where an NVIDIA driver root keeps its tools and libraries, and how a tool run from it
finds the driver's libraries.

A driver root is often a whole root filesystem: the chart mounts the host's ``/`` (or the
GPU Operator's ``/run/nvidia/driver``), whose library directories hold that system's own
libc. Pointing ``LD_LIBRARY_PATH`` at them would load that libc under the dynamic loader of
the system the tool runs on; when the two differ the tool fails before ``main``. So a tool
gets the NVIDIA libraries it opens by name preloaded by path (``LD_PRELOAD``: a later open of
the same soname gets the loaded one), and nothing else of the driver root.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

#: Where driver installations put their tools, relative to the driver root.
BIN_DIRS = ("usr/bin", "usr/local/bin", "bin")
#: Where they put their libraries, relative to the driver root.
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib",
)
NVML = "libnvidia-ml.so.1"
CUDA = "libcuda.so.1"


def resolve_in(root: Path, path: Path, limit: int = 40) -> Path:
    """Follow symlinks as if ``root`` were ``/``: an absolute link target stays inside it."""
    for _ in range(limit):
        if not path.is_symlink():
            return path
        target = Path(path.readlink())
        if not path.parent.is_relative_to(root):
            joined = path.parent / target  # not under the root: nothing to keep it in
            path = Path(os.path.normpath(joined))
            continue
        # Resolved as the host would, from the root's "/": an absolute target starts there,
        # and ".." at "/" stays there (normpath drops it), so no link leads out of the root.
        inside = os.path.normpath(Path("/") / path.parent.relative_to(root) / target)
        path = root / inside.lstrip("/")
    return path


def find_library(driver_root: Path, name: str) -> Path | None:
    """The library ``name`` in the driver root's library directories, or None. Links are
    followed inside the root (a driver container's point at its own absolute paths): the
    file returned is the root's, whoever opens it."""
    for directory in LIBRARY_DIRS:
        candidate = resolve_in(driver_root, driver_root / directory / name)
        if candidate.exists():
            return candidate
    return None


def tool_env(
    driver_root: Path, libraries: Sequence[str] = (NVML,), seen_as: Path | None = None
) -> dict[str, str]:
    """The variables a tool of the driver root needs: its tool directories first in ``PATH``
    and ``libraries`` preloaded from it. ``seen_as`` is where the tool's process sees the
    driver root (the host's path for a process started on the host). None for the root
    ``/``: the system's own loader configuration finds the driver there."""
    if driver_root == Path("/"):
        return {}
    root = seen_as or driver_root
    found = (find_library(driver_root, name) for name in libraries)
    preload = [str(root / lib.relative_to(driver_root)) for lib in found if lib is not None]
    path = [*(str(root / d) for d in BIN_DIRS), *os.environ.get("PATH", "").split(":")]
    env = {"PATH": ":".join(d for d in path if d)}
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    return env
