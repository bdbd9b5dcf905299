"""The checkpoint's journal: every change of a claim's record since the last snapshot.

Rewriting the whole checkpoint through a temp file costs two fsyncs (the file, then its
directory for the rename) and grows with the number of prepared claims. Appending the changed
records to a file that already exists costs one ``fdatasync`` per batch, whatever the batch's
size. So the checkpoint file is a snapshot, written at start-up and when the journal has grown
(:data:`COMPACT_BYTES`), and this journal holds what happened since.

Each line is ``<checksum> <json>``: the JSON names a claim UID and its new record, or null when
the claim is gone. A batch is written with one ``write`` and made durable with one
``fdatasync`` before the caller goes on; a crash can therefore only cut the last batch, which
was never acknowledged. :func:`read` keeps its whole lines (each is one claim's complete
record of something already done on the node: a prepare started, a spec written, a claim
gone, all of which a repeated kubelet call finds again) and stops at the first line that
does not check out.
Replaying onto a snapshot taken after some of the lines gives the same state as onto the one
before them (each line sets one claim to its final value), so a crash between writing a
snapshot and emptying the journal loses nothing. The records are opaque JSON here;
:class:`.checkpoint.CheckpointFile` reads them into its models.
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dra_driver import faults
from dra_driver.cdi.writer import fsync_dir, write_all, write_error

log = structlog.get_logger(__name__)

#: Past this size the next batch also writes a snapshot and empties the journal.
COMPACT_BYTES = 1 << 20
_SUM_LEN = 16


@dataclass(frozen=True)
class Change:
    """A claim's new record as stored (JSON); ``None`` when the claim is gone."""

    uid: str
    record: dict[str, Any] | None


def _checksum(payload: bytes) -> bytes:
    return hashlib.sha256(payload).hexdigest()[:_SUM_LEN].encode()


def encode(changes: Sequence[Change]) -> bytes:
    """The journal lines of ``changes``."""
    lines = []
    for change in changes:
        payload = json.dumps({"uid": change.uid, "record": change.record}, separators=(",", ":"))
        raw = payload.encode()
        lines.append(_checksum(raw) + b" " + raw + b"\n")
    return b"".join(lines)


def read(path: Path) -> list[Change]:
    """The changes in the journal at ``path``, oldest first (none if there is no journal).

    Stops at the first line that is cut or does not match its checksum (the end of a batch
    that a crash interrupted before it was acknowledged).
    """
    return scan(path)[0]


def scan(path: Path) -> tuple[list[Change], bool]:
    """:func:`read`, and whether every byte of the journal was read: ``False`` when it ends
    in a cut batch, behind which an appended batch would never be read back."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return [], True
    changes: list[Change] = []
    # A last line without its newline was cut, even if it checks out: the next batch would
    # be glued to it.
    whole = not raw or raw.endswith(b"\n")
    for line in raw.split(b"\n"):
        if not line:
            continue
        checksum, _, payload = line.partition(b" ")
        try:
            if checksum != _checksum(payload):
                raise ValueError("checksum mismatch")
            entry = json.loads(payload)
            uid, record = entry["uid"], entry["record"]
            if not isinstance(uid, str) or not isinstance(record, dict | None):
                raise TypeError("not a claim UID and record")
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("journal ends in an interrupted batch", path=str(path), reason=str(exc))
            return changes, False
        changes.append(Change(uid, record))
    return changes, whole


class Journal:
    """The open journal file; :meth:`append` is durable when it returns."""

    def __init__(self, path: Path, *, empty: bool = True) -> None:
        """Open (or create) the journal. ``empty``: empty it now, durably (call after a
        snapshot); otherwise it is left as it is, and nothing may be appended before a
        :meth:`reset`."""
        self.path = path
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise write_error(path, exc) from exc
        # Like a file object's: a journal dropped unclosed (the state of an agent that failed
        # to start, or was replaced) does not keep its descriptor.
        self._closer = weakref.finalize(self, os.close, self._fd)
        self.size = os.fstat(self._fd).st_size
        self._emptied = False
        if empty:
            self.reset()

    def append(self, changes: Sequence[Change]) -> None:
        """Write the batch's changes and wait until they are on disk (one ``fdatasync``)."""
        if not changes:
            return
        payload = encode(changes)
        # Another agent of the node (a surge update) may have emptied the file meanwhile.
        before = os.fstat(self._fd).st_size
        try:
            write_all(self._fd, payload)
            faults.point("journal.before-sync")
            os.fdatasync(self._fd)
        except OSError as exc:
            # A cut line would end every later read there: take the batch back out.
            os.ftruncate(self._fd, before)
            raise write_error(self.path, exc) from exc
        self.size = before + len(payload)

    def reset(self) -> None:
        """Empty the journal (after a snapshot that holds everything it held)."""
        try:
            os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
        except OSError as exc:
            raise write_error(self.path, exc) from exc
        self.size = 0
        if not self._emptied:
            # A created file's name is durable only once its directory is synced; the
            # records appended from now on must not vanish with it.
            fsync_dir(self.path.parent)
            self._emptied = True

    @property
    def appendable(self) -> bool:
        """Whether batches may be appended: the journal was emptied since it was opened."""
        return self._emptied

    @property
    def full(self) -> bool:
        """Whether the next batch should write a snapshot."""
        return self.size >= COMPACT_BYTES

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._closer()
        self._fd = -1
