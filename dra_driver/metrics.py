"""Prometheus metrics of the node agent, served on ``/metrics``.

The default registry also carries the process collector (resident memory, open file
descriptors, CPU time), which is what an operator watches for leaks.
"""

from __future__ import annotations

import errno
import functools
import platform
import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from dra_driver import package_version

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

PREPARE_SECONDS = Histogram(
    "dra_driver_prepare_seconds",
    "Time to prepare one claim (its batch's duration), by outcome.",
    ["outcome"],
    buckets=_LATENCY_BUCKETS,
)
UNPREPARE_SECONDS = Histogram(
    "dra_driver_unprepare_seconds",
    "Time to unprepare one claim (its batch's duration), by outcome.",
    ["outcome"],
    buckets=_LATENCY_BUCKETS,
)
PREPARED_CLAIMS = Gauge("dra_driver_prepared_claims", "Claims prepared on this node.")
PUBLISHED_DEVICES = Gauge("dra_driver_published_devices", "Devices in this node's pool.")
PUBLISHED_SLICES = Gauge("dra_driver_published_slices", "ResourceSlices in this node's pool.")
UNHEALTHY_DEVICES = Gauge("dra_driver_unhealthy_devices", "Devices tainted as unhealthy.")
KEPT_DEVICES = Gauge(
    "dra_driver_kept_devices",
    "MIG devices start-up kept because nothing proved them unused (see the node's Events).",
)
API_REQUESTS = Counter(
    "dra_driver_api_requests_total",
    "Requests to the Kubernetes API server, by verb and HTTP status code.",
    ["verb", "code"],
)
HEALTH_EVENTS = Counter(
    "dra_driver_health_events_total",
    "GPU health events seen, by Xid (or gpu-lost, ecc-dbe), ignored ones included.",
    ["xid", "ignored"],
)
LOOP_CRASHES = Counter(
    "dra_driver_loop_crashes_total",
    "Background loops (publisher, claim-reporter, health) that crashed and were restarted.",
    ["loop"],
)
BUILD_INFO = Gauge(
    "dra_driver_build_info", "Build information (always 1).", ["version", "python", "driver"]
)


def serve(port: int, driver_name: str) -> None:
    """Start the /metrics endpoint in a background thread, on IPv6 and IPv4 alike."""
    BUILD_INFO.labels(
        version=package_version(), python=platform.python_version(), driver=driver_name
    ).set(1)
    try:
        # "::" takes IPv4 too (Linux's default dual stack): an IPv6-only cluster's
        # Prometheus reaches the pod's IPv6 address, which "0.0.0.0" never listened on.
        start_http_server(port, addr="::")
    except OSError as exc:
        if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
            raise
        start_http_server(port, addr="0.0.0.0")  # a kernel without IPv6


def observe_batch(histogram: Histogram, started: float, outcomes: dict[str, Any]) -> None:
    """Record one observation per claim of a batch, labelled success or error."""
    elapsed = time.perf_counter() - started
    for outcome in outcomes.values():
        _labelled(histogram, "error" if isinstance(outcome, Exception) else "success").observe(
            elapsed
        )


def observe_api_request(verb: str, code: str) -> None:
    """Count one request to the API server (a ``KubeClient`` request observer)."""
    _labelled(API_REQUESTS, verb, code).inc()


@functools.cache
def _labelled(metric: Any, *values: str) -> Any:
    """``metric``'s child for these label values (in the order the metric declares them).

    ``labels()`` validates, sorts and locks on every call, and a claim is observed several
    times; the children are few (outcomes, API verbs and status codes) and never removed.
    """
    return metric.labels(*values)
