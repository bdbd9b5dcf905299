"""The IMEX claims prepared on this node, kept across restarts.

One small checkpoint file (written atomically) says which claim holds which device for which
domain: unprepare needs it to know when the last claim of a domain leaves the node (and the
node leaves the domain), and a restarted plugin needs it to refuse a second claim for a
device that is taken. The CDI specs themselves are named by claim UID, so removing one never
needs the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.cdi.writer import write_atomic

CHECKPOINT = "imex-claims.json"

log = structlog.get_logger(__name__)


class PreparedClaim(BaseModel):
    """One prepared claim."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str
    name: str
    kind: Literal["channel", "daemon"]
    domain: str
    devices: list[str]
    requests: list[str]
    cdi_ids: list[str]


class Checkpoint(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    claims: dict[str, PreparedClaim] = Field(default_factory=dict)


def load(path: Path) -> Checkpoint:
    """The checkpoint, or an empty one when there is none. An unreadable file is moved
    aside (kept for inspection) and the plugin starts empty: its specs stay in place, and
    the kubelet's next prepare of each claim records it again."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Checkpoint()
    try:
        return Checkpoint.model_validate_json(text)
    except ValidationError as exc:
        aside = path.with_name(path.name + ".corrupt")
        path.replace(aside)
        log.error("imex checkpoint unreadable, moved aside", path=str(aside), error=str(exc))
        return Checkpoint()


def save(path: Path, checkpoint: Checkpoint) -> None:
    """Write the checkpoint durably (temp file, fsync, rename)."""
    write_atomic(path, checkpoint.model_dump(mode="json"))
