"""The NVIDIA driver's user-space files a container needs, found under the driver root.

Without the NVIDIA Container Toolkit, a claim's CDI spec must itself bring what CUDA and the
management tools load: the user-space libraries of the kernel driver's version (a
``libcuda.so`` of another version refuses to work with the loaded kernel module), the tools
(``nvidia-smi`` ...), the GSP firmware, and the IPC sockets of nvidia-persistenced and
nvidia-fabricmanager when they run.

The dynamic loader inside an arbitrary image has to find the libraries without running
``ldconfig`` there (that takes a hook binary on the host). glibc falls back to its built-in
system directories when a name is not in ``/etc/ld.so.cache``: ``/usr/lib/<triplet>`` on
Debian-family images and ``/usr/lib64`` on Red Hat-family ones. Each library is therefore
mounted into both, under its real file name and under its soname (``libcuda.so.1``, read
from the library's ELF header), which is the name programs link against and ``dlopen``.
"""

from __future__ import annotations

import platform
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import structlog

from dra_driver.cdi.spec import ContainerEdits, Mount
from dra_driver.gpu.container.elf import soname
from dra_driver.gpu.driverroot import resolve_in

log = structlog.get_logger(__name__)

#: Libraries of the driver version, by what they serve. Graphics (GL, EGL, Vulkan) are left
#: out: a DRA GPU claim is for compute, and those need the display stack's ICD files too.
LIBRARIES = (
    # compute
    "libcuda",
    "libcudadebugger",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libnvidia-gpucomp",
    "libnvidia-opencl",
    # management and configuration
    "libnvidia-ml",
    "libnvidia-cfg",
    "libnvidia-allocator",
    "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3",
    # video
    "libnvcuvid",
    "libnvidia-encode",
    "libnvidia-opticalflow",
)

#: The libraries whose unversioned development name is also provided, as some frameworks
#: look for it (e.g. ``libcuda.so`` for JIT compilers that link at run time).
DEV_NAMES = ("libcuda", "libnvidia-ml")

BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)

#: Where distributions put the driver's libraries, relative to the driver root.
LIBRARY_DIRS = (
    "usr/lib/{triplet}",
    "lib/{triplet}",
    "usr/lib64",
    "lib64",
    "usr/lib",
    "lib",
    "usr/lib/{triplet}/nvidia/current",
)
BINARY_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia")
#: The daemons' sockets, as paths inside the container (the same as on the host).
SOCKETS = (
    "/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
)
#: The same directories reached through the older /var/run.
_SOCKET_ALIASES = {"/run/": "/var/run/"}

BINARY_DIR_IN_CONTAINER = "/usr/bin"

READ_ONLY = ("ro", "nosuid", "nodev", "bind")
SOCKET_OPTIONS = ("nosuid", "nodev", "noexec", "bind")

_TRIPLETS = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
_KERNEL_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def triplet(machine: str | None = None) -> str:
    """The multiarch directory name of the node's architecture (the agent runs on it)."""
    machine = machine or platform.machine()
    return _TRIPLETS.get(machine, f"{machine}-linux-gnu")


def container_library_dirs(machine: str | None = None) -> tuple[str, ...]:
    """The glibc system directories of Debian- and Red Hat-family images."""
    return (f"/usr/lib/{triplet(machine)}", "/usr/lib64")


@dataclass(frozen=True)
class Library:
    """A driver library file and the names it must be reachable under."""

    path: Path  # under the driver root, as the agent sees it
    names: tuple[str, ...]  # file name first, then soname and development name


@dataclass(frozen=True)
class DriverFiles:
    """What :func:`find_driver_files` found, as paths the agent sees (under the driver root)."""

    version: str
    libraries: tuple[Library, ...] = ()
    binaries: tuple[Path, ...] = ()
    firmware: tuple[Path, ...] = ()
    sockets: tuple[tuple[Path, str], ...] = ()  # (found at, path in the container)


def kernel_driver_version(driver_root: Path) -> str:
    """The loaded kernel module's version from ``/proc/driver/nvidia/version``, or ""."""
    for base in (driver_root, Path("/")):
        try:
            text = (base / "proc/driver/nvidia/version").read_text()
        except OSError:
            continue
        found = _KERNEL_VERSION.search(text)
        if found:
            return found.group(1)
    return ""


def _first_file(root: Path, dirs: tuple[str, ...], name: str) -> Path | None:
    for directory in dirs:
        candidate = root / directory / name
        # A link in a driver container's root points at its own absolute paths.
        if resolve_in(root, candidate).is_file():
            return candidate
    return None


