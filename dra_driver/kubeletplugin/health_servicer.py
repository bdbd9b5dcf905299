"""gRPC servicers for DRAResourceHealth (v1alpha1 and v1): stream device health to the kubelet."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from types import ModuleType
from typing import Any

import structlog

from dra_driver._proto.dra_health.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra_health.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
from dra_driver._proto.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from dra_driver.kubeletplugin.interfaces import DeviceHealth, HealthSource

log = structlog.get_logger(__name__)

#: Advertised in PluginInfo.supported_versions when a health source is configured.
HEALTH_VERSIONS = ("v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth")
#: The kubelet truncates longer messages; doing it here keeps the marker predictable. It
#: counts UTF-8 bytes (Go's len) and would cut a multi-byte character in two.
MAX_MESSAGE_LEN = 1024
_ELLIPSIS = "..."
#: How long the kubelet trusts a device's health when ``health_check_timeout_seconds`` is 0;
#: it stamps each device with the time of the last message naming it and shows the health
#: as Unknown once this much time has passed, so unchanged health is sent again well before.
KUBELET_DEFAULT_TIMEOUT = 30.0
#: Messages per timeout: the list is re-sent after a third of the shortest timeout.
REFRESHES_PER_TIMEOUT = 3


def truncate_message(message: str) -> str:
    """Cap a health message at ``MAX_MESSAGE_LEN`` UTF-8 bytes, marking the cut with '...'."""
    data = message.encode()
    if len(data) <= MAX_MESSAGE_LEN:
        return message
    # Cut at a character boundary: "ignore" drops the bytes of a character split in two.
    head = data[: MAX_MESSAGE_LEN - len(_ELLIPSIS)].decode(errors="ignore")
    return head + _ELLIPSIS


class HealthServicer:
    """Serves NodeWatchResources for one API version from a ``HealthSource``."""

    def __init__(self, source: HealthSource, pb2: ModuleType, node_name: str) -> None:
        """``pb2`` is the message module of the version being served."""
        self._source = source
        self._pb2 = pb2
        self._node = node_name

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """Send the complete device list each time the source produces one, and again
        before the kubelet's health timeout while it produces nothing new."""
        log.info("health stream opened", node=self._node, api=self._pb2.DESCRIPTOR.package)
        stream = self._source.watch()
        pending: asyncio.Future[Sequence[DeviceHealth]] | None = None
        latest: Sequence[DeviceHealth] | None = None
        try:
            while True:
                if pending is None:
                    # One read of the source at a time, kept across refreshes: cancelling it
                    # would end the source's stream.
                    pending = asyncio.ensure_future(anext(stream))
                wait = None if latest is None else _refresh_interval(latest)
                done, _ = await asyncio.wait({pending}, timeout=wait)
                if done:
                    try:
                        latest = pending.result()
                    except StopAsyncIteration:
                        return
                    finally:
                        pending = None
                assert latest is not None
                yield self._response(latest)
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            # Close the source's generator now (not at garbage collection) so that whatever it
            # holds open for this stream is released when the kubelet disconnects.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
            log.info("health stream closed", node=self._node, api=self._pb2.DESCRIPTOR.package)

    def _response(self, devices: Sequence[DeviceHealth]) -> Any:
        now = int(time.time())
        response = self._pb2.NodeWatchResourcesResponse()
        for d in devices:
            entry = response.devices.add(
                health=int(d.status),
                last_updated_time=d.last_updated or now,
                health_check_timeout_seconds=d.timeout_seconds,
                message=truncate_message(d.message),
            )
            entry.device.pool_name = d.pool_name
            entry.device.device_name = d.device_name
        return response


def _refresh_interval(devices: Sequence[DeviceHealth]) -> float:
    """How long the kubelet may go without a message about ``devices``, divided by
    :data:`REFRESHES_PER_TIMEOUT`."""
    timeouts = [d.timeout_seconds or KUBELET_DEFAULT_TIMEOUT for d in devices]
    return min(timeouts, default=KUBELET_DEFAULT_TIMEOUT) / REFRESHES_PER_TIMEOUT


def add_health_servicers(server: Any, source: HealthSource, node_name: str) -> None:
    """Register the v1alpha1 and v1 DRAResourceHealth services on a ``grpc.aio`` server."""
    v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
        HealthServicer(source, v1alpha1_pb2, node_name), server
    )
    v1_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
        HealthServicer(source, v1_pb2, node_name), server
    )
