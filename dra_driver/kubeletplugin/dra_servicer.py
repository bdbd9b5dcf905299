"""gRPC servicers for the DRAPlugin service, versions v1 and v1beta1.

Both versions have the same methods and nearly the same messages (v1beta1 ``Device`` lacks
``share_id``), so one class translates between the wire and ``NodeService`` for either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import ModuleType
from typing import Any, TypeVar

import grpc

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.kubeletplugin.interfaces import ClaimRef
from dra_driver.kubeletplugin.node_service import NodeService

#: The names advertised in PluginInfo.supported_versions, kubelet-preferred first.
DRA_PLUGIN_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")

_T = TypeVar("_T")


class DRAPluginServicer:
    """Serves NodePrepareResources and NodeUnprepareResources for one API version."""

    def __init__(self, service: NodeService, pb2: ModuleType, has_share_id: bool) -> None:
        """``pb2`` is the message module of the version being served."""
        self._service = service
        self._pb2 = pb2
        self._has_share_id = has_share_id

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        """Prepare every claim of the request; one response entry per claim UID."""
        refs = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        outcomes = await _within_deadline(context, self._service.prepare(refs))
        response = self._pb2.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            entry.error = outcome.error
            for device in outcome.devices:
                wire = entry.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if self._has_share_id and device.share_id is not None:
                    wire.share_id = device.share_id
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        """Unprepare every claim of the request; one response entry per claim UID."""
        refs = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        errors = await _within_deadline(context, self._service.unprepare(refs))
        response = self._pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


async def _within_deadline(context: Any, work: Awaitable[_T]) -> _T:
    """Stop working when the caller's deadline passes, even if gRPC does not cancel us.

    Cancellation unwinds the driver call and the node lock, so the next call is not blocked
    by work whose caller has gone.
    """
    remaining = context.time_remaining()
    timeout = asyncio.timeout(None if remaining is None else max(remaining, 0.0))
    try:
        async with timeout:
            return await work
    except TimeoutError:
        if not timeout.expired():
            raise
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
        raise  # abort raises; this only satisfies the type checker


def add_dra_servicers(server: Any, service: NodeService) -> None:
    """Register the v1 and v1beta1 DRAPlugin services on a ``grpc.aio`` server."""
    v1_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
        DRAPluginServicer(service, v1_pb2, has_share_id=True), server
    )
    v1beta1_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
        DRAPluginServicer(service, v1beta1_pb2, has_share_id=False), server
    )
