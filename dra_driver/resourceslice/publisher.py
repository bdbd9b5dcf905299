"""Which of two agents on one node publishes the pool during a rolling update.

A DaemonSet update with surge runs the old and the new agent pod side by side. When the update
changes what the agent publishes, the two would rewrite each other's slices, each backing off
from the other's conflicts, and the old agent's last write could outlive it. Instead every slice
records its publisher, and an agent that sees a slice of its pool written by a *newer* agent
stops writing: the newest pod on the node publishes.

"Newer" is the order in which pods first started on the node, kept in a small file on the
node's host path: a pod whose container restarts keeps its place, so a restarted old agent
does not take the pool back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_driver.cdi.writer import hold_file_lock, write_atomic

log = structlog.get_logger(__name__)

#: The file, in the driver's state directory, that orders the pods seen on the node.
PUBLISHERS_FILE = "publishers.json"
#: Pods remembered; older entries are forgotten (their pods are long gone).
_KEEP = 16


@dataclass(frozen=True, order=True)
class Publisher:
    """One agent instance: ``rank`` orders instances (higher is newer), ``id`` names it."""

    rank: int
    id: str

    def annotation(self) -> str:
        """The value stored in a slice's publisher annotation."""
        return f"{self.rank}/{self.id}"

    @classmethod
    def parse(cls, value: object) -> Publisher | None:
        """The publisher recorded by :meth:`annotation`; None for anything else."""
        if not isinstance(value, str):
            return None
        rank, _, ident = value.partition("/")
        if not rank.isdigit() or not ident:
            return None
        return cls(int(rank), ident)


def annotation_key(driver: str) -> str:
    """The annotation naming a slice's publisher (the driver name is a DNS subdomain)."""
    return f"{driver}/publisher"


def recorded_publisher(obj: Mapping[str, Any], driver: str) -> Publisher | None:
    """The publisher a stored slice names, if any."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return Publisher.parse(annotations.get(annotation_key(driver)))


def rank_pod(seen: Mapping[str, int], pod_uid: str, now_ns: int) -> tuple[int, dict[str, int]]:
    """The rank of ``pod_uid`` and the updated record of first starts (pure).

    A pod seen before keeps its rank; a new pod ranks after every pod seen so far (and at
    least at ``now_ns``, so a lost file still orders a new pod after the running ones).
    """
    if pod_uid in seen:
        return seen[pod_uid], dict(seen)
    rank = max([now_ns, *(r + 1 for r in seen.values())])
    kept = sorted(seen.items(), key=lambda item: item[1])[-(_KEEP - 1) :]
    return rank, {**dict(kept), pod_uid: rank}


def _read(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)}


def register_publisher(state_dir: Path, pod_uid: str | None) -> Publisher | None:
    """This agent's :class:`Publisher`, recorded on the node (blocking; under a file lock, and
    written atomically: a crash leaves the previous record).

    Without a pod UID (not run as a pod) there is only ever one agent: no publisher then.
    """
    if not pod_uid:
        return None
    path = state_dir / PUBLISHERS_FILE
    with hold_file_lock(path.with_suffix(".lock")):
        rank, seen = rank_pod(_read(path), pod_uid, time.time_ns())
        write_atomic(path, dict(sorted(seen.items())))
    log.info("publisher rank", pod_uid=pod_uid, rank=rank)
    return Publisher(rank, pod_uid)
