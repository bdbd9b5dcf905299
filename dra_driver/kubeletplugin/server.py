"""A ``grpc.aio`` server bound to one unix socket, which can be rebuilt when the file vanishes."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import structlog

from dra_driver.kubeletplugin.grpclog import quiet_malformed_requests

log = structlog.get_logger(__name__)

#: Adds servicers to a freshly created server.
Setup = Callable[[Any], None]


class UnixServer:
    """Serves the services added by ``setup`` on ``path``."""

    def __init__(self, path: Path, setup: Setup, name: str) -> None:
        """``name`` labels log events (e.g. "registration", "dra")."""
        self.path = path
        self._setup = setup
        self._name = name
        self._server: Any = None
        self._identity: tuple[int, int, int] | None = None

    @property
    def running(self) -> bool:
        """Whether a server is currently started."""
        return self._server is not None

    async def start(self) -> None:
        """Bind the socket (replacing a stale one) and start serving."""
        if self._server is not None:
            raise RuntimeError(f"{self._name} server already running")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_socket(self.path)
        quiet_malformed_requests()
        server = grpc.aio.server()
        self._setup(server)
        # "unix:<path>", not "unix://<path>": gRPC counts the slashes of the latter against
        # the AF_UNIX limit, which would cost two bytes of the 107 available.
        try:
            server.add_insecure_port(f"unix:{self.path}")
        except RuntimeError as exc:  # how grpcio says it could not bind
            raise OSError(f"cannot listen on {self.path}: {exc}") from None
        await server.start()
        self._server = server
        self._identity = _identity(self.path)
        log.info("serving", server=self._name, socket=str(self.path))

    def present(self) -> bool:
        """Whether our socket file is still in place (false once somebody deleted it)."""
        try:
            return _identity(self.path) == self._identity
        except FileNotFoundError:
            return False

    async def stop(self, grace: float | None) -> None:
        """Stop serving (in-flight calls get ``grace`` seconds) and remove our socket file."""
        server, self._server = self._server, None
        if server is None:
            return
        await server.stop(grace)
        if self.present():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._identity = None
        log.info("stopped serving", server=self._name, socket=str(self.path))

    async def restart(self, grace: float | None) -> None:
        """Rebind on a new socket file, for when the old one was deleted."""
        # The old server goes first: gRPC unlinks a unix socket's path when its listener shuts
        # down, which would take the new file with it.
        await self.stop(grace)
        await self.start()


def _identity(path: Path) -> tuple[int, int, int]:
    """Tells our socket file from a later one at the same path (inode numbers get reused)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _remove_stale_socket(path: Path) -> None:
    """Delete a socket left behind by an earlier process; refuse to delete anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"{path} exists and is not a socket")
    path.unlink()
