"""The kubelet plugin: registration and DRA servers, kept alive across kubelet restarts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import structlog

from dra_driver.kubeletplugin.claims import ClaimFetcher
from dra_driver.kubeletplugin.dra_servicer import DRA_PLUGIN_VERSIONS, add_dra_servicers
from dra_driver.kubeletplugin.health_servicer import HEALTH_VERSIONS, add_health_servicers
from dra_driver.kubeletplugin.interfaces import Driver, HealthSource
from dra_driver.kubeletplugin.lock import NodeLock
from dra_driver.kubeletplugin.node_service import NodeService
from dra_driver.kubeletplugin.registration import (
    RegistrationServicer,
    RegistrationState,
    add_registration_servicer,
)
from dra_driver.kubeletplugin.server import UnixServer
from dra_driver.kubeletplugin.sockets import (
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    SocketPaths,
    socket_paths,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PluginConfig:
    """Settings of a kubelet plugin instance.

    ``pool_name`` defaults to ``node_name`` (one pool per node). ``pod_uid`` enables
    rolling-update socket names. ``watch_interval`` is how often the socket files are checked
    (a kubelet restart may wipe the registry directory); ``stop_grace`` is how long in-flight
    calls may finish on shutdown.
    """

    driver_name: str
    node_name: str
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    pod_uid: str | None = None
    pool_name: str | None = None
    watch_interval: float = 0.5
    stop_grace: float = 5.0


class Plugin:
    """Serves a ``Driver`` (and optionally a ``HealthSource``) to the kubelet.

    Use as ``async with Plugin(...) as plugin:`` or call ``start()`` and ``stop()``.
    ``registered`` is set once the kubelet accepts the plugin and cleared if it rejects it;
    ``on_registered`` runs after every successful (re-)registration, e.g. to republish
    ResourceSlices that the kubelet deletes when a plugin disconnects.
    """

    def __init__(
        self,
        config: PluginConfig,
        driver: Driver,
        fetcher: ClaimFetcher,
        health: HealthSource | None = None,
        on_registered: Callable[[], None] | None = None,
    ) -> None:
        """Prepare servers; nothing is bound until ``start()``."""
        self.config = config
        self.paths: SocketPaths = socket_paths(
            config.driver_name, config.registry_dir, config.plugins_dir, config.pod_uid
        )
        self.registration = RegistrationState(on_registered)
        self.lock = NodeLock(self.paths.lock)
        self.service = NodeService(
            driver,
            fetcher,
            self.lock,
            driver_name=config.driver_name,
            node_name=config.node_name,
            pool_name=config.pool_name or config.node_name,
        )
        versions = DRA_PLUGIN_VERSIONS + (HEALTH_VERSIONS if health is not None else ())
        registration = RegistrationServicer(
            config.driver_name, str(self.paths.dra), versions, self.registration, config.node_name
        )

        def setup_dra(server: object) -> None:
            add_dra_servicers(server, self.service)
            if health is not None:
                add_health_servicers(server, health, config.node_name)

        self._dra = UnixServer(self.paths.dra, setup_dra, "dra")
        self._reg = UnixServer(
            self.paths.registration,
            lambda server: add_registration_servicer(server, registration),
            "registration",
        )
        self._watcher: asyncio.Task[None] | None = None
        self._serving = False

    @property
    def registered(self) -> asyncio.Event:
        """Set while the kubelet has accepted this plugin."""
        return self.registration.registered

    async def start(self) -> None:
        """Bind both sockets and start watching them."""
        await self._dra.start()
        try:
            # Registration last: the kubelet dials the DRA endpoint as soon as it sees this socket.
            await self._reg.start()
        except BaseException:
            await self._dra.stop(0)
            raise
        self._watcher = asyncio.create_task(self._watch(), name="kubeletplugin-socket-watch")
        self._serving = True
        log.info(
            "kubelet plugin started",
            driver=self.config.driver_name,
            node=self.config.node_name,
            registration_socket=str(self.paths.registration),
            dra_socket=str(self.paths.dra),
        )

    async def stop(self) -> None:
        """Stop serving and remove the socket files this plugin created (once: a second
        call does nothing)."""
        if not self._serving:
            return
        self._serving = False
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        # Registration first, so the kubelet stops routing calls to us before the DRA socket goes.
        await self._reg.stop(0)
        await self._dra.stop(self.config.stop_grace)
        self.registered.clear()
        log.info(
            "kubelet plugin stopped", driver=self.config.driver_name, node=self.config.node_name
        )

    async def __aenter__(self) -> Plugin:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _watch(self) -> None:
        """Recreate deleted sockets; a restarting kubelet may wipe its registry directory."""
        while True:
            await asyncio.sleep(self.config.watch_interval)
            try:
                await self._check_sockets()
            except Exception:
                # Keep watching: the next tick may succeed (e.g. the directory is back).
                log.exception(
                    "recreating plugin sockets failed",
                    driver=self.config.driver_name,
                    node=self.config.node_name,
                )

    async def _check_sockets(self) -> None:
        if not self._dra.present():
            log.warning(
                "DRA socket disappeared, recreating",
                socket=str(self.paths.dra),
                driver=self.config.driver_name,
                node=self.config.node_name,
            )
            await self._dra.restart(grace=1.0)
            # A fresh registration socket makes the kubelet re-register and redial.
            await self._reg.restart(grace=0)
        elif not self._reg.present():
            log.warning(
                "registration socket disappeared, recreating",
                socket=str(self.paths.registration),
                driver=self.config.driver_name,
                node=self.config.node_name,
            )
            self.registered.clear()
            await self._reg.restart(grace=0)
