"""Named crash points for fault-injection tests; inert unless DRA_FAULT_POINTS names them.

``DRA_FAULT_POINTS=prepare.after-started`` makes the process exit at once (``os._exit``, no
cleanup, as a SIGKILL or power loss would) the first time it reaches that point;
``name@3`` exits on the third time. Several points are separated by commas.
"""

from __future__ import annotations

import os
import sys

ENV = "DRA_FAULT_POINTS"
EXIT_CODE = 86


def _parse(text: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = item.partition("@")
        points[name] = int(count) if count.isdigit() else 1
    return points


_armed = _parse(os.environ.get(ENV, ""))
_hits: dict[str, int] = {}


def point(name: str) -> None:
    """Crash here if this point is armed (and reached its count)."""
    if not _armed or name not in _armed:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= _armed[name]:
        sys.stderr.write(f"fault injection: exiting at {name}\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)


def arm(spec: str) -> None:
    """Arm points from a spec string (for tests running in this process)."""
    _armed.clear()
    _hits.clear()
    _armed.update(_parse(spec))
