"""Where the plugin's unix sockets and lock file live.

Default names follow the kubelet's conventions. With a pod UID (rolling updates, where an old
and a new pod of the DaemonSet run side by side on one node) both socket names carry the UID so
the two instances do not overwrite each other; when that makes a path longer than AF_UNIX allows,
the UID is replaced by a shorter hash of it.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path

#: sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
#: Fewer hex digits than this would make collisions between pods plausible.
_MIN_HASH_LEN = 8

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
LOCK_FILE_NAME = "prepare.lock"


@dataclass(frozen=True)
class SocketPaths:
    """Absolute paths used by one plugin instance."""

    registration: Path
    dra: Path
    lock: Path


def _fits(path: Path) -> bool:
    return len(os.fsencode(path)) <= MAX_SOCKET_PATH


def _uid_socket(directory: Path, prefix: str, uid: str, suffix: str) -> Path:
    """``directory/<prefix><uid><suffix>``, hashing ``uid`` down until the path fits."""
    full = directory / f"{prefix}{uid}{suffix}"
    if _fits(full):
        return full
    digest = hashlib.sha256(uid.encode()).hexdigest()
    room = MAX_SOCKET_PATH - len(os.fsencode(directory / f"{prefix}{suffix}"))
    if room < _MIN_HASH_LEN:
        raise ValueError(
            f"socket path {full} exceeds the AF_UNIX limit of {MAX_SOCKET_PATH} bytes "
            "even with a hashed pod UID; use a shorter directory"
        )
    return directory / f"{prefix}{digest[: min(room, len(digest))]}{suffix}"


def _checked(path: Path) -> Path:
    if not _fits(path):
        raise ValueError(
            f"socket path {path} exceeds the AF_UNIX limit of {MAX_SOCKET_PATH} bytes; "
            "use a shorter directory or driver name"
        )
    return path


def socket_paths(
    driver_name: str,
    registry_dir: Path = DEFAULT_REGISTRY_DIR,
    plugins_dir: Path = DEFAULT_PLUGINS_DIR,
    pod_uid: str | None = None,
) -> SocketPaths:
    """Compute the registration socket, DRA socket and lock file paths.

    Raises ``ValueError`` when a socket path cannot be made to fit the AF_UNIX limit.
    """
    registry_dir = Path(os.path.abspath(registry_dir))
    plugin_dir = Path(os.path.abspath(plugins_dir)) / driver_name
    if pod_uid:
        registration = _uid_socket(registry_dir, f"{driver_name}-", pod_uid, "-reg.sock")
        dra = _uid_socket(plugin_dir, "dra-", pod_uid, ".sock")
    else:
        registration = _checked(registry_dir / f"{driver_name}-reg.sock")
        dra = _checked(plugin_dir / "dra.sock")
    # The lock file is shared by all instances of the driver on the node, so no UID in it.
    return SocketPaths(registration=registration, dra=dra, lock=plugin_dir / LOCK_FILE_NAME)


def answers(path: Path, timeout: float = 0.5) -> bool:
    """Whether a server listens on the unix socket ``path``.

    Only a missing file or a refused connection (a socket file left by a process that died)
    says no; a server too busy to take the connection (a full backlog, a timeout) still runs,
    and so does anything that cannot be told apart from one.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        except OSError:
            return True
    return True