def _library(root: Path, dirs: tuple[str, ...], name: str, version: str) -> Library | None:
    path = _first_file(root, dirs, f"{name}.so.{version}")
    if path is None:
        return None
    real = resolve_in(root, path)
    if not real.is_relative_to(root):
        return None  # a link out of the driver root: not the driver's file
    names = [path.name]
    declared = soname(real)
    if declared and declared not in names:
        names.append(declared)
    if name in DEV_NAMES:
        names.append(f"{name}.so")
    return Library(path=real, names=tuple(names))


def _sockets(root: Path) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    for in_container in SOCKETS:
        for old, new in (("", ""), *_SOCKET_ALIASES.items()):
            candidate = root / in_container.replace(old, new, 1).lstrip("/")
            try:
                if stat.S_ISSOCK(candidate.stat().st_mode):
                    found.append((candidate, in_container))
                    break
            except OSError:
                continue
    return found


def find_driver_files(
    driver_root: Path, version: str = "", machine: str | None = None
) -> DriverFiles:
    """The driver's libraries of ``version`` (default: the kernel module's), tools, firmware
    and daemon sockets under ``driver_root``."""
    version = version or kernel_driver_version(driver_root)
    if not version:
        return DriverFiles(version="")
    dirs = tuple(d.format(triplet=triplet(machine)) for d in LIBRARY_DIRS)
    libraries = [lib for n in LIBRARIES if (lib := _library(driver_root, dirs, n, version))]
    binaries = [b for n in BINARIES if (b := _first_file(driver_root, BINARY_DIRS, n))]
    # /lib is /usr/lib on merged-/usr systems: the same file may be found twice.
    firmware: dict[str, Path] = {}
    for directory in FIRMWARE_DIRS:
        found = driver_root / directory / version
        if found.is_dir():
            for f in sorted(found.iterdir()):
                if f.is_file():
                    firmware.setdefault(f.name, f)
    return DriverFiles(
        version=version,
        libraries=tuple(libraries),
        binaries=tuple(binaries),
        firmware=tuple(firmware.values()),
        sockets=tuple(_sockets(driver_root)),
    )


def driver_edits(
    files: DriverFiles, driver_root: Path, host_root: Path, machine: str | None = None
) -> ContainerEdits:
    """Mounts for everything found. Host paths are under ``host_root``, where the runtime
    (outside the agent's container) sees the driver root that the agent sees at
    ``driver_root``."""

    def host(path: Path) -> str:
        # The runtime does not follow links the way the driver root means them (an absolute
        # target is relative to the root): mount the file a link leads to.
        return str(host_root / resolve_in(driver_root, path).relative_to(driver_root))

    mounts: list[Mount] = []
    for library in files.libraries:
        for directory in container_library_dirs(machine):
            mounts += [
                Mount(host(library.path), f"{directory}/{name}", READ_ONLY)
                for name in library.names
            ]
    mounts += [
        Mount(host(b), f"{BINARY_DIR_IN_CONTAINER}/{b.name}", READ_ONLY) for b in files.binaries
    ]
    mounts += [
        Mount(host(f), f"/lib/firmware/nvidia/{files.version}/{f.name}", READ_ONLY)
        for f in files.firmware
    ]
    mounts += [Mount(host(s), target, SOCKET_OPTIONS) for s, target in files.sockets]
    return ContainerEdits(mounts=tuple(mounts))


def discover_edits(
    driver_root: Path, host_root: Path = Path("/"), version: str = ""
) -> ContainerEdits:
    """:func:`find_driver_files` and :func:`driver_edits` in one, logging what was found."""
    files = find_driver_files(driver_root, version)
    if not files.version:
        log.warning(
            "NVIDIA kernel driver version unknown: CDI specs carry no driver libraries",
            driver_root=str(driver_root),
        )
        return ContainerEdits()
    missing = [n for n in ("libcuda", "libnvidia-ml") if n not in _found(files)]
    log.info(
        "driver files for CDI specs",
        version=files.version,
        libraries=len(files.libraries),
        binaries=len(files.binaries),
        firmware=len(files.firmware),
        sockets=[target for _, target in files.sockets],
        missing=missing,
    )
    return driver_edits(files, driver_root, host_root)


def _found(files: DriverFiles) -> set[str]:
    return {lib.names[0].split(".so.")[0] for lib in files.libraries}
