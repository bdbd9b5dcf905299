"""The node agent against itself at another commit: what one change is worth.

A quick run of ``bench_node.py`` cannot show a change of 10-20% on a shared virtual machine:
the same agent measured twice a minute apart differs by that much. Here the agent of the work
tree and the agent of ``--base`` (checked out in a temporary worktree) serve the same
simulated node of one control plane under different driver names, and the benchmark's client
alternates between them every ``--cycles`` prepare+unprepare cycles, so both see the same
load. Reported per concurrency: the median over rounds of each one's CPU per cycle, prepare
and unprepare p50 and claims/s, the p99s of all rounds' samples pooled, and the ratio work
tree / base of each round's CPU.

Run: ``.venv/bin/python bench/compare_node.py --base HEAD~1 [--rounds 12] [--concurrency 1 16
64] [--cycles 192]``. Numbers, not pass/fail; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from bench_node import GPUS, NAMESPACE, Api, many_gpus_profile, pct, prepare_cycles, start_all
from contenders import (
    PYTHON_ENV,
    REPO,
    Contender,
    compile_sources,
    cpu_seconds,
    exit_on_sigterm,
)

from devenv.localcluster import LocalCluster, NodeHandle
from devenv.simnode import driver_argv

#: Driver names of the two agents (each publishes its own pool of the node).
DRIVERS = {"base": "gpu.dra.dev", "work": "gpu-work.dra.dev"}


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """``rev`` checked out in a temporary git worktree, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="compare-node-") as tmp:
        path = Path(tmp) / "tree"
        git = ["git", "-C", str(REPO)]
        subprocess.run([*git, "worktree", "add", "--detach", "-q", str(path), rev], check=True)
        try:
            yield path
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(path)], check=False)


def agent(
    cluster: LocalCluster, node: NodeHandle, profile: Path, label: str, tree: Path
) -> Contender:
    """The agent whose code is ``tree``'s, under its own driver name."""
    argv = driver_argv(cluster, node, str(profile), DRIVERS[label])
    # The tree's package first on the path, whatever the virtualenv installed.
    run = (
        f"import sys, runpy; sys.path.insert(0, {str(tree)!r}); "
        "runpy.run_module('dra_driver.cli', run_name='__main__', alter_sys=True)"
    )
    argv[1:3] = ["-c", run]
    return Contender(label, DRIVERS[label], node, argv, dict(PYTHON_ENV))


Rounds = dict[int, dict[str, list[dict[str, Any]]]]


def measure(args: argparse.Namespace, base_tree: Path) -> Rounds:
    """Per concurrency and agent: each round's CPU ms per cycle, claims/s and latencies."""
    rounds: Rounds = {}
    work = Path(tempfile.mkdtemp(prefix="compare-node-"))
    profile = work / "gpus.yaml"
    profile.write_text(yaml.safe_dump(many_gpus_profile(GPUS)))
    with LocalCluster(verbosity=1) as cluster:
        api = Api(cluster)
        api.core.create_namespace({"metadata": {"name": NAMESPACE}})
        node = cluster.add_node("bench-gpus")
        agents = [
            agent(cluster, node, profile, "base", base_tree),
            agent(cluster, node, profile, "work", REPO),
        ]
        start_all(cluster, api, agents)
        devices = [f"gpu-{i}" for i in range(max(args.concurrency))]
        claims = {a.label: api.create_claims(node.name, a.driver, devices) for a in agents}
        for a in agents:  # warm up: first claim reads, connections, imports
            asyncio.run(prepare_cycles(a.dra_socket, claims[a.label], 1, 50))
        for r in range(args.rounds):
            for concurrency in args.concurrency:
                for a in agents if r % 2 == 0 else agents[::-1]:
                    before = cpu_seconds(a.pid)
                    out = asyncio.run(
                        prepare_cycles(a.dra_socket, claims[a.label], concurrency, args.cycles)
                    )
                    done = len(out["prepare"])
                    out["cpu_ms"] = (cpu_seconds(a.pid) - before) * 1000 / done
                    out["rate"] = done / out["seconds"]
                    rounds.setdefault(concurrency, {}).setdefault(a.label, []).append(out)
    return rounds


def report(rounds: Rounds) -> list[str]:
    """One line per concurrency and agent, and the per-round CPU ratios."""
    lines = []
    for concurrency, by_agent in rounds.items():
        for label in ("base", "work"):
            runs = by_agent[label]
            cpu, rate = (statistics.median(r[key] for r in runs) for key in ("cpu_ms", "rate"))
            prep, unprep = (
                statistics.median(statistics.median(r[key]) for r in runs) * 1000
                for key in ("prepare", "unprepare")
            )
            prep99, unprep99 = (
                pct([x for r in runs for x in r[key]], 99) * 1000
                for key in ("prepare", "unprepare")
            )
            lines.append(
                f"concurrency {concurrency:>2} {label}: CPU {cpu:.2f} ms/cycle, prepare p50 "
                f"{prep:.2f} p99 {prep99:.2f} ms, unprepare p50 {unprep:.2f} p99 "
                f"{unprep99:.2f} ms, {rate:.1f} claims/s"
            )
        ratios = [
            w["cpu_ms"] / b["cpu_ms"]
            for b, w in zip(by_agent["base"], by_agent["work"], strict=True)
        ]
        shown = ", ".join(f"{x:.2f}" for x in ratios)
        lines.append(
            f"   work / base CPU per round: median {statistics.median(ratios):.2f} ({shown})"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare the work tree with")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--cycles", type=int, default=192, help="cycles per agent and round")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    with worktree(args.base) as base_tree:
        for tree in (REPO, base_tree):
            compile_sources(tree)
        results = measure(args, base_tree)
    print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
