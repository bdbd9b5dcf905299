"""Benchmark: the node agent as the kubelet and the API server see it.

Runs a local control plane (``devenv.localcluster``: kube-apiserver, scheduler, controller
manager and ``kubelet-dra`` nodes) and the real agent process (``dra-driver run --backend
simulated``), then measures:

* NodePrepareResources / NodeUnprepareResources latency (p50, p99) and throughput for 1-GPU
  claims at concurrency 1, 16 and 64, over the DRA socket with a client built from the protos;
  the claims are real ResourceClaim objects whose ``status.allocation`` is written through the
  status subresource, so every prepare reads its claim from the API server; fsyncs stay on;
* start-up: process start until registered with kubelet-dra, and until the slices are published;
* memory: resident set size idle and after 10,000 prepare/unprepare cycles, open descriptors;
* publisher: API writes in a steady state (5 minutes; ``--quick`` makes it 30 s), time to
  repair a deleted slice, and time to publish a node with 210 MIG devices.

Run: ``.venv/bin/python bench/bench_node.py [--quick] [--json FILE]``. Numbers, not pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import yaml

from devenv.localcluster import LocalCluster, ManagedProcess, NodeHandle, pick_free_ports
from devenv.simnode import start_driver
from dra_driver._proto.dra.v1 import api_pb2 as pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as pb2_grpc

DRIVER = "gpu.dra.dev"
NAMESPACE = "bench"
GPUS = 72  # enough for 64 concurrent claims on distinct devices
MIG_GPUS = 30  # x 7 MIG devices = 210 devices
CONCURRENCY = (1, 16, 64)


# ------------------------------------------------------------------------------ profiles


def many_gpus_profile(count: int) -> dict[str, Any]:
    """A node profile with ``count`` L4 GPUs."""
    return {
        "driverVersion": "580.95.05",
        "cudaDriverVersion": "13.0",
        "gpus": [
            {
                "product": "NVIDIA L4",
                "pciBusId": f"0000:{i // 32 + 1:02x}:{i % 32:02x}.0",
                "numaNode": i * 2 // count,
            }
            for i in range(count)
        ],
    }


def mig_profile(count: int) -> dict[str, Any]:
    """``count`` A100s in MIG mode, each split into seven 1g.5gb devices."""
    return {
        "driverVersion": "580.95.05",
        "cudaDriverVersion": "13.0",
        "gpus": [
            {
                "product": "NVIDIA A100-SXM4-40GB",
                "pciBusId": f"0000:{i + 1:02x}:00.0",
                "migEnabled": True,
                "migDevices": [{"profile": "1g.5gb", "start": s} for s in range(7)],
            }
            for i in range(count)
        ],
    }


# ------------------------------------------------------------------------------ helpers


def pct(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def usage(pid: int) -> dict[str, int]:
    """Resident set size (KiB) and open file descriptors of ``pid``."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return {"rss_kib": rss, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def poll(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


class Api:
    """Just the API calls the benchmark needs (sync client, raw JSON)."""

    def __init__(self, cluster: LocalCluster) -> None:
        from kubernetes import client as k
        from kubernetes import config as kconfig

        self.client = kconfig.new_client_from_config(config_file=str(cluster.kubeconfig))
        self.core = k.CoreV1Api(self.client)
        self.resource = k.ResourceV1Api(self.client)

    def slices(self, node: str) -> list[dict[str, Any]]:
        resp = self.resource.list_resource_slice(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        return list(json.loads(resp.data)["items"])

    def device_count(self, node: str) -> int:
        return sum(len(s["spec"].get("devices") or []) for s in self.slices(node))

    def delete_slices(self, node: str) -> None:
        for s in self.slices(node):
            self.resource.delete_resource_slice(s["metadata"]["name"])
        poll(lambda: not self.slices(node), 30, "slices deleted", 0.05)

    def slice_events(self, node: str, seconds: float) -> int:
        """Count watch events on the node's slices during ``seconds`` (each write makes one)."""
        from kubernetes import watch

        rv = json.loads(
            self.resource.list_resource_slice(
                field_selector=f"spec.nodeName={node}", _preload_content=False
            ).data
        )["metadata"]["resourceVersion"]
        events = 0
        deadline = time.monotonic() + seconds
        w = watch.Watch()
        while (left := deadline - time.monotonic()) > 1:
            for _ in w.stream(
                self.resource.list_resource_slice,
                field_selector=f"spec.nodeName={node}",
                resource_version=rv,
                timeout_seconds=int(left),
            ):
                events += 1
        return events

    def create_claims(self, node: str, devices: Sequence[str]) -> list[tuple[str, str]]:
        """One allocated claim per device; returns (name, uid) pairs."""
        out = []
        for i, device in enumerate(devices):
            name = f"bench-{i}"
            body = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                },
            }
            created = json.loads(
                self.resource.create_namespaced_resource_claim(
                    NAMESPACE, body, _preload_content=False
                ).data
            )
            created["status"] = {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
                        ]
                    }
                }
            }
            self.resource.replace_namespaced_resource_claim_status(
                name, NAMESPACE, created, _preload_content=False
            )
            out.append((name, created["metadata"]["uid"]))
        return out


