"""Benchmark: 5 representative DRA selectors over a 10,000-device inventory.

Run: ``.venv/bin/python bench/bench_cel.py [--devices N] [--baseline N]``. Prints the time to
convert devices to CEL values, evaluations per second, the total for ``match`` (verdict and
explanation of every non-match) over N devices x 5 selectors, and, for comparison, cel-python's
own interpreter on a sample.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

from dra_driver.cel import (
    Selector,
    compile_selector,
    device_variables,
    evaluate,
    match_devices,
    prepare,
)
from dra_driver.cel.match import Device
from dra_driver.gpu.discovery.simulated import BUILTIN_PROFILES, SimulatedDiscovery
from dra_driver.gpu.publish.catalog import build_catalog

DRIVER = "gpu.dra.dev"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'

SELECTORS = [
    f'{C}.memory.compareTo(quantity("40Gi")) >= 0',
    f'{A}.productName.matches("^NVIDIA (H100|A100)")',
    f'{A}.architecture == "Hopper"',
    f'{A}.cudaComputeCapability.compareTo(semver("8.0.0")) >= 0',
    f"has({A}.migEnabled) && !{A}.migEnabled && {A}.numaNode == 0",
]


def inventory(count: int) -> list[Device]:
    """``count`` devices: the built-in profiles' devices, repeated over as many nodes as needed."""
    templates = [
        (profile, d)
        for profile in BUILTIN_PROFILES
        for d in build_catalog(SimulatedDiscovery(profile, "node").discover()).published()
    ]
    devices = []
    for i in range(count):
        profile, data = templates[i % len(templates)]
        node = f"{profile}-{i // len(templates)}"
        devices.append(Device(DRIVER, node, str(data["name"]), data, node))
    return devices


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def celpy_baseline(devices: list[Device], samples: int) -> float:
    """Seconds per evaluation with cel-python's interpreter (same selectors where it can)."""
    import celpy
    from celpy import celtypes

    env = celpy.Environment()
    # cel-python has no quantity/semver member calls: time the plain-attribute selectors.
    programs = [env.program(env.compile(s)) for s in (SELECTORS[2],)]

    def to_cel(device: Device) -> Any:
        attrs = {
            celtypes.StringType(k): celtypes.StringType(v["string"])
            for k, v in device.data["attributes"].items()
            if "string" in v
        }
        domain = celtypes.MapType({celtypes.StringType(DRIVER): celtypes.MapType(attrs)})
        return celtypes.MapType({celtypes.StringType("attributes"): domain})

    activations = [{"device": to_cel(d)} for d in devices[:samples]]
    start = time.perf_counter()
    for activation in activations:
        for program in programs:
            program.evaluate(activation)
    return (time.perf_counter() - start) / (len(activations) * len(programs))


def main() -> None:
    """Run the benchmark and print the results."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=300, help="cel-python samples (0: skip)")
    args = parser.parse_args()

    print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, Python {platform.python_version()}")
    devices = inventory(args.devices)

    start = time.perf_counter()
    programs = [compile_selector(s) for s in SELECTORS]
    compile_time = time.perf_counter() - start

    start = time.perf_counter()
    variables = [device_variables(d.data, DRIVER) for d in devices]
    convert_time = time.perf_counter() - start

    start = time.perf_counter()
    matches = [0] * len(programs)
    for v in variables:
        for i, program in enumerate(programs):
            matches[i] += evaluate(program, v).verdict.value == "match"
    eval_time = time.perf_counter() - start
    evaluations = len(devices) * len(programs)

    # What `dra-driver match` does: convert each device once, then one pass per selector,
    # explaining every non-match.
    start = time.perf_counter()
    prepared = prepare(devices)
    for i, expression in enumerate(SELECTORS):
        match_devices(devices, [Selector(f"s{i}", expression)], prepared=prepared)
    match_time = time.perf_counter() - start

    print(f"devices: {len(devices)}, selectors: {len(SELECTORS)}")
    print(f"compile 5 selectors (cold): {compile_time * 1000:.1f} ms")
    print(f"convert devices to CEL values (once): {convert_time * 1000:.0f} ms")
    print(
        f"evaluate {evaluations} (verdict only): {eval_time * 1000:.0f} ms = "
        f"{evaluations / eval_time:,.0f} evaluations/s"
    )
    print(
        f"match {len(devices)} devices x {len(SELECTORS)} selectors "
        f"(conversion + verdicts + explanations of every non-match): {match_time:.2f} s"
    )
    for expression, count in zip(SELECTORS, matches, strict=True):
        print(f"  {count:>6} match  {expression}")
    if args.baseline:
        per_eval = celpy_baseline(devices, args.baseline)
        print(
            f'cel-python 0.5 interpreter, {A}.architecture == "Hopper": '
            f"{per_eval * 1e6:.0f} us/evaluation = {1 / per_eval:,.0f} evaluations/s"
        )


if __name__ == "__main__":
    main()
