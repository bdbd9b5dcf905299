"""Where the agent's CPU goes while it prepares: a py-spy sampling profile, summarised.

``Sampler`` attaches py-spy to a running process and records collapsed stacks (one line per
distinct stack: ``frame;frame;... count``); ``summarize`` turns them into the share of samples
in each area of the code (a sample counts for an area when any frame of its stack is there)
and the functions that were on top of the stack most often.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

#: Areas of a prepare/unprepare cycle, by a fragment of their frames, which py-spy writes as
#: "function (path/file.py:line)" with paths relative to their import root.
#: A sample may count for several (a JSON parse inside the claim read counts for both).
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gRPC servicer (request to response)", ("dra_servicer.py",)),
    ("claim read from the API server", ("get_claim (",)),
    ("HTTP client (aiohttp)", ("(aiohttp/",)),
    ("JSON encode/decode", ("(json/",)),
    ("driver transaction (device_state.py)", ("device_state.py",)),
    ("CDI spec write", ("/cdi/",)),
    ("checkpoint and journal", ("checkpoint.py", "journal.py")),
    ("claim status report", ("claimreport.py",)),
    ("file system calls (pathlib, os)", ("(pathlib.py", "(os.py", "(shutil.py")),
    ("structured logs", ("(structlog/", "logs.py")),
    ("metrics", ("(prometheus_client/", "metrics.py")),
    ("asyncio event loop", ("(asyncio/",)),
)


class Sampler:
    """py-spy recording ``pid`` (whichever thread holds the GIL) until :meth:`stop`."""

    def __init__(self, pid: int, out: Path, rate: int = 250) -> None:
        self.out = out
        py_spy = Path(sys.executable).parent / "py-spy"
        argv = [
            str(py_spy),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--gil",
            "--nonblocking",
        ]
        self._proc = subprocess.Popen(
            [*argv, "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attaching takes a moment

    def stop(self) -> dict[str, Any]:
        """Stop recording; the summary of what was sampled."""
        self._proc.send_signal(signal.SIGINT)
        self._proc.wait(timeout=60)
        return summarize(self.out.read_text())


def summarize(collapsed: str, top: int = 12) -> dict[str, Any]:
    """Samples, each area's share of them, and the ``top`` functions by own samples."""
    total = 0
    areas: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for area, fragments in AREAS:
            if any(f in frame for frame in frames for f in fragments):
                areas[area] += count
    if not total:
        return {"samples": 0, "areas": {}, "top": []}
    return {
        "samples": total,
        "areas": {a: round(100 * areas[a] / total, 1) for a, _ in AREAS},
        "top": [[frame, round(100 * n / total, 1)] for frame, n in own.most_common(top)],
    }
