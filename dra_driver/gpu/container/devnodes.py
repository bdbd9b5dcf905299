"""Device node numbers for CDI specs.

A CDI device node without type, major and minor makes the runtime stat the host path. On a GPU
node the driver fills them in from the host's /dev; a simulated node has no such files, so it
uses the numbering the NVIDIA kernel modules use (fixed majors stand in for the dynamic ones).

A node the host's /dev lacks still gets its numbers when the kernel knows them: the majors of
``nvidia-uvm`` and ``nvidia-caps`` are in ``/proc/devices`` and the minor is in the node's
name. Dynamic MIG creates capability nodes through NVML inside the agent's container, whose
/dev is not the host's, and the UVM nodes may likewise be made only there.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import structlog

from dra_driver.cdi.spec import DeviceNode
from dra_driver.procdevices import char_major

log = structlog.get_logger(__name__)

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


#: Nodes whose numbers are known without the node: the pattern of the path, the name of its
#: character device driver in /proc/devices, and its minor from the path.
_REGISTERED: list[tuple[re.Pattern[str], str, Callable[[re.Match[str]], int]]] = [
    (re.compile(r"^/dev/nvidia-uvm$"), "nvidia-uvm", lambda m: 0),
    (re.compile(r"^/dev/nvidia-uvm-tools$"), "nvidia-uvm", lambda m: 1),
    (re.compile(r"^/dev/nvidia-caps/nvidia-cap(\d+)$"), "nvidia-caps", lambda m: int(m.group(1))),
]


def registered_driver(path: str) -> tuple[str, int] | None:
    """The character device driver and minor of the node at ``path``, if known by name."""
    for pattern, driver, minor in _REGISTERED:
        match = pattern.match(path)
        if match:
            return driver, minor(match)
    return None


def registered(path: str, proc_devices: str) -> DeviceNode:
    """The node at ``path`` as the kernel's registry (a ``/proc/devices`` text) numbers it;
    the path alone when its driver is not listed or the path names no such node.

    No host path: the node need not exist on the host, and the runtime creates it from its
    numbers (CDI stats the host path only when type or major are missing)."""
    known = registered_driver(path)
    major = char_major(proc_devices, known[0]) if known else None
    if known is None or major is None:
        return DeviceNode(path=path)
    return DeviceNode(path=path, type="c", major=major, minor=known[1])


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


def _readable(paths: Sequence[Path]) -> Iterator[str]:
    """The texts of those of ``paths`` that can be read, in order."""
    for path in paths:
        try:
            yield path.read_text()
        except OSError:
            continue


def host(
    driver_root: Path = Path("/"),
    host_driver_root: Path | None = None,
    proc_devices: Sequence[Path] | None = None,
) -> Resolver:
    """Resolve device nodes from the host (under the driver root) when they exist.

    ``driver_root`` is where this process sees the driver root, ``host_driver_root`` where
    the host (and so the container runtime) has it: a node found under the former is handed
    to the runtime by its path under the latter. A missing UVM or MIG capability node gets
    its numbers from the first of ``proc_devices`` that lists its driver (default: the driver
    root's ``proc/devices``, which a stand-in driver provides, then the kernel's
    ``/proc/devices``, the same in this container as on the host)."""
    runtime_root = host_driver_root or driver_root
    registries = (
        proc_devices
        if proc_devices is not None
        else (driver_root / "proc" / "devices", Path("/proc/devices"))
    )
    warned: set[str] = set()  # drivers already reported missing from the registry

    def missing(path: str) -> DeviceNode:
        known = registered_driver(path)
        if known is None:
            return DeviceNode(path=path)  # the runtime will look for itself
        for text in _readable(registries):
            node = registered(path, text)
            if node.major is not None:
                return node
        if known[0] not in warned:
            warned.add(known[0])
            log.warning(
                "device node missing and its driver not in /proc/devices: the runtime will"
                " look for the node itself",
                path=path,
                driver=known[0],
                proc_devices=[str(p) for p in registries],
            )
        return DeviceNode(path=path)

    def resolve(path: str) -> DeviceNode:
        relative = path.lstrip("/")
        try:
            info = os.stat(driver_root / relative)
        except OSError:
            return missing(path)
        if not stat.S_ISCHR(info.st_mode):
            return DeviceNode(path=path)
        extra = {"host_path": str(runtime_root / relative)} if runtime_root != Path("/") else {}
        return DeviceNode(
            path=path, type="c", major=os.major(info.st_rdev), minor=os.minor(info.st_rdev), **extra
        )

    return resolve
