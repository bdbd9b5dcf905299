"""What each dependency adds to a Python kubelet plugin's memory before it does anything.

Each line is a fresh interpreter that imports what ``bench/floor_plugin.py`` imports (asyncio,
gRPC, aiohttp, the protos), then the modules named on that line, and prints its PSS
(``/proc/self/smaps_rollup``) and the difference to the floor's imports alone. The agent's idle
PSS against the floor's in ``bench_node.py`` is the sum of these and the agent's own state.

The interpreters run with the environment of the driver's image (``PYTHONOPTIMIZE=2``).
``bench_node.py`` records these lines with its results (``make bench``); alone:
``.venv/bin/python bench/import_pss.py``. Numbers, not pass/fail.
"""

from __future__ import annotations

import os
import subprocess
import sys

from contenders import PYTHON_ENV

#: Module sets measured over the floor's imports; "pydantic model" builds one small model, which
#: loads the schema machinery every pydantic model needs (the settings and the checkpoint).
SETS = (
    (),
    ("pydantic",),
    ("pydantic", "pydantic model"),
    ("dra_driver.settings",),
    ("dra_driver.settings", "dra_driver.gpu.state.checkpoint"),
    ("structlog",),
    ("prometheus_client",),
    ("yaml",),
    ("dra_driver.launch", "dra_driver.agent"),
)

_CHILD = """
import importlib, sys
import asyncio, grpc, aiohttp
from dra_driver._proto.dra.v1 import api_pb2, api_pb2_grpc
from dra_driver._proto.pluginregistration import api_pb2 as _r, api_pb2_grpc as _rg

def pss_kib():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))

for name in sys.argv[1:]:
    if name == "pydantic model":
        from pydantic import BaseModel

        class Small(BaseModel):
            a: int = 1
    else:
        importlib.import_module(name)
print(pss_kib())
"""


#: What a line is called when it adds nothing to the floor's imports.
FLOOR_LABEL = "the floor's imports"


def pss_kib(modules: tuple[str, ...]) -> int:
    """PSS of a fresh interpreter with the floor's imports and ``modules``."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, *modules],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **PYTHON_ENV},
    )
    return int(out.stdout.split()[-1])


def measure(runs: int = 3) -> dict[str, int]:
    """Each set's label (its modules joined by " + ") and its median PSS in KiB."""
    return {
        " + ".join(s) or FLOOR_LABEL: sorted(pss_kib(s) for _ in range(runs))[runs // 2]
        for s in SETS
    }


def main() -> None:
    runs = 3
    results = measure(runs)
    floor = results[FLOOR_LABEL]
    print(f"{'imports over the floor':58s} {'PSS':>9s} {'added':>9s}  (median of {runs})")
    for label, kib in results.items():
        print(f"{label:58s} {kib / 1024:7.1f} Mi {(kib - floor) / 1024:+7.1f} Mi")


if __name__ == "__main__":
    main()