def api_writes(metrics_port: int) -> int:
    """Non-GET requests the agent has sent to the API server (its own counter)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("dra_driver_api_requests_total{") and 'verb="GET"' not in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


# ------------------------------------------------------------------------------ measurements


def start_agent(
    cluster: LocalCluster, node: NodeHandle, profile: str, extra: Sequence[str] = ()
) -> tuple[ManagedProcess, float]:
    """Start the agent; return it and its start time (monotonic)."""
    cluster.stop_process(f"driver-{node.name}")
    t0 = time.monotonic()
    proc = start_driver(cluster, node, profile, extra=list(extra))
    return proc, t0


def registered_at(proc: ManagedProcess, offset: int) -> float | None:
    """The time the agent logged its registration, seen by polling its log after ``offset``."""
    with proc.log_path.open("rb") as f:
        f.seek(offset)
        if b"registered with kubelet" in f.read():
            return time.monotonic()
    return None


def measure_startup(
    cluster: LocalCluster, api: Api, node: NodeHandle, profile: str, devices: int, runs: int
) -> dict[str, Any]:
    """Process start -> registered with the kubelet, and -> all devices published."""
    registered: list[float] = []
    published: list[float] = []
    for _ in range(runs):
        cluster.stop_process(f"driver-{node.name}")
        api.delete_slices(node.name)
        log_path = cluster.log_path(f"driver-{node.name}")
        offset = log_path.stat().st_size if log_path.exists() else 0
        proc, t0 = start_agent(cluster, node, profile)
        reg = pub = None
        deadline = time.monotonic() + 60
        while (reg is None or pub is None) and time.monotonic() < deadline:
            if reg is None:
                reg = registered_at(proc, offset)
            if pub is None and api.device_count(node.name) == devices:
                pub = time.monotonic()
            time.sleep(0.005)
        if reg is None or pub is None:
            raise TimeoutError(f"agent start: registered={reg} published={pub}")
        registered.append(reg - t0)
        published.append(pub - t0)
    return {
        "runs": runs,
        "registered_s": [round(x, 3) for x in registered],
        "published_s": [round(x, 3) for x in published],
        "registered_median_s": round(statistics.median(registered), 3),
        "published_median_s": round(statistics.median(published), 3),
    }


async def prepare_cycles(
    socket: Path, claims: Sequence[tuple[str, str]], concurrency: int, cycles: int
) -> dict[str, Any]:
    """``concurrency`` workers, each preparing and unpreparing its own claim in a loop."""
    prep: list[float] = []
    unprep: list[float] = []
    errors = 0
    per_worker = max(1, cycles // concurrency)
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        stub = pb2_grpc.DRAPluginStub(channel)

        async def worker(name: str, uid: str) -> None:
            nonlocal errors
            claim = [pb2.Claim(namespace=NAMESPACE, name=name, uid=uid)]
            for _ in range(per_worker):
                t = time.perf_counter()
                r = await stub.NodePrepareResources(
                    pb2.NodePrepareResourcesRequest(claims=claim), timeout=60
                )
                prep.append(time.perf_counter() - t)
                errors += bool(r.claims[uid].error)
                t = time.perf_counter()
                u = await stub.NodeUnprepareResources(
                    pb2.NodeUnprepareResourcesRequest(claims=claim), timeout=60
                )
                unprep.append(time.perf_counter() - t)
                errors += bool(u.claims[uid].error)

        started = time.perf_counter()
        await asyncio.gather(*(worker(n, u) for n, u in claims[:concurrency]))
        elapsed = time.perf_counter() - started
    ms = 1000.0
    return {
        "concurrency": concurrency,
        "cycles": len(prep),
        "errors": errors,
        "prepare_p50_ms": round(pct(prep, 50) * ms, 2),
        "prepare_p99_ms": round(pct(prep, 99) * ms, 2),
        "unprepare_p50_ms": round(pct(unprep, 50) * ms, 2),
        "unprepare_p99_ms": round(pct(unprep, 99) * ms, 2),
        # A claim counts once it has been prepared and unprepared again.
        "claims_per_s": round(len(prep) / elapsed, 1),
        "seconds": round(elapsed, 1),
    }


def measure_repair(api: Api, node: str, devices: int, runs: int) -> list[float]:
    """Delete a slice; time until the node's devices are all published again."""
    times = []
    for _ in range(runs):
        victim = api.slices(node)[0]["metadata"]["name"]
        t0 = time.monotonic()
        api.resource.delete_resource_slice(victim)
        poll(lambda: api.device_count(node) == devices, 30, "slice repaired", 0.005)
        times.append(time.monotonic() - t0)
        time.sleep(0.5)
    return [round(t, 3) for t in times]


