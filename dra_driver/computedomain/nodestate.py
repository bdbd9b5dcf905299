"""The IMEX claims prepared on this node, and those joining it to their domain, kept across
restarts.

One small checkpoint file (written atomically) says which claim holds which device for which
domain: unprepare needs it to know when the last claim of a domain leaves the node (and the
node leaves the domain), and a restarted plugin needs it to refuse a second claim for a
device that is taken. The CDI specs themselves are named by claim UID, so removing one never
needs the checkpoint.

A second file names the channel claims that joined the node to their domain and are not
prepared yet (waiting for binding, or for the daemon in prepare): a restarted plugin must
still know that the node's label is theirs, so that the node leaves the domain when they are
deallocated. It is a file of its own so that an older plugin, which does not know it, still
reads the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, TypeVar

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.cdi.writer import write_atomic

CHECKPOINT = "imex-claims.json"
JOINING = "imex-joining.json"

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


class JoiningClaim(BaseModel):
    """A channel claim that joined the node to its domain and is not prepared yet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str
    name: str
    domain: str
    devices: list[str]


class Joining(BaseModel):
    """The whole joining file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    claims: dict[str, JoiningClaim] = Field(default_factory=dict)


_File = TypeVar("_File", Checkpoint, Joining)


def load(path: Path, model: type[_File]) -> _File:
    """The file's content, or an empty one when there is none. An unreadable file is moved
    aside (kept for inspection) and the plugin starts empty: its specs stay in place, and
    the kubelet's next prepare of each claim records it again."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return model()
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        aside = path.with_name(path.name + ".corrupt")
        path.replace(aside)
        log.error("imex checkpoint unreadable, moved aside", path=str(aside), error=str(exc))
        return model()


def save(path: Path, content: Checkpoint | Joining) -> None:
    """Write the file durably (temp file, fsync, rename)."""
    write_atomic(path, content.model_dump(mode="json"))
