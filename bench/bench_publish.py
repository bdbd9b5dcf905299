"""Benchmark: the agent's slice publisher against the upstream Go one, on the same pools.

For each node count and layout of ``bench_scale.py`` the same pools are published twice,
each time on a local control plane of its own: by the agent's ``SliceController`` in worker
processes (one per core, ``publishers.py``) and by the upstream ``resourceslice`` controller
that Go kubelet plugins use (``testenv/cmd/slicepub``, one controller per node in one
process). Each is started once its process is ready; measured are the time until every
device is visible, the CPU time the publishers used, and the writes and written bytes they
sent. A fresh control plane per run keeps what an earlier run left (gigabytes of deleted
placement slices at 500 nodes) from slowing or ending a later one; a run that fails anyway
is recorded with its error, and the others still run.

Run: ``.venv/bin/python bench/bench_publish.py [--nodes 100 500] [--layouts ...] [--json F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devenv.localcluster import LocalCluster
from dra_driver import logs
from dra_driver.kube import KubeClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import LAYOUTS, all_published
from contenders import cpu_seconds, exit_on_sigterm
from publishers import Publishers

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / ".cache" / "bench" / "slicepub"
JSON = dict[str, Any]


def build_binary() -> Path:
    """Build the upstream controller's host against testenv's newest Kubernetes modules."""
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["go", "build", "-o", str(BINARY), "./cmd/slicepub"], cwd=ROOT / "testenv", check=True
    )
    return BINARY


class GoPublisher:
    """``slicepub`` publishing the pools of ``nodes``."""

    def __init__(self, kubeconfig: str, driver: str, layout: str, nodes: Sequence[str]) -> None:
        pools = []
        for node in nodes:
            pool = LAYOUTS[layout](driver, node)
            slices = [
                {"devices": list(s.devices), "sharedCounters": list(s.shared_counters)}
                for s in pool.slices
            ]
            pools.append({"node": node, "slices": slices})
        self._file = tempfile.NamedTemporaryFile("w", suffix=".json")  # noqa: SIM115
        json.dump(pools, self._file)
        self._file.flush()
        self.proc = subprocess.Popen(
            [
                str(BINARY),
                f"-kubeconfig={kubeconfig}",
                f"-driver={driver}",
                f"-pools={self._file.name}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError("slicepub failed to start")
        self.started = self.cpu_seconds()

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        self._file.close()
        line = next((x for x in out.splitlines() if x.startswith("{")), "{}")
        return {k: int(v) for k, v in json.loads(line).items()}


async def _publish_once(
    client: KubeClient, kubeconfig: str, driver: str, layout: str, nodes: Sequence[str], go: bool
) -> JSON:
    devices = sum(len(s.devices) for n in nodes for s in LAYOUTS[layout](driver, n).slices)
    pub: GoPublisher | Publishers
    if go:
        pub = await asyncio.to_thread(GoPublisher, kubeconfig, driver, layout, nodes)
    else:
        workers = os.cpu_count() or 1
        pub = await asyncio.to_thread(Publishers, kubeconfig, driver, layout, nodes, workers)
    try:
        t0 = time.monotonic()
        pub.go()
        await all_published(client, driver, devices, f"{layout} x {len(nodes)}")
        elapsed = time.monotonic() - t0
        cpu = pub.cpu_seconds() - pub.started
    finally:
        # Settled: a resync would only read; what was written is what publishing took.
        sent = await asyncio.to_thread(pub.stop)
    return {
        "publish_all_s": round(elapsed, 2),
        "cpu_s": round(cpu, 2),
        "writes": sent.get("writes"),
        "write_mib": round(sent.get("writeBytes", 0) / 2**20, 2),
    }


async def measure(kubeconfig: str, layout: str, count: int, go: bool) -> JSON:
    """One publisher's run of one layout on ``count`` nodes (a control plane of its own)."""
    driver = f"pub-{layout}-{count}.scale.dev"
    nodes = [f"pub-{layout}-{count}-{i}" for i in range(count)]
    client = await KubeClient.create(kubeconfig)
    try:
        for node in nodes:  # publishers wait for their Node object; Go owners need its UID
            await client.request("POST", "/api/v1/nodes", body={"metadata": {"name": node}})
        return await _publish_once(client, kubeconfig, driver, layout, nodes, go)
    finally:
        await client.close()


def run_row(layout: str, count: int, go: bool) -> JSON:
    """Measure one row; a failure is the row's ``error``, not the end of the benchmark."""
    row: JSON = {"publisher": "go" if go else "ours"}
    try:
        with LocalCluster(verbosity=1) as cluster:
            row.update(asyncio.run(measure(str(cluster.kubeconfig), layout, count, go)))
    except Exception as exc:  # whatever ended it is the row's result
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    row.update(nodes=count, layout=layout)
    print(row, file=sys.stderr, flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 500])
    parser.add_argument(
        "--layouts", nargs="+", choices=list(LAYOUTS), default=["static", "dynamic-capacity"]
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logs.configure("json", "warning")
    exit_on_sigterm()
    build_binary()
    rows = [
        run_row(layout, count, go)
        for count in args.nodes
        for layout in args.layouts
        for go in (False, True)
    ]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
