"""The IMEX daemon's files and readiness check, for ``dra-driver imex-daemon``.

The pure part: the daemon's config file (the real ``nvidia-imex`` format, ``KEY=VALUE``
lines), its nodes config (one peer address a line) and the peer set read from the domain's
daemon pods and their nodes' NVLink cliques. Beside it the few file-system look-ups the
readiness probe needs: where the driver root keeps the IMEX tools, and running
``nvidia-imex-ctl -q``.

The probe runs every two seconds, so this module imports nothing beyond the standard
library: the probe's path must not load the API client or asyncio's subprocess machinery.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.errors import DriverError

#: The daemon's peer port (the real daemon's default; objects.IMEX_PORT in the DaemonSet).
SERVER_PORT = 50000
#: The command service's port, which ``nvidia-imex-ctl -q`` asks. Bound to the pod's
#: loopback only: nothing outside the pod has anything to ask it.
CMD_PORT = 50005
CMD_ADDRESS = "127.0.0.1"
#: Where the daemon's files are written in the pod (any writable directory will do).
DEFAULT_DIR = Path("/run/imex")
#: Where the IMEX tools live below a driver root: the nvidia-imex package installs them in
#: /usr/bin; some driver containers carry them in /bin.
TOOL_DIRS = ("usr/bin", "bin")
DAEMON = "nvidia-imex"
CTL = "nvidia-imex-ctl"
#: A host's own IMEX service: its config files, and the link systemd makes when it is enabled.
#: It would hold the same ports and devices as a domain's daemon.
HOST_CONFIGS = (
    "etc/nvidia-imex/config.cfg",
    "etc/nvidia-imex/nodes_config.cfg",
    "etc/systemd/system/multi-user.target.wants/nvidia-imex.service",
)
#: The daemon container's NVLink clique, from its claim's CDI spec (the node's compute domain
#: plugin writes it): empty on a node in no clique, where no nvidia-imex runs; absent when an
#: older plugin prepared the claim.
CLIQUE_ENV = "CLIQUE_ID"
#: What ``nvidia-imex-ctl -q`` prints when the daemon is connected and serving.
READY = "READY"
#: Seconds the probe waits for ``nvidia-imex-ctl`` (the kubelet gives the probe 10).
CHECK_TIMEOUT = 8.0


class ToolNotFound(DriverError, FileNotFoundError):
    """An IMEX tool is not in the driver root; the message names every path tried."""


@dataclass(frozen=True)
class ImexFiles:
    """The files of one daemon, in one directory."""

    directory: Path

    @property
    def config(self) -> Path:
        return self.directory / "config.cfg"

    @property
    def nodes(self) -> Path:
        return self.directory / "nodes_config.cfg"

    @property
    def log(self) -> Path:
        return self.directory / "nvidia-imex.log"


@dataclass(frozen=True)
class ImexConfig:
    """What the daemon's config file says."""

    pod_ip: str
    files: ImexFiles
    port: int = SERVER_PORT
    cmd_port: int = CMD_PORT
    cmd_address: str = CMD_ADDRESS


def config_text(config: ImexConfig, *, domain: str = "") -> str:
    """The daemon's config file: in the foreground (the shell supervises it), listening on
    the pod's IP, its command service on the pod's loopback, logging to a file the shell
    forwards."""
    keys: dict[str, Any] = {
        # 4: informational messages (peers connecting and leaving) and worse.
        "LOG_LEVEL": 4,
        "LOG_FILE_NAME": config.files.log,
        # The shell empties the log before each start and forwards it from the beginning.
        "LOG_APPEND_TO_LOG": 1,
        "DAEMONIZE": 0,
        "BIND_INTERFACE_IP": config.pod_ip,
        "SERVER_PORT": config.port,
        "IMEX_NODE_CONFIG_FILE": config.files.nodes,
        "IMEX_CMD_ENABLED": 1,
        "IMEX_CMD_BIND_INTERFACE_IP": config.cmd_address,
        "IMEX_CMD_PORT": config.cmd_port,
    }
    header = "# nvidia-imex config written by dra-driver imex-daemon"
    lines = [header + (f" for compute domain {domain}" if domain else "")]
    for key, value in keys.items():
        text = str(value)
        # One line per key: a newline in a value would start a line the daemon rejects.
        if "\n" in text or "\r" in text:
            raise ValueError(f"{key}: a value cannot span lines: {text!r}")
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def _address_key(address: str) -> tuple[int, int, int, str]:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return (1, 0, 0, address)
    return (0, ip.version, int(ip), "")


