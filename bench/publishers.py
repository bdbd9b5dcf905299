"""Slice publishers of many simulated nodes in worker processes (used by ``bench_scale.py``).

Each real node runs its own agent; hosting hundreds of publishers in the benchmark's own
process would measure that one Python process instead of the API server. The nodes are
spread over as many worker processes as the machine has cores; each worker runs the agent's
``SliceController`` for its nodes until it is terminated, and the CPU time each worker used
for publishing (after its start-up) is read from ``/proc`` when everything is published.

Worker: ``python bench/publishers.py KUBECONFIG DRIVER LAYOUT NODE...``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from contenders import cpu_seconds  # noqa: E402


class Publishers:
    """Worker processes publishing the pools of ``nodes`` of one layout."""

    def __init__(
        self, kubeconfig: str, driver: str, layout: str, nodes: Sequence[str], workers: int
    ) -> None:
        workers = max(1, min(workers, len(nodes)))
        shares = [list(nodes[i::workers]) for i in range(workers)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(HERE / "publishers.py"), kubeconfig, driver, layout, *share],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for share in shares
        ]
        for proc in self.procs:  # imported, pools built, client made: only publishing is left
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                self.stop()
                raise RuntimeError("a publisher worker failed to start")
        self.started = self.cpu_seconds()

    def go(self) -> None:
        """Start publishing (all workers at once)."""
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the workers used so far."""
        return sum(cpu_seconds(proc.pid) for proc in self.procs)

    def stop(self) -> dict[str, int]:
        """Terminate the workers; the requests, writes and written bytes they sent."""
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        totals: dict[str, int] = {}
        for proc in self.procs:
            try:
                out, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            for line in out.splitlines():
                if line.startswith("{"):
                    for key, value in json.loads(line).items():
                        totals[key] = totals.get(key, 0) + int(value)
        return totals


async def _serve(kubeconfig: str, driver: str, layout: str, nodes: Sequence[str]) -> None:
    from bench_scale import LAYOUTS

    from dra_driver.kube import KubeClient, Response
    from dra_driver.resourceslice.controller import SliceController

    sent = {"requests": 0, "writes": 0, "writeBytes": 0}

    class Counting(KubeClient):
        """Counts what the publishers send: requests, writes and the bytes of the bodies as
        the client encoded them (taken from the request, not encoded a second time: that
        would add its CPU to the publishers')."""

        async def request(self, method: str, path: str, **kw: Any) -> Response:
            sent["requests"] += 1
            if method != "GET":
                sent["writes"] += 1
            return await super().request(method, path, **kw)

        async def _kwargs(self, *args: Any) -> dict[str, Any]:
            kwargs = await super()._kwargs(*args)
            sent["writeBytes"] += len(kwargs["data"] or b"")
            return kwargs

    pools = [LAYOUTS[layout](driver, node) for node in nodes]
    client = await Counting.create(kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    controllers = [SliceController(client, driver=driver, node_name=n) for n in nodes]
    tasks = [asyncio.create_task(c.run()) for c in controllers]
    try:
        for controller, pool in zip(controllers, pools, strict=True):
            await controller.set_pool(pool)
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        print(json.dumps(sent), flush=True)


def main(argv: Sequence[str]) -> int:
    from dra_driver import logs

    logs.configure("json", "warning")
    kubeconfig, driver, layout, *nodes = argv
    asyncio.run(_serve(kubeconfig, driver, layout, nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
