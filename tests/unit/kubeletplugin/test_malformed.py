"""Malformed protobuf on the plugin's sockets: an error status for the caller, one log line."""

from __future__ import annotations

import logging

import grpc
import pytest

from dra_driver.kubeletplugin import Plugin

from .helpers import channel

METHODS = [
    ("dra", "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"),
    ("dra", "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"),
    ("registration", "/pluginregistration.Registration/GetInfo"),
]


@pytest.mark.parametrize(("socket", "method"), METHODS)
async def test_malformed_request_is_one_warning_not_a_traceback(
    plugin: Plugin, caplog: pytest.LogCaptureFixture, socket: str, method: str
) -> None:
    path = plugin.paths.dra if socket == "dra" else plugin.paths.registration
    with caplog.at_level(logging.DEBUG, logger="grpc"):
        async with channel(path) as ch:
            call = ch.unary_unary(method)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(b"\x0a\xff\xff\xff\xff\x0f", timeout=5)
    assert "Wire format was corrupt" in str(info.value.details())
    grpc_records = [r for r in caplog.records if r.name.startswith("grpc")]
    assert not [r for r in grpc_records if r.levelno >= logging.ERROR or r.exc_info], [
        r.getMessage() for r in grpc_records
    ]
    warnings = [r.getMessage() for r in grpc_records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "malformed request" in warnings[0]
    assert "\n" not in warnings[0]
