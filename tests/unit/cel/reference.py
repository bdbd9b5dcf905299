"""The scheduler's own CEL, as a subprocess: ``testenv/cmd/celref`` (built by ``make celref``).

One process serves a whole test session; each request is a batch of selectors and devices, so a
few thousand verdicts cost one round trip.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devenv.localcluster.releases import parse_versions, release_cache, versions_file

ROOT = Path(__file__).resolve().parents[3]
# The engine follows the newest release's scheduler, whichever release the tests run on.
NEWEST = parse_versions(versions_file(ROOT).read_text())[-1]
BINARY = Path(os.environ.get("DRA_CELREF_BIN") or release_cache(ROOT, NEWEST) / "bin" / "celref")
MISSING = f"the reference CEL binary {BINARY} is absent: build it with `make celref`"


@dataclass(frozen=True)
class Verdict:
    """``true``, ``false`` or ``error`` for one (selector, device) pair; ``compile`` when the
    selector does not compile."""

    verdict: str
    message: str = ""


@dataclass(frozen=True)
class TestDevice:
    """A ResourceSlice ``devices[]`` entry and the driver that publishes it."""

    driver: str
    device: dict[str, Any]


class Reference:
    """A running ``celref``; :meth:`run` evaluates selectors over devices as the scheduler does."""

    def __init__(self, binary: Path = BINARY, *flags: str) -> None:
        """``flags``: celref's, e.g. ``--list-type-attributes`` for the scheduler with that gate."""
        self.process = subprocess.Popen(
            [str(binary), *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )

    def run(self, selectors: list[str], devices: list[TestDevice]) -> list[list[Verdict]]:
        """``[selector][device]`` verdicts."""
        assert self.process.stdin is not None and self.process.stdout is not None
        request = {
            "selectors": selectors,
            "devices": [{"driver": d.driver, "device": d.device} for d in devices],
        }
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        response = json.loads(self.process.stdout.readline())
        if response.get("error"):
            raise RuntimeError(response["error"])
        out = []
        for result in response["selectors"]:
            if not result["compiled"]:
                out.append([Verdict("compile", result["error"])] * len(devices))
            else:
                out.append([Verdict(r["verdict"], r.get("error", "")) for r in result["results"]])
        return out

    def close(self) -> None:
        """Stop the process."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=10)
