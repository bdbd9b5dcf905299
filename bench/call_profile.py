"""What a kubelet plugin's main thread calls per claim, by component: counted, not sampled.

A sampling profile (``cpu_profile.py``) shows where time goes in bulk, but a cost spread
thinly over many small steps hides in its noise. This counts instead: run as a launcher,

    python bench/call_profile.py OUT -m dra_driver.cli run ...    (or OUT script.py ...)

it runs the program with a deterministic profile (``cProfile`` on the thread's own CPU
clock) that SIGUSR1 switches on and SIGUSR2 switches off and writes to ``OUT``;
:func:`summarize` then sorts every function's calls and own time into components. The calls
repeat from run to run to within a few (background work lands in some cycles; a coroutine's
every resumption counts as one call); the profiled time is inflated by the profiler's own
cost per call, so it compares components and contenders, not absolute figures. Only the main
thread is profiled: the agents run a lone claim's work on their event loop.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import runpy
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

#: Components of a prepare/unprepare cycle, by a fragment of a function's file; the first
#: that matches wins. A C function (``~``) counts for the component of its caller.
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("event loop (asyncio, selectors)", ("/asyncio/", "/selectors.py", "/contextvars.py")),
    (
        "API client (HTTP, TLS)",
        ("dra_driver/kube.py", "/aiohttp/", "/yarl/", "/multidict/", "/ssl.py", "/http/"),
    ),
    ("JSON", ("/json/",)),
    ("logs", ("/structlog/", "dra_driver/logs.py", "/logging/")),
    ("metrics", ("/prometheus_client/", "dra_driver/metrics.py")),
    ("claim status report", ("dra_driver/claimreport.py",)),
    ("checkpoint and journal", ("gpu/state/checkpoint.py", "gpu/state/journal.py")),
    ("CDI spec", ("dra_driver/cdi/", "gpu/container/")),
    ("file system (pathlib, os, shutil)", ("/pathlib.py", "/os.py", "/shutil.py")),
    ("driver transaction (claim plan, devices, sharing)", ("dra_driver/gpu/",)),
    ("kubelet plugin (servicer, node service, claim checks)", ("kubeletplugin/", "floor_plugin")),
)
OTHER = "other"

_Key = tuple[str, int, str]


def component(filename: str) -> str:
    """The component of a function defined in ``filename``."""
    for name, fragments in COMPONENTS:
        if any(f in filename for f in fragments):
            return name
    return OTHER


def summarize(path: Path, cycles: int) -> dict[str, Any]:
    """Calls and profiled milliseconds per cycle, in all and by component."""
    stats: dict[_Key, Any] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    calls: dict[str, float] = defaultdict(float)
    own: dict[str, float] = defaultdict(float)
    for (filename, _, _), (_, ncalls, tottime, _, callers) in stats.items():
        if filename != "~":
            name = component(filename)
            calls[name] += ncalls
            own[name] += tottime
            continue
        for (caller_file, _, _), (_, n, t, _) in callers.items():
            calls[component(caller_file)] += n
            own[component(caller_file)] += t
    names = [name for name, _ in COMPONENTS] + [OTHER]
    return {
        "cycles": cycles,
        "calls": round(sum(calls.values()) / cycles, 1),
        "profiled_ms": round(sum(own.values()) * 1000 / cycles, 3),
        "components": {
            n: [round(calls[n] / cycles, 1), round(own[n] * 1000 / cycles, 3)] for n in names
        },
    }


def launch(out: str, target: list[str]) -> None:
    """Run ``target`` (``-m module args`` or ``script args``) as ``python target`` would,
    profiled between a SIGUSR1 and the SIGUSR2 that writes ``out``."""
    profile = cProfile.Profile(time.thread_time)

    def dump(*_: object) -> None:
        profile.disable()
        profile.dump_stats(f"{out}.tmp")
        os.replace(f"{out}.tmp", out)  # whole, for whoever waits for it to appear

    signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
    signal.signal(signal.SIGUSR2, dump)
    if target[0] == "-m":
        sys.argv = target[1:]
        sys.path[0] = os.getcwd()
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = target
        sys.path[0] = os.path.dirname(os.path.abspath(target[0]))
        runpy.run_path(target[0], run_name="__main__")


if __name__ == "__main__":
    launch(sys.argv[1], sys.argv[2:])
