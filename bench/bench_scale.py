"""Benchmark: what many nodes' slices cost the API server and the scheduler.

Worker processes, one per core, host the slice publishers of N simulated nodes
(``SliceController``, as each node agent runs it; no kubelet needed; ``publishers.py``)
against a local control plane, a fresh one for every row, for five layouts of a dgx-h100
node: ``minimal`` (one device per GPU, no attributes, no counters), ``static`` (what the
agent publishes by default), ``dynamic`` (``--dynamic-mig``: every MIG placement, with
shared counters), ``dynamic-1g`` (``--dynamic-mig --mig-profiles=1g.10gb``: the whole GPUs
and their 1g.10gb placements only, which serve the same workloads) and ``dynamic-capacity``
(``--dynamic-mig --mig-layout=capacity``: each GPU one device, shared by MIG slices). Per
layout and node count it measures the time until every device is visible, the publishers'
CPU time, the bytes a watcher of all slices receives meanwhile (what every scheduler and
controller watching slices is sent), the API server's resident memory before and after, and
then the scheduler (``scheduling.py``): pods with a 1-GPU claim until every GPU is taken,
and on the dynamic layouts pods with a 1g.10gb MIG claim until every GPU is carved full (or
a cap).

For every workload it also records the CPU time the scheduler and the API server used while
it ran (per bound pod: what a layout costs the control plane, whichever process limits the
rate on this machine); ``--scheduler-profile DIR`` saves a CPU profile of the scheduler
(pprof, 20 s from 5 s into each workload) to read with ``go tool pprof -top -cum FILE``.

Run: ``.venv/bin/python bench/bench_scale.py [--nodes 10 100 500] [--layouts ...]
[--json FILE] [--scheduler-profile DIR]``; at the end it prints each layout's pods/s against
``static``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devenv.localcluster import LocalCluster
from dra_driver import logs
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.publish.catalog import CAPACITY, PLACEMENTS, Catalog, build_catalog
from dra_driver.gpu.publish.profiles import published_inventory
from dra_driver.gpu.state.checkpoint import DeviceRecord
from dra_driver.gpu.state.planner import (
    ClaimError,
    check_gpu_free,
    check_within,
    device_records,
    plan_claim,
)
from dra_driver.kube import KubeClient
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from dra_driver.resourceslice.pool import DesiredPool, SliceContent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contenders import cpu_seconds, exit_on_sigterm
from publishers import Publishers
from scheduling import Outcome, Workload, clean_up, make_schedulable, run_workload

PROFILE = "dgx-h100"
JSON = dict[str, Any]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def minimal_pool(driver: str, node: str) -> DesiredPool:
    """One bare device per GPU."""
    gpus = SimulatedDiscovery(PROFILE, node).discover().gpus
    devices = tuple({"name": f"gpu-{i}"} for i in range(len(gpus)))
    return DesiredPool(driver, node, node, (SliceContent(devices=devices),))


def catalog_pool(
    dynamic: bool, mig_profiles: str = "", layout: str = PLACEMENTS
) -> Callable[[str, str], DesiredPool]:
    def pool(driver: str, node: str) -> DesiredPool:
        return node_catalog(node, dynamic, mig_profiles, layout).pool(node, driver)

    return pool


def node_catalog(
    node: str, dynamic: bool, mig_profiles: str = "", layout: str = PLACEMENTS
) -> Catalog:
    """What the agent of a simulated node publishes and prepares from."""
    inventory = SimulatedDiscovery(PROFILE, node).discover()
    inventory = published_inventory(inventory, dynamic, mig_profiles)
    return build_catalog(inventory, dynamic=dynamic, layout=layout)


LAYOUTS: dict[str, Callable[[str, str], DesiredPool]] = {
    "minimal": minimal_pool,
    "static": catalog_pool(False),
    "dynamic": catalog_pool(True),
    # --dynamic-mig --mig-profiles=1g.10gb: the same allocations for the workloads below.
    "dynamic-1g": catalog_pool(True, "1g.10gb"),
    # --dynamic-mig --mig-layout=capacity: each GPU one device, shared by MIG slices.
    "dynamic-capacity": catalog_pool(True, layout=CAPACITY),
}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


#: The scheduler's client limits, lifted as scheduler_perf does, so the scheduler is measured;
#: the controller manager's too, so that thousands of claims are released between workloads
#: in seconds, not minutes (its default is 20 requests a second).
SCHEDULER_ARGS = ("--kube-api-qps=5000", "--kube-api-burst=5000")
CONTROLLER_MANAGER_ARGS = SCHEDULER_ARGS
#: Clients the benchmark spreads its creates over (each pools 4 connections).
CLIENTS = 4
#: Longest a workload may take; what is bound by then is reported.
WORKLOAD_CAP_S = 150.0
#: Most MIG pods per row (a dynamic node takes 56 1g.10gb devices).
MIG_CAP = 4000
GPUS_PER_NODE = 8


async def published(client: KubeClient, driver: str) -> tuple[int, int]:
    """Slices and devices of ``driver`` in the API server."""
    # 500 dynamic-MIG nodes' slices are 100,000 devices: listing them takes a while.
    resp = await client.request(
        "GET", SLICES, query={"fieldSelector": f"spec.driver={driver}"}, timeout=300
    )
    items = resp.json()["items"]
    return len(items), sum(len(s["spec"].get("devices") or []) for s in items)


async def all_published(client: KubeClient, driver: str, devices: int, what: str) -> None:
    """Wait until ``devices`` devices of ``driver`` are in the API server (at most 30 min)."""
    deadline = time.monotonic() + 1800
    while (await published(client, driver))[1] < devices:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not all published")
        # Each check lists every slice: poll big pools less often, so as not to load the
        # API server that is being measured.
        await asyncio.sleep(0.2 if devices < 10_000 else 2.0)


async def count_watch_bytes(client: KubeClient, counter: list[int]) -> None:
    """Count the bytes of a watch on every ResourceSlice (as a scheduler holds one)."""
    listing = await client.request("GET", SLICES, query={"limit": "1"})
    query = {"watch": "1", "resourceVersion": listing.json()["metadata"]["resourceVersion"]}
    async with client.stream("GET", SLICES, query=query) as resp:
        async for line in resp.lines():
            counter[0] += len(line) + 1


def workloads(layout: str, driver: str, nodes: int) -> list[Workload]:
    """What is scheduled on a layout: whole GPUs everywhere, MIG devices where published."""
    attrs = f'device.attributes["{driver}"]'
    gpu = Workload("gpu", "gpu", "" if layout == "minimal" else f'{attrs}.type == "gpu"', 0)
    gpu.pods = GPUS_PER_NODE * nodes
    out = [gpu]
    pods = min(7 * GPUS_PER_NODE * nodes, MIG_CAP)
    if layout in ("dynamic", "dynamic-1g"):
        mig = f'{attrs}.type == "mig" && {attrs}.profile == "1g.10gb"'
        out.append(Workload("mig", "mig", mig, pods))
    elif layout == "dynamic-capacity":
        # The same class as whole GPUs: a claim that asks for slices gets a MIG device.
        small = {"computeSlices": "1", "memorySlices": "1"}
        out.append(Workload("mig", "mig", gpu.selector, pods, small))
    return out


def carvable(claims: Sequence[JSON], layout: str) -> str:
    """Whether the node agents could honour every allocation: the MIG device of each claim
    placed as the agent places it (:func:`plan_claim` over the claims in creation order).
    Returns "N of M" allocations carved."""
    catalogs: dict[str, Catalog] = {}
    taken: dict[str, list[tuple[str, DeviceRecord]]] = {}
    carved = total = 0
    for claim in sorted(claims, key=lambda c: c["metadata"]["creationTimestamp"]):
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            continue
        total += 1
        results = tuple(allocation["devices"]["results"])
        node = results[0]["pool"]
        mig_layout = CAPACITY if layout == "dynamic-capacity" else PLACEMENTS
        catalog = catalogs.get(node) or node_catalog(node, True, layout=mig_layout)
        catalogs[node] = catalog
        meta = claim["metadata"]
        ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
        try:
            plan = plan_claim(
                ClaimToPrepare(ref, claim, results, ()),
                catalog,
                results[0]["driver"],
                taken=taken.get(node, ()),
            )
        except ClaimError:
            continue
        records = device_records(plan, node)
        try:
            check_within(ref, records, catalog)
            check_gpu_free(ref, records, taken.get(node, []), catalog, {})
        except ClaimError:
            continue
        taken.setdefault(node, []).extend((ref.uid, r) for r in records)
        carved += 1
    return f"{carved} of {total}"


@dataclass
class ControlPlane:
    """The processes a row measures, and how to ask the scheduler for a CPU profile."""

    apiserver: int
    scheduler: int
    scheduler_url: str
    token: str
    profile_dir: Path | None = None

    def cpu(self) -> tuple[float, float]:
        """CPU seconds the scheduler and the API server used so far."""
        return cpu_seconds(self.scheduler), cpu_seconds(self.apiserver)

    async def profile(self, name: str, delay_s: float = 5.0, seconds: int = 20) -> None:
        """Save ``seconds`` of the scheduler's CPU profile as ``name``.pb.gz, ``delay_s`` from now
        (the claims are created first; the pods then)."""
        if self.profile_dir is None:
            return
        await asyncio.sleep(delay_s)
        request = urllib.request.Request(
            f"{self.scheduler_url}/debug/pprof/profile?seconds={seconds}",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        # The scheduler's serving certificate is self-signed; the connection is loopback.
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def fetch() -> bytes:
            with urllib.request.urlopen(request, context=insecure, timeout=seconds + 30) as resp:
                return bytes(resp.read())

        self.profile_dir.mkdir(parents=True, exist_ok=True)
        (self.profile_dir / f"{name}.pb.gz").write_bytes(await asyncio.to_thread(fetch))


async def measured(plane: ControlPlane, name: str, run: Awaitable[Outcome]) -> dict[str, Any]:
    """``run``'s summary with the control plane's CPU time per bound pod while it ran."""
    before = plane.cpu()
    profiling = asyncio.create_task(plane.profile(name))
    result = (await run).summary()
    scheduler, apiserver = (after - b for after, b in zip(plane.cpu(), before, strict=True))
    await profiling
    bound = result["bound"]
    # No pod bound: no cost per pod to tell (the table prints "-").
    result["scheduler_ms_per_pod"] = round(1000 * scheduler / bound, 2) if bound else None
    result["apiserver_ms_per_pod"] = round(1000 * apiserver / bound, 2) if bound else None
    return result


async def measure(
    clients: Sequence[KubeClient], plane: ControlPlane, kubeconfig: str, layout: str, nodes: int
) -> dict[str, Any]:
    client = clients[0]
    driver = f"{layout}-{nodes}.scale.dev"
    namespace = f"scale-{layout}-{nodes}"
    make = LAYOUTS[layout]
    pools = [make(driver, f"scale-{layout}-{nodes}-{i}") for i in range(nodes)]
    devices = sum(len(s.devices) for p in pools for s in p.slices)
    await client.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    for p in pools:  # a publisher waits for its Node object
        await client.request("POST", "/api/v1/nodes", body={"metadata": {"name": p.node_name}})
        await make_schedulable(client, p.node_name)
    rss_before = rss_kib(plane.apiserver)
    watched = [0]
    watch = asyncio.create_task(count_watch_bytes(clients[-1], watched))
    await asyncio.sleep(0.5)
    names = [p.node_name for p in pools]
    workers = await asyncio.to_thread(
        Publishers, kubeconfig, driver, layout, names, os.cpu_count() or 1
    )
    t0 = time.monotonic()
    workers.go()
    await all_published(client, driver, devices, f"{layout} x {nodes}")
    elapsed = time.monotonic() - t0
    cpu = workers.cpu_seconds() - workers.started
    slices, _ = await published(client, driver)
    await asyncio.sleep(2)
    watch.cancel()
    await asyncio.gather(watch, return_exceptions=True)
    rss_after = rss_kib(plane.apiserver)
    scheduled = []
    for workload in workloads(layout, driver, nodes):
        result = await measured(
            plane,
            f"{layout}-{nodes}-{workload.name}",
            run_workload(clients, driver, namespace, workload, WORKLOAD_CAP_S),
        )
        if layout in ("dynamic", "dynamic-capacity"):
            claims = await client.request(
                "GET",
                f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
                timeout=300,
            )
            result["carved"] = carvable(claims.json()["items"], layout)
        print({"layout": layout, "nodes": nodes, **result}, file=sys.stderr, flush=True)
        scheduled.append(result)
        await clean_up(client, namespace, workload)
    await asyncio.to_thread(workers.stop)
    return {
        "layout": layout,
        "nodes": nodes,
        "devices": devices,
        "slices": slices,
        "publish_all_s": round(elapsed, 2),
        "publisher_processes": len(workers.procs),
        "publisher_cpu_s": round(cpu, 2),
        "watch_mib": round(watched[0] / 2**20, 2),
        "apiserver_rss_before_mib": round(rss_before / 1024, 1),
        "apiserver_rss_after_mib": round(rss_after / 1024, 1),
        "scheduling": scheduled,
    }


async def measure_alone(layout: str, nodes: int, profile_dir: Path | None) -> dict[str, Any]:
    """Measure one layout at one node count on a control plane of its own: what an earlier
    row left in the API server (gigabytes after every placement at 500 nodes) must not slow
    the next row down."""
    with LocalCluster(
        verbosity=1,
        scheduler_extra_args=SCHEDULER_ARGS,
        controller_manager_extra_args=CONTROLLER_MANAGER_ARGS,
    ) as cluster:
        apiserver = cluster.processes["kube-apiserver"].pid
        scheduler = cluster.processes["kube-scheduler"].pid
        assert apiserver is not None and scheduler is not None and cluster.ports is not None
        plane = ControlPlane(
            apiserver,
            scheduler,
            f"https://127.0.0.1:{cluster.ports.scheduler}",
            cluster.token,
            profile_dir,
        )
        clients = [await KubeClient.create(str(cluster.kubeconfig)) for _ in range(CLIENTS)]
        try:
            return await measure(clients, plane, str(cluster.kubeconfig), layout, nodes)
        finally:
            for c in clients:
                await c.close()


async def run_all(
    counts: Sequence[int],
    layouts: Sequence[str],
    out: list[dict[str, Any]],
    save: Callable[[], None],
    profile_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Measure every (count, layout); each result is added to ``out`` and saved at once,
    so an interrupted run keeps what it measured."""
    for nodes in counts:
        for layout in layouts:
            result = await measure_alone(layout, nodes, profile_dir)
            print(result, file=sys.stderr, flush=True)
            out.append(result)
            save()
    return out


