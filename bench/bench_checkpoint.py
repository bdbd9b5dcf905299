"""Benchmark: ways to record a claim's prepare and unprepare durably, on this machine's disk.

Each option records one plain 1-GPU claim through one prepare (started, then completed) and
one unprepare, with ``prepared`` other claims already recorded, and is timed over many
cycles (median and p99 per cycle, fsyncs per cycle):

* ``rewrite``: the whole checkpoint rewritten through a temp file and a rename, file and
  directory fsync'd, three times per cycle (what the agent did);
* ``journal``: the changed record appended to a journal, one ``fdatasync`` per write, three
  times per cycle;
* ``journal-2``: as ``journal`` without the PrepareStarted line (only claims with side effects
  to undo need it).

Run: ``.venv/bin/python bench/bench_checkpoint.py [--cycles N] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver.gpu.state import checkpoint
from dra_driver.gpu.state.checkpoint import CheckpointData, ClaimRecord, ClaimState, DeviceRecord
from dra_driver.gpu.state.journal import Change, Journal


def _record(i: int, state: ClaimState) -> ClaimRecord:
    return ClaimRecord(
        state=state,
        namespace="bench",
        name=f"claim-{i}",
        devices=[
            DeviceRecord(
                request_names=["gpu"],
                pool_name="node",
                device_name=f"gpu-{i}",
                cdi_device_ids=[f"k8s.gpu.dra.dev/claim=uid-{i}-gpu-{i}"],
                uuid=f"GPU-{i:08d}",
            )
        ],
    )


def _stored(record: ClaimRecord) -> dict[str, Any]:
    return record.model_dump(mode="json", by_alias=True, exclude_none=True)


def _data(prepared: int) -> CheckpointData:
    data = CheckpointData(boot_id="boot")
    for i in range(prepared):
        data.claims[f"uid-{i}"] = _record(i, ClaimState.PREPARE_COMPLETED)
    return data


Cycle = Callable[[], int]  # one prepare+unprepare; returns its fsyncs


def rewrite(directory: Path, prepared: int) -> Cycle:
    path = directory / "checkpoint.json"
    data = _data(prepared)

    def cycle() -> int:
        data.claims["new"] = _record(999, ClaimState.PREPARE_STARTED)
        checkpoint.save(path, data)
        data.claims["new"].state = ClaimState.PREPARE_COMPLETED
        checkpoint.save(path, data)
        del data.claims["new"]
        checkpoint.save(path, data)
        return 6

    return cycle


def journal(directory: Path, started: bool) -> Cycle:
    j = Journal(directory / "checkpoint.journal")

    def cycle() -> int:
        if started:
            j.append([Change("new", _stored(_record(999, ClaimState.PREPARE_STARTED)))])
        j.append([Change("new", _stored(_record(999, ClaimState.PREPARE_COMPLETED)))])
        j.append([Change("new", None)])
        if j.full:
            j.reset()
        return 3 if started else 2

    return cycle


def measure(cycle: Cycle, cycles: int) -> dict[str, float]:
    times = []
    fsyncs = 0
    for _ in range(cycles):
        t = time.perf_counter()
        fsyncs += cycle()
        times.append(time.perf_counter() - t)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times) * 1000, 2),
        "p99_ms": round(times[int(len(times) * 0.99) - 1] * 1000, 2),
        "fsyncs": fsyncs / cycles,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--dir", type=Path, default=None, help="on the disk to measure")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    options: dict[str, Callable[[Path], Cycle]] = {
        "rewrite, 1 claim prepared": lambda d: rewrite(d, 0),
        "rewrite, 64 claims prepared": lambda d: rewrite(d, 64),
        "journal": lambda d: journal(d, True),
        "journal-2": lambda d: journal(d, False),
    }
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| option | p50 per cycle | p99 per cycle | fsyncs per cycle |")
    print("|---|---|---|---|")
    # Interleaved rounds, so that every option sees the same load.
    results: dict[str, list[dict[str, float]]] = {name: [] for name in options}
    for _ in range(3):
        for name, make in options.items():
            d = base / name.replace(" ", "_").replace(",", "")
            d.mkdir(exist_ok=True)
            results[name].append(measure(make(d), args.cycles // 3))
    for name, runs in results.items():
        p50 = statistics.median(r["p50_ms"] for r in runs)
        p99 = max(r["p99_ms"] for r in runs)
        print(f"| {name} | {p50} ms | {p99} ms | {runs[0]['fsyncs']:g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
