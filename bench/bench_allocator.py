"""Benchmark: what one node's slice layout costs the scheduler's allocator, per pod.

For every pod the kube-scheduler's DRA plugin builds one allocator (PreFilter) and calls it
once per candidate node (Filter); each call converts every slice of that node and walks its
devices. This runs that allocator (``testenv/cmd/allocbench``, the scheduler's own package)
over one node of each layout of ``bench_scale.py`` in the states a filling cluster passes
through (no device taken, half, all), for whole-GPU and 1g.10gb claims, and prints the time
one Filter call takes. A pod's cost on an N-node cluster is about N such calls.

Run: ``.venv/bin/python bench/bench_allocator.py [--layouts ...] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver.resourceslice.pool import DesiredPool, SliceContent, render_pool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import LAYOUTS, catalog_pool, workloads

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / ".cache" / "bench" / "allocbench"
DRIVER = "alloc.scale.dev"
NODE = "node-0"
ITERATIONS = 300

JSON = dict[str, Any]


def lean_pool(driver: str, node: str) -> DesiredPool:
    """Candidate: the dynamic layout with placements stripped to type, profile and parent,
    consuming only their memory slices (what per-device size alone is worth)."""
    pool = catalog_pool(True)(driver, node)
    slices = []
    for content in pool.slices:
        devices = []
        for d in content.devices:
            if d["attributes"]["type"]["string"] == "mig":
                attrs = {k: d["attributes"][k] for k in ("type", "profile", "parentUUID")}
                used = d["consumesCounters"][0]
                mem = {k: v for k, v in used["counters"].items() if k.startswith("memory-slice")}
                d = {
                    "name": d["name"],
                    "attributes": attrs,
                    "consumesCounters": [{"counterSet": used["counterSet"], "counters": mem}],
                }
            devices.append(d)
        slices.append(SliceContent(devices=tuple(devices), shared_counters=content.shared_counters))
    return DesiredPool(driver, node, node, tuple(slices))


#: Layouts measured here only, for what they show about the allocator's costs.
CANDIDATES = {"dynamic-lean": lean_pool}


def build_binary() -> Path:
    """Build the allocator harness against testenv's newest Kubernetes modules."""
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["go", "build", "-o", str(BINARY), "./cmd/allocbench"], cwd=ROOT / "testenv", check=True
    )
    return BINARY


def _attr(device: JSON, name: str) -> str | None:
    value = device.get("attributes", {}).get(name)
    return None if value is None else str(next(iter(value.values())))


def _gpu_of(device: JSON) -> str:
    """The whole GPU a device belongs to (placements name their counter set)."""
    consumes = device.get("consumesCounters") or []
    if consumes:
        return str(consumes[0]["counterSet"])
    return str(device["name"])


def _claim(name: str, device_class: str, capacity: JSON | None = None) -> JSON:
    exactly: JSON = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
    }


def _class(name: str, selector: str) -> JSON:
    cel = f'device.driver == "{DRIVER}"' + (f" && {selector}" if selector else "")
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": cel}}]}}


def _ids(names: Sequence[str]) -> list[str]:
    return [f"{DRIVER}/{NODE}/{n}" for n in names]


def _fill(name: str, claim: JSON, taken: Sequence[Any], key: str) -> list[JSON]:
    """The claim on an empty node, a half-taken one and a full one."""
    return [
        {"name": f"{name}-{state}", "node": NODE, "claim": claim, key: list(taken[:count])}
        for state, count in (("empty", 0), ("half", len(taken) // 2), ("full", len(taken)))
    ]


def _capacity_cases(pool: DesiredPool) -> tuple[list[JSON], list[JSON]]:
    attrs = f'device.attributes["{DRIVER}"]'
    whole = {"computeSlices": "7", "memorySlices": "8"}  # an H100's
    small = {"computeSlices": "1", "memorySlices": "1"}
    gpus = _ids([d["name"] for s in pool.slices for d in s.devices])
    whole_shares = [{"device": g, "capacity": whole} for g in gpus]
    small_shares = [{"device": g, "capacity": small} for g in gpus for _ in range(7)]
    classes = [_class("gpu", f'{attrs}.type == "gpu"'), _class("mig", f'{attrs}.type == "gpu"')]
    out = _fill("gpu", _claim("gpu", "gpu"), whole_shares, "shared")
    out += _fill("mig", _claim("mig", "mig", small), small_shares, "shared")
    return classes, out


def _device_cases(layout: str, pool: DesiredPool) -> tuple[list[JSON], list[JSON]]:
    devices = [d for s in pool.slices for d in s.devices]
    kinds = {d["name"]: _attr(d, "type") for d in devices}
    whole = [d["name"] for d in devices if kinds[d["name"]] in ("gpu", None)]
    per_gpu: dict[str, list[str]] = {}
    for d in devices:
        if _attr(d, "profile") == "1g.10gb":
            per_gpu.setdefault(_gpu_of(d), []).append(d["name"])
    # A 1g.10gb workload fills GPU after GPU with the 7 placements that fit together.
    small = [name for names in per_gpu.values() for name in names]
    kind = "dynamic" if layout == "dynamic-lean" else layout
    classes, out = [], []
    for workload in workloads(kind, DRIVER, 1):
        classes.append(_class(workload.name, workload.selector))
        taken = whole if workload.name == "gpu" else small
        claim = _claim(workload.name, workload.device_class)
        out += _fill(workload.name, claim, _ids(taken), "allocated")
    return classes, out


def cases(layout: str) -> JSON:
    """The allocator input for one node of ``layout``."""
    pool = {**LAYOUTS, **CANDIDATES}[layout](DRIVER, NODE)
    if layout == "dynamic-capacity":
        classes, out = _capacity_cases(pool)
    else:
        classes, out = _device_cases(layout, pool)
    slices = render_pool(pool)
    return {"classes": classes, "slices": slices, "iterations": ITERATIONS, "cases": out}


def measure(binary: Path, layout: str) -> list[JSON]:
    """One row per case: microseconds per Filter call and devices found."""
    data = cases(layout)
    proc = subprocess.run(
        [str(binary)], input=json.dumps(data), capture_output=True, text=True, check=True
    )
    devices = sum(len(s["spec"].get("devices") or []) for s in data["slices"])
    rows = []
    for line in proc.stdout.splitlines():
        row = json.loads(line)
        rows.append(
            {
                "layout": layout,
                "devices": devices,
                "slices": len(data["slices"]),
                "case": row["name"],
                "us_per_node": round(row["ns"] / 1000, 1),
                "found": row["devices"],
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layouts", nargs="+", choices=[*LAYOUTS, *CANDIDATES], default=[*LAYOUTS, *CANDIDATES]
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    binary = build_binary()
    rows = [row for layout in args.layouts for row in measure(binary, layout)]
    for row in rows:
        print(
            f"{row['layout']:<12} {row['devices']:>4} devices {row['slices']:>2} slices  "
            f"{row['case']:<10} {row['us_per_node']:>8} us/node  found {row['found']}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
