"""The agent's metric helpers count under the right labels."""

from __future__ import annotations

import errno
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from dra_driver import metrics


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_batch_is_observed_once_per_claim_by_outcome() -> None:
    name = "dra_driver_prepare_seconds_count"
    ok, failed = _sample(name, outcome="success"), _sample(name, outcome="error")

    outcomes = {"a": object(), "b": object(), "c": ValueError("bad config")}
    metrics.observe_batch(metrics.PREPARE_SECONDS, time.perf_counter(), outcomes)
    metrics.observe_batch(metrics.PREPARE_SECONDS, time.perf_counter(), {"d": object()})

    assert _sample(name, outcome="success") == ok + 3
    assert _sample(name, outcome="error") == failed + 1


def test_api_requests_are_counted_by_verb_and_code() -> None:
    name = "dra_driver_api_requests_total"
    before = _sample(name, verb="PATCH", code="409")

    metrics.observe_api_request("PATCH", "409")
    metrics.observe_api_request("PATCH", "409")
    metrics.observe_api_request("PATCH", "200")

    assert _sample(name, verb="PATCH", code="409") == before + 2
    assert _sample(name, verb="409", code="PATCH") == 0.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET6) as sock:
        sock.bind(("::", 0))
        return int(sock.getsockname()[1])


def test_metrics_are_served_on_ipv6_and_ipv4() -> None:
    """An IPv6-only cluster's Prometheus scrapes the pod's IPv6 address: the endpoint listened
    on 0.0.0.0 only, so it could not be reached there."""
    port = _free_port()
    metrics.serve(port, "gpu.dra.dev")
    for host in ("127.0.0.1", "[::1]"):
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            assert b"dra_driver_build_info" in response.read()


def test_metrics_fall_back_to_ipv4_without_ipv6(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []

    def start(port: int, addr: str) -> None:
        if addr == "::":
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        started.append(addr)

    monkeypatch.setattr(metrics, "start_http_server", start)
    metrics.serve(9999, "gpu.dra.dev")
    assert started == ["0.0.0.0"]


async def test_prepared_claims_after_a_restart_count_the_claims_still_prepared(
    tmp_path: Path,
) -> None:
    """The gauge was set only after a kubelet call: an agent restarted on a node with
    running pods reported 0 prepared claims until the next prepare or unprepare."""
    from dra_driver.gpu.driver import GpuDriver
    from tests.unit.gpu.state.test_state import _claim, _state

    assert isinstance(
        (await GpuDriver(_state(tmp_path)).prepare([_claim("u1", "gpu-2")]))["u1"], list
    )
    metrics.PREPARED_CLAIMS.set(0)  # a new process
    GpuDriver(_state(tmp_path))
    assert _sample("dra_driver_prepared_claims") == 1
