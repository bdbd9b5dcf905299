"""The liveness probe's gRPC health service answers SERVING only while the sockets answer."""

from __future__ import annotations

import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dra_driver.kubeletplugin import Plugin
from dra_driver.kubeletplugin.liveness import serve_liveness
from dra_driver.kubeletplugin.server import UnixServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _check(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(reply.status)


async def test_serving_while_sockets_answer_and_not_after(plugin: Plugin) -> None:
    port = _free_port()
    server = await serve_liveness(plugin.paths, port, address="127.0.0.1")
    try:
        assert await _check(port) == health_pb2.HealthCheckResponse.SERVING
        # The DRA server stops answering (its socket file may still be there).
        dra: UnixServer = plugin._dra
        await dra.stop(0)
        assert await _check(port) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await server.stop(0)


async def test_not_serving_while_the_drivers_own_check_fails(plugin: Plugin) -> None:
    problem: list[str] = []
    port = _free_port()
    server = await serve_liveness(
        plugin.paths, port, address="127.0.0.1", check=lambda: problem[0] if problem else None
    )
    try:
        assert await _check(port) == health_pb2.HealthCheckResponse.SERVING
        problem.append("background loops not alive: publisher")
        assert await _check(port) == health_pb2.HealthCheckResponse.NOT_SERVING
        problem.clear()
        assert await _check(port) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)


async def test_a_port_in_use_is_an_os_error_naming_the_port(plugin: Plugin) -> None:
    """The command line reports an ``OSError`` as one line (exit status 1); anything else
    escapes as a traceback."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = int(busy.getsockname()[1])
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            await serve_liveness(plugin.paths, port, address="127.0.0.1")
