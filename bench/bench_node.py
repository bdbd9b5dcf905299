"""Benchmark: the node agent as the kubelet and the API server see it, beside the reference.

Runs a local control plane (``devenv.localcluster``: kube-apiserver, scheduler, controller
manager and a ``kubelet-dra`` node) and the real agent process (``dra-driver run --backend
simulated``), given ``--reference-bin`` the Go reference kubelet plugin, and the Python floor
(``bench/floor_plugin.py``: the same claim read and syncs, nothing else) on the same node (see
``bench/contenders.py``). Each serves 72 GPUs. Every figure is taken in interleaved rounds
(ours, reference, floor, ours, ...) so all see the same load:

* NodePrepareResources / NodeUnprepareResources latency (p50, p99) and throughput for 1-GPU
  claims at concurrency 1, 16 and 64, over the DRA socket with a client built from the protos;
  the claims are real ResourceClaim objects whose ``status.allocation`` is written through the
  status subresource, so every prepare reads its claim from the API server; fsyncs stay on;
* start-up: process start until the registration socket exists, and until the slices are
  published;
* memory: process tree RSS and PSS idle and during 20,000 prepare/unprepare cycles, open
  descriptors, API-server connections idle and after a burst; CPU per claim; fsyncs per
  prepare+unprepare (strace);
* the reference once more at its shipped client defaults (5 QPS, burst 10);
* where our CPU goes: a py-spy profile of the agent preparing one claim at a time, and a
  count of what ours and the floor call per claim, by component (``call_profile.py``);
* publisher (ours alone): API writes in a steady state (5 minutes; ``--quick`` makes it 30 s),
  time to repair a deleted slice, and time to publish a node with 210 MIG devices.

Run: ``.venv/bin/python bench/bench_node.py [--quick] [--reference-bin PATH] [--json FILE]``.
Numbers, not pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import call_profile
import grpc
import import_pss
import yaml
from contenders import (
    OURS_DRIVER,
    REFERENCE_CLIENT_FLAGS,
    Contender,
    SyscallCounter,
    api_connections,
    compile_sources,
    cpu_seconds,
    exit_on_sigterm,
    floor,
    ours,
    reference,
    usage,
)
from cpu_profile import Sampler

from devenv.localcluster import LocalCluster, NodeHandle, pick_free_ports
from dra_driver._proto.dra.v1 import api_pb2 as pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as pb2_grpc

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

    def slices(self, node: str, driver: str = OURS_DRIVER) -> list[dict[str, Any]]:
        resp = self.resource.list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={driver}", _preload_content=False
        )
        return list(json.loads(resp.data)["items"])

    def device_count(self, node: str, driver: str = OURS_DRIVER) -> int:
        return sum(len(s["spec"].get("devices") or []) for s in self.slices(node, driver))

    def delete_slices(self, node: str, driver: str = OURS_DRIVER) -> None:
        for s in self.slices(node, driver):
            self.resource.delete_resource_slice(s["metadata"]["name"])
        poll(lambda: not self.slices(node, driver), 30, "slices deleted", 0.05)

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

    def create_claims(
        self, node: str, driver: str, devices: Sequence[str]
    ) -> list[tuple[str, str]]:
        """One claim allocated by ``driver`` per device; returns (name, uid) pairs."""
        out = []
        for i, device in enumerate(devices):
            name = f"{driver}-{i}"
            body = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]
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
                            {"request": "gpu", "driver": driver, "pool": node, "device": device}
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


def interleaved(contenders: Sequence[Contender], rounds: int) -> Iterator[Contender]:
    """A, B, A, B, ...: ``rounds`` turns each, alternating, so both see the same load."""
    for _ in range(rounds):
        yield from contenders


#: How often the API server is asked for the slices while the registration socket is not
#: there yet (a stat of the socket costs nothing; a list is a request the server answers).
STARTING_API_POLL_S = 0.025


def measure_startup(
    cluster: LocalCluster, api: Api, contenders: Sequence[Contender], devices: int, runs: int
) -> dict[str, dict[str, Any]]:
    """Process start -> registration socket exists, and -> all devices published."""
    times: dict[str, dict[str, list[float]]] = {
        c.label: {"registered": [], "published": []} for c in contenders
    }
    for c in interleaved(contenders, runs):
        c.stop(cluster)
        api.delete_slices(c.node.name, c.driver)
        t0 = c.start(cluster)
        reg = pub = None
        deadline = time.monotonic() + 60
        ask_api = t0
        while (reg is None or pub is None) and time.monotonic() < deadline:
            if reg is None and c.registration_socket.exists():
                reg = time.monotonic()
            if pub is None and time.monotonic() >= ask_api:
                if api.device_count(c.node.name, c.driver) == devices:
                    pub = time.monotonic()
                # Until the socket is there, the API server is asked seldom: each question
                # costs CPU (ours and the API server's) that the starting process needs.
                ask_api = time.monotonic() + (STARTING_API_POLL_S if reg is None else 0)
            time.sleep(0.001 if reg is None else 0.005)
        if reg is None or pub is None:
            raise TimeoutError(f"{c.label} start: registered={reg} published={pub}")
        times[c.label]["registered"].append(reg - t0)
        times[c.label]["published"].append(pub - t0)
    out = {}
    for label, t in times.items():
        out[label] = {
            "runs": runs,
            "registered_s": [round(x, 3) for x in t["registered"]],
            "published_s": [round(x, 3) for x in t["published"]],
            "registered_median_s": round(statistics.median(t["registered"]), 3),
            "published_median_s": round(statistics.median(t["published"]), 3),
        }
    return out


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
    return {"prepare": prep, "unprepare": unprep, "errors": errors, "seconds": elapsed}


def summarize(concurrency: int, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pool the samples of several rounds at one concurrency."""
    prep = [x for r in runs for x in r["prepare"]]
    unprep = [x for r in runs for x in r["unprepare"]]
    seconds = sum(r["seconds"] for r in runs)
    ms = 1000.0
    return {
        "concurrency": concurrency,
        "rounds": len(runs),
        "cycles": len(prep),
        "errors": sum(r["errors"] for r in runs),
        "prepare_p50_ms": round(pct(prep, 50) * ms, 2),
        "prepare_p99_ms": round(pct(prep, 99) * ms, 2),
        "unprepare_p50_ms": round(pct(unprep, 50) * ms, 2),
        "unprepare_p99_ms": round(pct(unprep, 99) * ms, 2),
        # A claim counts once it has been prepared and unprepared again.
        "claims_per_s": round(len(prep) / seconds, 1),
        "claims_per_s_rounds": [round(len(r["prepare"]) / r["seconds"], 1) for r in runs],
        "seconds": round(seconds, 1),
    }