def ratios(results: Sequence[JSON]) -> list[str]:
    """Each layout's pods/s and API server growth against ``static`` of the same node count
    (whole-GPU pods of ``static`` are the yardstick for every workload)."""
    lines = []
    for nodes in sorted({r["nodes"] for r in results}):
        rows = {r["layout"]: r for r in results if r["nodes"] == nodes}
        static = rows.get("static")
        if static is None or not static.get("scheduling"):
            continue
        base = static["scheduling"][0]["pods_per_s"] or 0
        grown = static["apiserver_rss_after_mib"] - static["apiserver_rss_before_mib"]
        for layout, row in rows.items():
            if layout == "static":
                continue
            memory = row["apiserver_rss_after_mib"] - row["apiserver_rss_before_mib"]
            for s in row.get("scheduling", []):
                share = s["pods_per_s"] / base if base and s["pods_per_s"] else 0.0
                lines.append(
                    f"{nodes} nodes, {layout} {s['workload']}: {s['pods_per_s']} pods/s = "
                    f"{share:.0%} of static's {base} (goal 50%); API server "
                    f"{memory:+.0f} MiB vs static {grown:+.0f} MiB"
                    + (f"; carved {s['carved']}" if "carved" in s else "")
                )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--append", action="store_true", help="add to the rows already in --json")
    parser.add_argument(
        "--scheduler-profile", type=Path, help="save a CPU profile of the scheduler per workload"
    )
    args = parser.parse_args(argv)
    logs.configure("json", "warning")
    exit_on_sigterm()
    results: list[dict[str, Any]] = []
    if args.append and args.json and args.json.exists():
        results = json.loads(args.json.read_text())

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")

    asyncio.run(run_all(args.nodes, args.layouts, results, save, args.scheduler_profile))
    print(json.dumps(results, indent=2))
    print("\n".join(ratios(results)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
