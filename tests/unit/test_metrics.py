"""The agent's metric helpers count under the right labels."""

from __future__ import annotations

import time

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
