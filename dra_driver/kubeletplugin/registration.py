"""The kubelet plugin-registration service: tell the kubelet who we are, hear its verdict."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from dra_driver._proto.pluginregistration import api_pb2 as reg_pb2
from dra_driver._proto.pluginregistration import api_pb2_grpc as reg_grpc

log = structlog.get_logger(__name__)

#: PluginInfo.type the kubelet expects from DRA drivers.
DRA_PLUGIN_TYPE = "DRAPlugin"


class RegistrationState:
    """Tracks whether the kubelet accepted the plugin; ``registered`` can be awaited."""

    def __init__(self, on_registered: Callable[[], None] | None = None) -> None:
        """``on_registered`` runs on the event loop after each successful registration."""
        self.registered = asyncio.Event()
        self.error: str | None = None
        self.count = 0
        self._on_registered = on_registered

    def update(self, ok: bool, error: str) -> None:
        """Record the kubelet's verdict."""
        if ok:
            self.error = None
            self.count += 1
            self.registered.set()
            if self._on_registered is not None:
                self._on_registered()
        else:
            self.error = error or "unknown reason"
            self.registered.clear()


class RegistrationServicer:
    """Answers GetInfo and NotifyRegistrationStatus on the registration socket."""

    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        versions: Sequence[str],
        state: RegistrationState,
        node_name: str,
    ) -> None:
        """``endpoint`` is the absolute path of the DRA socket."""
        self._info = reg_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE, name=driver_name, endpoint=endpoint, supported_versions=versions
        )
        self._state = state
        self._driver = driver_name
        self._node = node_name

    async def GetInfo(self, request: Any, context: Any) -> reg_pb2.PluginInfo:
        """Describe the plugin: type, driver name, DRA endpoint, supported API versions."""
        log.debug("kubelet asked for plugin info", driver=self._driver, node=self._node)
        return self._info

    async def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: Any
    ) -> reg_pb2.RegistrationStatusResponse:
        """Record whether the kubelet accepted the plugin, logging its reason if not."""
        if request.plugin_registered:
            log.info("registered with kubelet", driver=self._driver, node=self._node)
        else:
            log.error(
                "kubelet rejected plugin registration",
                driver=self._driver,
                node=self._node,
                reason=request.error,
            )
        self._state.update(request.plugin_registered, request.error)
        return reg_pb2.RegistrationStatusResponse()


def add_registration_servicer(server: Any, servicer: RegistrationServicer) -> None:
    """Register the Registration service on a ``grpc.aio`` server."""
    reg_grpc.add_RegistrationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