# ------------------------------------------------------------------------------ main


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    work = Path(tempfile.mkdtemp(prefix="bench-node-"))
    profile = work / "gpus.yaml"
    profile.write_text(yaml.safe_dump(many_gpus_profile(GPUS)))
    migs = work / "mig.yaml"
    migs.write_text(yaml.safe_dump(mig_profile(MIG_GPUS)))
    (metrics_port,) = pick_free_ports(1)

    with LocalCluster(verbosity=1) as cluster:
        api = Api(cluster)
        api.core.create_namespace({"metadata": {"name": NAMESPACE}})
        node = cluster.add_node("bench-gpus")
        log(f"control plane up; Kubernetes {cluster.version}")

        results["startup"] = measure_startup(
            cluster, api, node, str(profile), GPUS, 3 if args.quick else 7
        )
        log(f"startup: {results['startup']}")

        proc, _ = start_agent(cluster, node, str(profile), [f"--metrics-port={metrics_port}"])
        poll(lambda: api.device_count(node.name) == GPUS, 60, "published")
        assert proc.pid is not None
        time.sleep(3)
        results["memory_idle"] = usage(proc.pid)
        log(f"idle: {results['memory_idle']}")

        claims = api.create_claims(node.name, [f"gpu-{i}" for i in range(max(CONCURRENCY))])
        socket = node.plugin_dir(DRIVER) / "dra.sock"
        latency = []
        total_cycles = 0
        for c in CONCURRENCY:
            cycles = (300 if c == 1 else 1000) if not args.quick else 200
            r = asyncio.run(prepare_cycles(socket, claims, c, cycles))
            total_cycles += r["cycles"]
            latency.append(r)
            log(f"concurrency {c}: {r}")
        results["latency"] = latency

        # The rest of the 10,000 cycles, at concurrency 16, sampling memory as it goes.
        soak_target = 2000 if args.quick else 10_000
        samples = [{"cycles": total_cycles, **usage(proc.pid)}]
        while total_cycles < soak_target:
            r = asyncio.run(
                prepare_cycles(socket, claims, 16, min(2000, soak_target - total_cycles))
            )
            total_cycles += r["cycles"]
            samples.append({"cycles": total_cycles, **usage(proc.pid)})
            log(f"memory after {total_cycles} cycles: {samples[-1]}")
        results["memory_cycles"] = samples

        results["repair_s"] = measure_repair(api, node.name, GPUS, 3 if args.quick else 5)
        log(f"repair: {results['repair_s']}")

        steady = 30.0 if args.quick else 300.0
        time.sleep(2)  # let the last repair settle
        before = api_writes(metrics_port)
        events = api.slice_events(node.name, steady)
        results["steady_state"] = {
            "seconds": steady,
            "api_writes": api_writes(metrics_port) - before,
            "slice_events": events,
        }
        log(f"steady state: {results['steady_state']}")
        assert proc.alive() and proc.pid == results.get("pid", proc.pid)

        mig_node = cluster.add_node("bench-mig")
        devices = MIG_GPUS * 7
        results["big_node"] = {
            "devices": devices,
            **measure_startup(cluster, api, mig_node, str(migs), devices, 3),
        }
        log(f"big node: {results['big_node']}")
    results["machine"]["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return results


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs for iterating")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    results = run(args)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
