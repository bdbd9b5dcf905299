"""Scheduler throughput and latency over published pools (used by ``bench_scale.py``).

The method follows upstream's scheduler_perf DRA workloads: nodes without a kubelet (Node
objects made schedulable through their status), one DeviceClass, claims created up front, then
pods that each reference one claim, created as fast as the client can; the scheduler allocates
a device to each claim and binds the pod. Measured from the client: each pod's time from its
create request to the watch event that shows it bound, and pods bound per second from the
first create to the last binding.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.kube import KubeClient, Response

RESOURCE = "/apis/resource.k8s.io/v1"
#: Creates in flight at once (the client's connection pool is small; more only queues).
CONCURRENCY = 32

NODE_STATUS: dict[str, Any] = {
    "capacity": {"cpu": "224", "memory": "2Ti", "pods": "1000"},
    "allocatable": {"cpu": "224", "memory": "2Ti", "pods": "1000"},
    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
}


@dataclass
class Workload:
    """Pods with one claim each, for one device class."""

    name: str
    device_class: str
    selector: str  # CEL for the class, beside the driver check
    pods: int  # how many pods fill the cluster
    capacity: dict[str, str] | None = None  # what each claim requests of its device


@dataclass
class Outcome:
    """What one workload measured."""

    workload: str
    pods: int
    bound: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    timed_out: bool = False
    steady_rate: float | None = None
    create_rate: float | None = None

    def summary(self) -> dict[str, Any]:
        """The figures reported, rounded."""
        lat = sorted(self.latencies)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))], 3) if lat else None

        return {
            "workload": self.workload,
            "pods": self.pods,
            "bound": self.bound,
            "timed_out": self.timed_out,
            "pods_per_s": round(self.bound / self.seconds, 1) if self.seconds else None,
            "steady_pods_per_s": round(self.steady_rate, 1) if self.steady_rate else None,
            "creates_per_s": round(self.create_rate, 1) if self.create_rate else None,
            "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
            "latency_p99_s": pct(0.99),
        }


def _check(resp: Response, what: str) -> Any:
    if not resp.ok:
        raise RuntimeError(f"{what}: HTTP {resp.status}: {resp.body[:300]!r}")
    return resp.json()


async def make_schedulable(client: KubeClient, node: str) -> None:
    """Give a kubelet-less Node the status the scheduler needs to place pods on it."""
    resp = await client.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        body={"status": NODE_STATUS},
        content_type="application/merge-patch+json",
    )
    _check(resp, f"status of node {node}")


async def _gather_limited(coros: Sequence[Any]) -> list[Any]:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(coro: Any) -> Any:
        async with sem:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))


async def run_workload(
    clients: Sequence[KubeClient], driver: str, namespace: str, workload: Workload, cap_s: float
) -> Outcome:
    """Create the class, claims and pods of ``workload`` in ``namespace``; wait for bindings.

    Requests are spread over ``clients`` (each has a small connection pool), so that the
    client does not limit the scheduler.
    """
    client = clients[0]
    klass = f"{namespace}-{workload.name}"
    expression = f'device.driver == "{driver}"'
    if workload.selector:
        expression += f" && {workload.selector}"
    _check(
        await client.request(
            "POST",
            f"{RESOURCE}/deviceclasses",
            body={
                "metadata": {"name": klass},
                "spec": {"selectors": [{"cel": {"expression": expression}}]},
            },
        ),
        "device class",
    )
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    exactly: dict[str, Any] = {"deviceClassName": klass}
    if workload.capacity:
        exactly["capacity"] = {"requests": workload.capacity}
    await _gather_limited(
        [
            _post(
                clients[i % len(clients)],
                claims,
                {
                    "metadata": {"name": f"{workload.name}-{i}"},
                    "spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}},
                },
            )
            for i in range(workload.pods)
        ]
    )
    outcome = Outcome(workload.name, workload.pods)
    sent: dict[str, float] = {}
    bound: dict[str, float] = {}
    all_bound = asyncio.Event()
    listing = _check(
        await client.request("GET", f"/api/v1/namespaces/{namespace}/pods", query={"limit": "1"}),
        "list pods",
    )
    watcher = asyncio.create_task(
        _watch_bindings(
            client, namespace, listing["metadata"]["resourceVersion"], bound, workload, all_bound
        )
    )
    pods = f"/api/v1/namespaces/{namespace}/pods"

    async def create_pod(i: int) -> None:
        name = f"{workload.name}-{i}"
        sent[name] = time.monotonic()
        await _post(clients[i % len(clients)], pods, _pod(name))
        created.append(time.monotonic())

    created: list[float] = []
    start = time.monotonic()
    try:
        await _gather_limited([create_pod(i) for i in range(workload.pods)])
        try:
            async with asyncio.timeout(max(1.0, cap_s - (time.monotonic() - start))):
                await all_bound.wait()
        except TimeoutError:
            outcome.timed_out = True
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    outcome.bound = len(bound)
    if bound:
        outcome.seconds = max(bound.values()) - start
        outcome.latencies = [t - sent[name] for name, t in bound.items() if name in sent]
        outcome.steady_rate = _steady_rate(sorted(bound.values()))
    if created:
        outcome.create_rate = len(created) / max(1e-9, max(created) - start)
    return outcome


def _steady_rate(times: Sequence[float]) -> float | None:
    """Bindings per second between the 10th and the 90th percent of them: the scheduler's
    own pace once a backlog exists, without the ramp up and the tail."""
    lo, hi = int(0.1 * len(times)), int(0.9 * len(times)) - 1
    if hi <= lo or times[hi] <= times[lo]:
        return None
    return (hi - lo) / (times[hi] - times[lo])


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "pause"}],
            "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


async def _post(client: KubeClient, path: str, body: dict[str, Any]) -> None:
    for attempt in range(5):
        resp = await client.request("POST", path, body=body)
        if resp.ok:
            return
        if resp.status != 429 and resp.status < 500:
            break
        await asyncio.sleep(0.2 * (attempt + 1))
    _check(resp, f"POST {path}")


async def _watch_bindings(
    client: KubeClient,
    namespace: str,
    version: str,
    bound: dict[str, float],
    workload: Workload,
    done: asyncio.Event,
) -> None:
    query = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "false"}
    while True:
        async with client.stream(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query=query
        ) as resp:
            async for line in resp.lines():
                event = json.loads(line)
                obj = event.get("object") or {}
                meta = obj.get("metadata") or {}
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"pod watch: {obj}")
                query["resourceVersion"] = meta.get("resourceVersion", query["resourceVersion"])
                if (obj.get("spec") or {}).get("nodeName") and meta.get("name") not in bound:
                    bound[meta["name"]] = time.monotonic()
                    if len(bound) >= workload.pods:
                        done.set()


async def clean_up(client: KubeClient, namespace: str, workload: Workload) -> None:
    """Remove a workload's pods (at once: no kubelet will confirm), claims and class, and
    wait until the claims are gone, so the next workload finds every device free."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    deadline = time.monotonic() + 900
    # The API server ends a collection delete at its request timeout (a minute), which
    # thousands of bound pods can outlast on a slow machine: delete until none is left.
    while True:
        await client.request("DELETE", pods, query={"gracePeriodSeconds": "0"}, timeout=600)
        left = _check(await client.request("GET", pods, query={"limit": "1"}), "list pods")
        if not left["items"]:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of {workload.name} in {namespace} not deleted")
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    await client.request("DELETE", claims, timeout=600)
    await client.request("DELETE", f"{RESOURCE}/deviceclasses/{namespace}-{workload.name}")
    while _check(await client.request("GET", claims), "list claims")["items"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"claims of {workload.name} in {namespace} not deleted")
        await asyncio.sleep(0.5)