def nodes_text(peers: Iterable[str], own: str) -> str:
    """The nodes config: every daemon of the domain, this one included, one address a line.

    Sorted by address (numerically), so that every daemon of the domain writes the same file
    from the same pods: the daemons number the nodes by their line.
    """
    addresses = sorted({*peers, own} - {""}, key=_address_key)
    return "".join(f"{a}\n" for a in addresses)


def pod_peer(pod: Mapping[str, Any], uid: str, label: str) -> str:
    """The address a daemon pod of domain ``uid`` is a peer at ("" when it is none: another
    domain's, going away, finished, or without an IP yet)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if (meta.get("labels") or {}).get(label) != uid or meta.get("deletionTimestamp"):
        return ""
    if status.get("phase") in ("Failed", "Succeeded"):
        return ""
    return str(status.get("podIP") or "")


def peer_set(
    pods: Iterable[Mapping[str, Any]],
    uid: str,
    label: str,
    cliques: Mapping[str, str] | None = None,
    own: str = "",
) -> frozenset[str]:
    """The addresses of the domain's daemons among ``pods``.

    With ``cliques`` (node name -> the node's NVLink clique), only those on nodes of clique
    ``own``: an IMEX domain cannot span NVLink cliques, so a domain whose pods landed on two
    racks runs one IMEX domain per rack (the NVIDIA driver writes the same-clique daemons
    only). A pod on a node whose clique is not known yet is left out until it is.
    """
    return frozenset(
        address
        for pod in pods
        if (address := pod_peer(pod, uid, label))
        and (cliques is None or cliques.get(str((pod.get("spec") or {}).get("nodeName"))) == own)
    )


def tool_paths(driver_root: Path, name: str) -> tuple[Path, ...]:
    """Where an IMEX tool may be below the driver root, in the order looked at."""
    return tuple(driver_root / d / name for d in TOOL_DIRS)


def find_tool(driver_root: Path, name: str) -> Path:
    """The first of :func:`tool_paths` that exists; :class:`ToolNotFound` otherwise."""
    paths = tool_paths(driver_root, name)
    for path in paths:
        if path.is_file():
            return path
    tried = ", ".join(str(p) for p in paths)
    raise ToolNotFound(
        f"{name} not found in the driver root (tried {tried}): install the nvidia-imex "
        "package of the node's driver version, or point --driver-root at the driver"
    )


def host_configs(driver_root: Path) -> list[Path]:
    """The host IMEX service's files present in the driver root (the unit link points at a
    path of the host, so it counts as present without resolving)."""
    return [p for p in (driver_root / c for c in HOST_CONFIGS) if p.is_file() or p.is_symlink()]


def is_ready(returncode: int, stdout: str) -> bool:
    """Whether ``nvidia-imex-ctl -q`` said the daemon is ready: the whole answer ``READY``
    (not a line containing it; the other states end in other words)."""
    return returncode == 0 and stdout.strip() == READY


def check(driver_root: Path, files: ImexFiles) -> tuple[bool, str]:
    """Ask this pod's daemon for its state: ready or not, and what was said."""
    if not files.config.is_file():
        return False, f"{files.config} does not exist: the IMEX daemon has not been started"
    try:
        ctl = find_tool(driver_root, CTL)
    except ToolNotFound as exc:
        return False, str(exc)
    try:
        ran = subprocess.run(
            [str(ctl), "-c", str(files.config), "-q"],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"{CTL} -q did not answer within {CHECK_TIMEOUT:g} s"
    except OSError as exc:
        return False, f"cannot run {ctl}: {exc.strerror or exc}"
    said = (ran.stdout + ran.stderr).strip() or f"no output, exit status {ran.returncode}"
    return is_ready(ran.returncode, ran.stdout), said


def run_check(driver_root: Path, directory: str | None) -> int:
    """``imex-daemon --check``: 0 when ready; else 1 with the reason on stderr. On a node in
    no NVLink clique there is no daemon to ask: ready (as the NVIDIA driver's check), so the
    domain's workloads there start with the domain's environment only."""
    if os.environ.get(CLIQUE_ENV) == "":
        return 0
    ready, said = check(driver_root, ImexFiles(Path(directory) if directory else DEFAULT_DIR))
    if ready:
        return 0
    print(f"IMEX daemon not ready: {said}", file=sys.stderr)
    return 1
