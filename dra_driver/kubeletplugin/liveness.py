"""A gRPC health service (grpc.health.v1) for the DaemonSet's liveness probe.

The probe is only useful if it fails when the kubelet could not reach the plugin, so each
Check dials the plugin's own unix sockets: GetInfo on the registration socket and an empty
NodePrepareResources on the DRA socket (it touches no claim and takes no lock). A driver adds
its own check (the agent: the heartbeats of its background loops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dra_driver._proto.dra.v1 import api_pb2 as dra_v1
from dra_driver._proto.dra.v1 import api_pb2_grpc as _dra_v1_grpc
from dra_driver._proto.pluginregistration import api_pb2 as reg_pb2
from dra_driver._proto.pluginregistration import api_pb2_grpc as _reg_grpc
from dra_driver.kubeletplugin.sockets import SocketPaths

log = structlog.get_logger(__name__)

# The generated stubs carry no annotations.
dra_v1_grpc: Any = _dra_v1_grpc
reg_grpc: Any = _reg_grpc

PROBE_TIMEOUT = 2.0

#: A driver's own liveness check: None when healthy, else why not (one line).
Check = Callable[[], str | None]


async def sockets_answer(paths: SocketPaths, deadline: float = PROBE_TIMEOUT) -> str | None:
    """None when both sockets answer, else why not (one line)."""
    try:
        async with grpc.aio.insecure_channel(f"unix:{paths.registration}") as channel:
            await reg_grpc.RegistrationStub(channel).GetInfo(
                reg_pb2.InfoRequest(), timeout=deadline
            )
        async with grpc.aio.insecure_channel(f"unix:{paths.dra}") as channel:
            await dra_v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1.NodePrepareResourcesRequest(), timeout=deadline
            )
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    return None


class LivenessServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Answers SERVING only while the plugin's sockets answer and ``check`` finds nothing."""

    def __init__(self, paths: SocketPaths, check: Check | None = None) -> None:
        self._paths = paths
        self._check = check
        self._last_problem: str | None = None

    async def Check(self, request: Any, context: Any) -> Any:
        problem = await sockets_answer(self._paths)
        if problem is None and self._check is not None:
            problem = self._check()
        if problem != self._last_problem:
            if problem:
                log.error("liveness check failing", reason=problem)
            else:
                log.info("liveness check passing again")
            self._last_problem = problem
        status = (
            health_pb2.HealthCheckResponse.NOT_SERVING
            if problem
            else health_pb2.HealthCheckResponse.SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)


async def serve_liveness(
    paths: SocketPaths, port: int, address: str = "[::]", check: Check | None = None
) -> Any:
    """Start the health server on ``address:port``; returns the started grpc.aio server."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(LivenessServicer(paths, check), server)
    try:
        # grpcio raises RuntimeError when it cannot bind (older releases returned 0).
        bound = server.add_insecure_port(f"{address}:{port}")
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen on {address}:{port} for the liveness probe")
    await server.start()
    return server
