"""Benchmark: what many nodes' slices cost the API server.

One process hosts the slice publishers of N simulated nodes (``SliceController``, as each
node agent runs it; no kubelet needed) against a local control plane, for three layouts of a
dgx-h100 node: ``minimal`` (one device per GPU, no attributes, no counters), ``static`` (what
the agent publishes by default) and ``dynamic`` (``--dynamic-mig``: every MIG placement, with
shared counters). Per layout and node count it measures the time until every device is
visible and the API server's resident memory before and after.

Run: ``.venv/bin/python bench/bench_scale.py [--nodes 10 100] [--json FILE]``.
The scheduler's throughput over such a cluster is not measured here yet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from devenv.localcluster import LocalCluster
from dra_driver import logs
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.kube import KubeClient
from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.pool import DesiredPool, SliceContent

PROFILE = "dgx-h100"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def minimal_pool(driver: str, node: str) -> DesiredPool:
    """One bare device per GPU."""
    gpus = SimulatedDiscovery(PROFILE, node).discover().gpus
    devices = tuple({"name": f"gpu-{i}"} for i in range(len(gpus)))
    return DesiredPool(driver, node, node, (SliceContent(devices=devices),))


def catalog_pool(dynamic: bool) -> Callable[[str, str], DesiredPool]:
    def pool(driver: str, node: str) -> DesiredPool:
        inventory = SimulatedDiscovery(PROFILE, node).discover()
        return build_catalog(inventory, dynamic=dynamic).pool(node, driver)

    return pool


LAYOUTS: dict[str, Callable[[str, str], DesiredPool]] = {
    "minimal": minimal_pool,
    "static": catalog_pool(False),
    "dynamic": catalog_pool(True),
}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def published(client: KubeClient, driver: str) -> tuple[int, int]:
    """Slices and devices of ``driver`` in the API server."""
    resp = await client.request("GET", SLICES, query={"fieldSelector": f"spec.driver={driver}"})
    items = resp.json()["items"]
    return len(items), sum(len(s["spec"].get("devices") or []) for s in items)


async def measure(client: KubeClient, apiserver: int, layout: str, nodes: int) -> dict[str, Any]:
    driver = f"{layout}-{nodes}.scale.dev"
    make = LAYOUTS[layout]
    pools = [make(driver, f"scale-{layout}-{nodes}-{i}") for i in range(nodes)]
    devices = sum(len(s.devices) for p in pools for s in p.slices)
    for p in pools:  # a publisher waits for its Node object
        await client.request("POST", "/api/v1/nodes", body={"metadata": {"name": p.node_name}})
    rss_before = rss_kib(apiserver)
    controllers = [SliceController(client, driver=driver, node_name=p.node_name) for p in pools]
    t0 = time.monotonic()
    tasks = [asyncio.create_task(c.run()) for c in controllers]
    for c, p in zip(controllers, pools, strict=True):
        await c.set_pool(p)
    while (await published(client, driver))[1] < devices:
        if time.monotonic() - t0 > 600:
            raise TimeoutError(f"{layout} x {nodes}: not all published")
        await asyncio.sleep(0.2)
    elapsed = time.monotonic() - t0
    slices, _ = await published(client, driver)
    await asyncio.sleep(2)
    rss_after = rss_kib(apiserver)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.request("DELETE", SLICES, query={"fieldSelector": f"spec.driver={driver}"})
    return {
        "layout": layout,
        "nodes": nodes,
        "devices": devices,
        "slices": slices,
        "publish_all_s": round(elapsed, 2),
        "apiserver_rss_before_mib": round(rss_before / 1024, 1),
        "apiserver_rss_after_mib": round(rss_after / 1024, 1),
    }


async def run_all(cluster: LocalCluster, counts: Sequence[int]) -> list[dict[str, Any]]:
    proc = cluster.processes["kube-apiserver"]
    assert proc.pid is not None
    out = []
    async with await KubeClient.create(str(cluster.kubeconfig)) as client:
        for nodes in counts:
            for layout in LAYOUTS:
                result = await measure(client, proc.pid, layout, nodes)
                print(result, file=sys.stderr, flush=True)
                out.append(result)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logs.configure("json", "warning")
    with LocalCluster(verbosity=1) as cluster:
        results = asyncio.run(run_all(cluster, args.nodes))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