def measure_latency(
    contenders: Sequence[Contender],
    claims: dict[str, list[tuple[str, str]]],
    rounds: int,
    quick: bool,
) -> dict[str, list[dict[str, Any]]]:
    """Every concurrency, the contenders' rounds interleaved."""
    out: dict[str, list[dict[str, Any]]] = {c.label: [] for c in contenders}
    for conc in CONCURRENCY:
        cycles = 200 if quick else (300 if conc == 1 else 1000)
        runs: dict[str, list[dict[str, Any]]] = {c.label: [] for c in contenders}
        for c in interleaved(contenders, rounds):
            runs[c.label].append(
                asyncio.run(prepare_cycles(c.dra_socket, claims[c.label], conc, cycles))
            )
        for label, r in runs.items():
            out[label].append(summarize(conc, r))
            log(f"{label} concurrency {conc}: {out[label][-1]}")
    return out


def measure_costs(
    contenders: Sequence[Contender],
    claims: dict[str, list[tuple[str, str]]],
    cycles: int,
    cpu_cycles: int,
    work: Path,
) -> dict[str, dict[str, Any]]:
    """CPU per claim (over ``cpu_cycles``) and fsyncs per prepare+unprepare (over
    ``cycles``), one claim at a time.

    The CPU is measured in interleaved rounds (a tenth of ``cpu_cycles`` each), like the
    latencies: measured one contender after the other, the ratio moved by more than a tenth
    between runs of the same code. A round must be long against the kernel's CPU accounting
    tick (10 ms): 30 cycles per round put each round's figure on a grid of 0.33 ms per
    claim. The syscall count comes after, under strace."""
    rounds = 10
    per_round = max(1, cpu_cycles // rounds)
    cpu: dict[str, list[float]] = {c.label: [] for c in contenders}
    for c in interleaved(contenders, rounds):
        before = cpu_seconds(c.pid)
        asyncio.run(prepare_cycles(c.dra_socket, claims[c.label], 1, per_round))
        cpu[c.label].append((cpu_seconds(c.pid) - before) * 1000 / per_round)
    out = {}
    for c in contenders:
        counter = SyscallCounter(c.pid, work / f"strace-{c.label}.txt")
        asyncio.run(prepare_cycles(c.dra_socket, claims[c.label], 1, cycles))
        fsyncs = counter.stop()
        out[c.label] = {
            "cpu_ms_per_claim": round(statistics.mean(cpu[c.label]), 2),
            "cpu_ms_rounds": [round(x, 2) for x in cpu[c.label]],
            "fsyncs_per_cycle": fsyncs / cycles,
        }
        log(f"{c.label} costs: {out[c.label]}")
    return out


def measure_profile(
    mine: Contender, claims: list[tuple[str, str]], cycles: int, work: Path
) -> dict[str, Any]:
    """Ours under py-spy while it prepares and unprepares one claim at a time."""
    sampler = Sampler(mine.pid, work / "profile-ours.txt")
    asyncio.run(prepare_cycles(mine.dra_socket, claims, 1, cycles))
    out = {"cycles": cycles, **sampler.stop()}
    log(f"profile: {out['areas']}")
    return out


def measure_calls(
    cluster: LocalCluster,
    api: Api,
    contenders: Sequence[Contender],
    claims: dict[str, list[tuple[str, str]]],
    cycles: int,
    work: Path,
) -> dict[str, Any]:
    """Each contender restarted under the call profile (``call_profile.py``), then profiled
    while it prepares and unprepares one claim at a time. The last step: the contenders stay
    profiled."""
    out: dict[str, Any] = {}
    for c in contenders:
        stats = work / f"calls-{c.label}.prof"
        launcher = [c.argv[0], call_profile.__file__, str(stats)]
        profiled = dataclasses.replace(c, argv=[*launcher, *c.argv[1:]])
        start_all(cluster, api, [profiled])
        asyncio.run(prepare_cycles(profiled.dra_socket, claims[c.label], 1, 300))  # warm
        os.kill(profiled.pid, signal.SIGUSR1)
        time.sleep(0.5)  # the handler runs once the loop wakes
        asyncio.run(prepare_cycles(profiled.dra_socket, claims[c.label], 1, cycles))
        os.kill(profiled.pid, signal.SIGUSR2)
        poll(stats.exists, 30, f"{c.label}'s call profile")
        out[c.label] = call_profile.summarize(stats, cycles)
        log(f"{c.label} calls per claim: {out[c.label]['calls']}")
    return out


def probe(c: Contender, port: int) -> dict[str, int]:
    """Memory, descriptors and API-server connections of a contender now."""
    return {**usage(c.pid), "api_connections": api_connections(c.pid, port)}


def measure_idle(
    cluster: LocalCluster, api: Api, contenders: Sequence[Contender], port: int
) -> dict[str, dict[str, int]]:
    """Each contender's memory, descriptors and connections 3 s after it published, alone.

    The other contenders are stopped meanwhile: two Python plugins map the same interpreter,
    libraries and extension modules, and with both running each one's PSS would count half of
    those pages, a discount no agent alone on a real node gets.
    """
    out = {}
    for c in contenders:
        for other in contenders:
            if other is not c:
                other.stop(cluster)
        start_all(cluster, api, [c])
        time.sleep(3)
        out[c.label] = probe(c, port)
    return out


def measure_soak(
    contenders: Sequence[Contender],
    claims: dict[str, list[tuple[str, str]]],
    done: dict[str, int],
    target: int,
    port: int,
) -> dict[str, list[dict[str, int]]]:
    """Prepare/unprepare cycles at concurrency 16 from ``done`` until ``target``, sampling
    memory, fds and API connections (each sample taken 2 s after its burst ended)."""
    samples: dict[str, list[dict[str, int]]] = {c.label: [] for c in contenders}
    done = dict(done)
    for c in contenders:
        samples[c.label].append({"cycles": done[c.label], **probe(c, port)})
    while min(done.values()) < target:
        for c in contenders:
            burst = min(2000, target - done[c.label])
            r = asyncio.run(prepare_cycles(c.dra_socket, claims[c.label], 16, burst))
            done[c.label] += len(r["prepare"])
            time.sleep(2)
            samples[c.label].append({"cycles": done[c.label], **probe(c, port)})
            log(f"{c.label} after {done[c.label]} cycles: {samples[c.label][-1]}")
    return samples


def measure_reference_defaults(
    cluster: LocalCluster, api: Api, ref: Contender, claims: list[tuple[str, str]], quick: bool
) -> dict[str, Any]:
    """The reference at its shipped client rate limit, concurrency 16, then restored."""
    lifted = ref.argv
    ref.argv = [a for a in lifted if a not in REFERENCE_CLIENT_FLAGS]
    try:
        ref.start(cluster)
        poll(lambda: api.device_count(ref.node.name, ref.driver) == GPUS, 60, "published")
        poll(ref.dra_socket.exists, 30, "reference DRA socket")
        run = asyncio.run(prepare_cycles(ref.dra_socket, claims, 16, 64 if quick else 160))
    finally:
        ref.argv = lifted
        ref.start(cluster)
    poll(lambda: api.device_count(ref.node.name, ref.driver) == GPUS, 60, "published")
    return {"flags": "none (5 QPS, burst 10)", **summarize(16, [run])}


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


def measure_publisher(
    cluster: LocalCluster, api: Api, mine: Contender, metrics_port: int, migs: Path, quick: bool
) -> dict[str, Any]:
    """Ours alone: slice repair, steady-state writes, and a node of 210 MIG devices."""
    node = mine.node.name
    out: dict[str, Any] = {"repair_s": measure_repair(api, node, GPUS, 3 if quick else 5)}
    log(f"repair: {out['repair_s']}")
    steady = 30.0 if quick else 300.0
    time.sleep(2)  # let the last repair settle
    before = api_writes(metrics_port)
    events = api.slice_events(node, steady)
    out["steady_state"] = {
        "seconds": steady,
        "api_writes": api_writes(metrics_port) - before,
        "slice_events": events,
    }
    log(f"steady state: {out['steady_state']}")
    mig_node = cluster.add_node("bench-mig")
    devices = MIG_GPUS * 7
    (port,) = pick_free_ports(1)
    big = ours(cluster, mig_node, str(migs), port)
    out["big_node"] = {
        "devices": devices,
        **measure_startup(cluster, api, [big], devices, 3)["ours"],
    }
    log(f"big node: {out['big_node']}")
    return out


# ------------------------------------------------------------------------------ main


def api_port(cluster: LocalCluster) -> int:
    """The API server's port, from its URL."""
    return int(cluster.server.rstrip("/").rsplit(":", 1)[1])


def start_all(cluster: LocalCluster, api: Api, contenders: Sequence[Contender]) -> None:
    """Fresh processes for every contender; returns once each serves and has published.

    Each one's slices are deleted between its stop and its start: the floor publishes one more
    slice at each start and never deletes one.
    """
    for c in contenders:
        c.stop(cluster)
        api.delete_slices(c.node.name, c.driver)
        c.start(cluster)
    for c in contenders:
        poll(lambda c=c: api.device_count(c.node.name, c.driver) == GPUS, 60, "published")
        poll(c.dra_socket.exists, 30, f"{c.label} DRA socket")


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    compile_sources()
    results["imports"] = import_pss.measure()
    log(f"imports: {results['imports']}")
    work = Path(tempfile.mkdtemp(prefix="bench-node-"))
    profile = work / "gpus.yaml"
    profile.write_text(yaml.safe_dump(many_gpus_profile(GPUS)))
    migs = work / "mig.yaml"
    migs.write_text(yaml.safe_dump(mig_profile(MIG_GPUS)))
    (metrics_port,) = pick_free_ports(1)
    # Interleaved rounds per concurrency: with two, one busy moment of the machine moved a
    # ratio by a fifth; a round at concurrency 1 takes about two seconds.
    rounds = 1 if args.quick else 6

    with LocalCluster(verbosity=1) as cluster:
        api = Api(cluster)
        api.core.create_namespace({"metadata": {"name": NAMESPACE}})
        node: NodeHandle = cluster.add_node("bench-gpus")
        log(f"control plane up; Kubernetes {cluster.version}")
        mine = ours(cluster, node, str(profile), metrics_port)
        contenders = [mine]
        ref = None
        if args.reference_bin:
            ref = reference(cluster, node, args.reference_bin, GPUS, args.reference_version)
            contenders.append(ref)
        if not args.no_floor:
            contenders.append(floor(cluster, node, GPUS))
        results["kubernetes"] = cluster.version
        results["contenders"] = {
            c.label: {"driver": c.driver, "version": c.version, "argv": c.argv, "env": c.env}
            for c in contenders
        }
        results["startup"] = measure_startup(cluster, api, contenders, GPUS, 3 if args.quick else 7)
        log(f"startup: {results['startup']}")

        port = api_port(cluster)
        results["memory_idle"] = measure_idle(cluster, api, contenders, port)
        results["memory_idle_alone"] = True
        log(f"idle: {results['memory_idle']}")
        start_all(cluster, api, contenders)
        devices = [f"gpu-{i}" for i in range(max(CONCURRENCY))]
        claims = {c.label: api.create_claims(node.name, c.driver, devices) for c in contenders}
        results["latency"] = measure_latency(contenders, claims, rounds, args.quick)
        done = {label: sum(r["cycles"] for r in rs) for label, rs in results["latency"].items()}
        results["memory_cycles"] = measure_soak(
            contenders, claims, done, 2000 if args.quick else 20_000, port
        )
        # Before the costs: their syscall count runs the agents under strace, which slows
        # every call; the profile is of the agent as it runs untraced.
        results["profile"] = measure_profile(
            mine, claims["ours"], 200 if args.quick else 1000, work
        )
        results["costs"] = measure_costs(
            contenders, claims, 100 if args.quick else 300, 300 if args.quick else 1500, work
        )
        if ref is not None:
            results["reference_defaults"] = measure_reference_defaults(
                cluster, api, ref, claims["reference"], args.quick
            )
            log(f"reference at shipped defaults: {results['reference_defaults']}")
        results["publisher"] = measure_publisher(cluster, api, mine, metrics_port, migs, args.quick)
        profiled = [c for c in contenders if c.label in ("ours", "floor")]
        results["calls"] = measure_calls(
            cluster, api, profiled, claims, 200 if args.quick else 1000, work
        )
    results["machine"]["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return results


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs for iterating")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--reference-bin",
        type=Path,
        help="the reference kubelet plugin (dra-example-kubeletplugin); without it, ours alone",
    )
    parser.add_argument(
        "--reference-version", default="unknown", help="what the reference was built from"
    )
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="leave out the Python floor (bench/floor_plugin.py: the same claim read and "
        "syncs as the agent, nothing else)",
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if args.reference_bin is None:
        log("no --reference-bin: measuring this driver alone")
    results = run(args)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
