"""Device node numbers for CDI specs.

A CDI device node without type, major and minor makes the runtime stat the host path. On a GPU
node the driver fills them in from the host's /dev; a simulated node has no such files, so it
uses the numbering the NVIDIA kernel modules use (fixed majors stand in for the dynamic ones).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from dra_driver.cdi.spec import DeviceNode

Resolver = Callable[[str], DeviceNode]

NVIDIA_MAJOR = 195  # /dev/nvidia<minor> and /dev/nvidiactl (minor 255), fixed by the driver
# Dynamic on real hosts; fixed stand-ins for simulated nodes.
SIMULATED_UVM_MAJOR = 509
SIMULATED_CAPS_MAJOR = 508

_SIMULATED: list[tuple[re.Pattern[str], Callable[[re.Match[str]], tuple[int, int]]]] = [
    (re.compile(r"^/dev/nvidia(\d+)$"), lambda m: (NVIDIA_MAJOR, int(m.group(1)))),
    (re.compile(r"^/dev/nvidiactl$"), lambda m: (NVIDIA_MAJOR, 255)),
    (re.compile(r"^/dev/nvidia-uvm$"), lambda m: (SIMULATED_UVM_MAJOR, 0)),
    (re.compile(r"^/dev/nvidia-uvm-tools$"), lambda m: (SIMULATED_UVM_MAJOR, 1)),
    (
        re.compile(r"^/dev/nvidia-caps/nvidia-cap(\d+)$"),
        lambda m: (SIMULATED_CAPS_MAJOR, int(m.group(1))),
    ),
]


def plain(path: str) -> DeviceNode:
    """Just the path: the container runtime stats the host's node itself."""
    return DeviceNode(path=path)


def simulated(path: str) -> DeviceNode:
    """The device node a simulated NVIDIA node would have at ``path``."""
    for pattern, numbers in _SIMULATED:
        match = pattern.match(path)
        if match:
            major, minor = numbers(match)
            return DeviceNode(path=path, type="c", major=major, minor=minor)
    return DeviceNode(path=path)


def host(driver_root: Path = Path("/"), host_driver_root: Path | None = None) -> Resolver:
    """Resolve device nodes from the host (under the driver root) when they exist.

    ``driver_root`` is where this process sees the driver root, ``host_driver_root`` where
    the host (and so the container runtime) has it: a node found under the former is handed
    to the runtime by its path under the latter."""
    runtime_root = host_driver_root or driver_root

    def resolve(path: str) -> DeviceNode:
        relative = path.lstrip("/")
        try:
            info = os.stat(driver_root / relative)
        except OSError:
            return DeviceNode(path=path)  # the runtime will look for itself
        if not stat.S_ISCHR(info.st_mode):
            return DeviceNode(path=path)
        extra = {"host_path": str(runtime_root / relative)} if runtime_root != Path("/") else {}
        return DeviceNode(
            path=path, type="c", major=os.major(info.st_rdev), minor=os.minor(info.st_rdev), **extra
        )

    return resolve
