"""The crash-safe record of prepared claims.

One JSON file in the plugin directory, written atomically, carrying a schema version, the
node's boot id and a checksum of its content: a snapshot, followed by a journal of the claims'
records that changed since (:mod:`.journal`, :class:`CheckpointFile`). A claim whose prepare
makes more than its CDI spec is recorded as ``PrepareStarted`` before anything is made for it
and ``PrepareCompleted`` once its CDI spec exists, so a restart can finish or undo whatever a
crash interrupted; a plain claim only as ``PrepareCompleted`` (all a crash can leave of it is a
spec no record names, see ``device_state.only_a_spec``).

The records are made durable (fsync); the CDI specs are not. A crashed agent finds its specs
in the page cache; only a crash of the machine loses them, and that is a reboot, after which
every record is dropped (a new boot id) and the kubelet prepares its pods' claims again. So a
plain claim's prepare and unprepare cost two journal batches, one ``fdatasync`` each.

The file is ``{"checksum": ..., "data": {"version": N, ...}}``. The checksum is the SHA-256 of
``data`` as stored (serialised with sorted keys and no whitespace), never of the model it is
read into, so adding an optional field changes no checksum. Versions:

- 1: unset optional fields were left out field by field, by hand-kept key lists.
- 2: every unset optional field is left out. A version-1 file reads as version 2 unchanged.

An older file is migrated step by step when read (:data:`MIGRATIONS`) and written back in the
current version at the next save. A newer one (written by a newer agent, before a rollback) is
never moved aside as corrupt: :class:`CheckpointTooNew` stops the agent with one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Collection
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.cdi.writer import write_atomic
from dra_driver.errors import DriverError, StartError
from dra_driver.gpu.state import journal
from dra_driver.gpu.state.journal import Change, Journal
from dra_driver.kubeletplugin.uid import valid_uid

log = structlog.get_logger(__name__)

SCHEMA_VERSION = 2
#: The journal lives beside the snapshot, named after it.
JOURNAL_SUFFIX = ".journal"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
BOOT_ID_ENV = "DRA_BOOT_ID_FILE"


class ClaimState(StrEnum):
    """Where a claim is in its prepare."""

    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    # Dynamic MIG: recorded before the claim's MIG devices are destroyed, so a restart
    # finishes the unprepare instead of forgetting the devices.
    UNPREPARE_STARTED = "UnprepareStarted"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class MigRecord(_Model):
    """A MIG device created for the claim on demand (dynamic MIG).

    Written before the GPU instance is created: the GPU and placement identify the
    instance even if a crash comes before its ids are known, so a restart can destroy it.
    """

    gpu_uuid: str = Field(alias="gpuUUID")
    profile_id: int = Field(alias="profileID")
    profile: str
    start: int
    size: int
    gpu_instance_id: int | None = Field(default=None, alias="gpuInstanceID")
    compute_instance_id: int | None = Field(default=None, alias="computeInstanceID")


class MpsRecord(_Model):
    """An MPS control daemon a claim uses, written before the daemon is started.

    The id and directories are enough to stop it after a crash; UUIDs and limits let a
    restarted agent start it again if it died while its claims were prepared.
    """

    daemon: str
    uuids: list[str] = Field(default_factory=list)
    pipe_dir: str = Field(alias="pipeDir")
    log_dir: str = Field(alias="logDir")
    shm_dir: str = Field(alias="shmDir")
    active_thread_percentage: int | None = Field(default=None, alias="activeThreadPercentage")
    pinned_memory: dict[str, str] = Field(default_factory=dict, alias="pinnedMemory")
    multi_user: bool | None = Field(default=None, alias="multiUser")


class DeviceRecord(_Model):
    """One device prepared for a claim, with what was returned for it."""

    request_names: list[str] = Field(alias="requestNames")
    pool_name: str = Field(alias="poolName")
    device_name: str = Field(alias="deviceName")
    cdi_device_ids: list[str] = Field(default_factory=list, alias="cdiDeviceIDs")
    share_id: str | None = Field(default=None, alias="shareID")
    uuid: str = ""
    sharing: str | None = None  # the applied sharing strategy, if any
    mig: MigRecord | None = None  # set for MIG devices created on demand
    timeslice: str | None = None  # the time-slice interval set on the GPU for this claim
    # A share of a shared GPU: what the scheduler counted, and the GPU's MPS daemon.
    consumed_capacity: dict[str, str] | None = Field(default=None, alias="consumedCapacity")
    mps: MpsRecord | None = None


class ClaimRecord(_Model):
    """One claim's entry."""

    state: ClaimState
    namespace: str
    name: str
    devices: list[DeviceRecord] = Field(default_factory=list)
    mps: MpsRecord | None = None  # the claim's own MPS control daemon (MPS config)
    # Prepared by the agent before its pod was bound (binding conditions), not by the
    # kubelet: the agent itself unprepares it if the claim is deallocated before a pod runs.
    before_binding: bool | None = Field(default=None, alias="beforeBinding")


class CheckpointData(_Model):
    """The checksummed body of the file."""

    version: int = SCHEMA_VERSION
    boot_id: str = Field(alias="bootID")
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    # Version 2 only stopped writing unset fields; what version 1 stored reads the same.
    return {**data, "version": 2}


#: Version N -> the step that turns a stored version-N body into a version-N+1 body.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_v1}


class CheckpointTooNew(StartError):
    """The file was written by a newer agent; reading it could lose what that one recorded."""

    def __init__(self, path: Path, version: int) -> None:
        super().__init__(
            f"checkpoint {path} has format version {version}, newer than this agent's "
            f"{SCHEMA_VERSION}: run the newer agent, or move the file aside to start empty"
        )
        self.version = version


class CorruptCheckpoint(DriverError):
    """The file exists but cannot be trusted; it has been moved aside to ``moved_to``."""

    def __init__(self, reason: str, moved_to: Path) -> None:
        super().__init__(f"checkpoint corrupt ({reason}); moved aside to {moved_to}")
        self.reason = reason
        self.moved_to = moved_to


def read_boot_id(path: Path | None = None) -> str:
    """The kernel's boot id, which changes on every reboot.

    ``$DRA_BOOT_ID_FILE`` replaces the kernel's file for tests of a reboot: a container cannot
    be shown another ``/proc/sys/kernel/random/boot_id``. Nodes leave it unset."""
    if path is None:
        path = Path(os.environ.get(BOOT_ID_ENV) or BOOT_ID_PATH)
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _checksum(data: Any) -> str:
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def save(path: Path, data: CheckpointData) -> None:
    """Write the checkpoint atomically with its checksum, in the current version."""
    body = data.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["version"] = SCHEMA_VERSION
    write_atomic(
        path, {"checksum": _checksum(body), "data": body}, fault="checkpoint.before-rename"
    )


def migrate(body: dict[str, Any]) -> dict[str, Any]:
    """A stored body of any known version as a body of the current one."""
    version = body.get("version")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"schema version {version!r} is not a version")
    while version < SCHEMA_VERSION:
        body = MIGRATIONS[version](body)
        version = body["version"]
    return body


def load(path: Path, boot_id: str) -> CheckpointData:
    """Read the checkpoint; a missing file is an empty one.

    Raises :class:`CorruptCheckpoint` after moving an unreadable file aside (start-up then
    rebuilds the records from the CDI specs instead of crash-looping on it), and
    :class:`CheckpointTooNew` (leaving the file alone) for a version this agent does not know.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return CheckpointData(boot_id=boot_id)
    try:
        envelope = json.loads(raw)
        body = envelope["data"]
        version = body.get("version")
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise CheckpointTooNew(path, version)
        if envelope.get("checksum") != _checksum(body):
            raise ValueError("checksum mismatch")
        data = CheckpointData.model_validate(migrate(body))
    except (
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        RecursionError,
        ValidationError,
    ) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        moved = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        path.replace(moved)
        raise CorruptCheckpoint(reason, moved) from None
    for uid in [uid for uid in data.claims if not valid_uid(uid)]:
        _drop(uid, path)
        del data.claims[uid]
    return data


def _drop(uid: str, path: Path) -> None:
    """Log a record stored under a key that is no claim UID, which the caller then drops.

    The driver never records such a claim (it refuses its UID), so the record is damage or
    someone else's doing; start-up would remove the paths its key names (``..`` makes
    ``<state>/mps/<key>`` the state directory). The rest of the file is kept: dropping the
    record loses no claim the driver prepared."""
    log.error("checkpoint record not under a claim UID: dropped", claim_uid=uid, path=str(path))


class CheckpointFile:
    """The node's checkpoint: a snapshot file and its journal, shared by the node's agents
    under the node lock.

    A write appends the records that changed since the last read or write to the journal
    (one ``fdatasync``, see :mod:`.journal`); the first write after start-up and every write
    once the journal is full save a snapshot (:func:`save`) and empty the journal. Remembers
    both files as this agent last read or wrote them (inode, size, mtime): a snapshot is
    always renamed into place and the journal only grows between snapshots, so another
    agent's write always shows, and unchanged files are not read again.
    """

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.journal_path = path.with_name(path.name + JOURNAL_SUFFIX)
        # As strings: stat'ed four times per prepare or unprepare.
        self._stamped = (str(self.path), str(self.journal_path))
        self.boot_id = boot_id
        self._seen: tuple[tuple[int, int, int] | None, ...] | None = None
        #: Opened at the first read; appended to only once this agent's first write has
        #: saved a snapshot and emptied it.
        self._journal: Journal | None = None
        self._stored: dict[str, dict[str, Any]] = {}
        #: The next write must save a snapshot: the journal was last read with a cut batch at
        #: its end (another agent died while appending), behind which an appended batch would
        #: never be read back; or the snapshot was found corrupt and moved aside, and a batch
        #: appended without it would be read back as all there is.
        self._snapshot_due = False

    def _stamp(self) -> tuple[tuple[int, int, int] | None, ...]:
        stamps: list[tuple[int, int, int] | None] = []
        for path in self._stamped:
            try:
                st = os.stat(path)
            except OSError:
                stamps.append(None)
                continue
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(stamps)

    def read(self) -> CheckpointData:
        """Read the snapshot (see :func:`load`), replay the journal onto it, remember both."""
        try:
            data = load(self.path, self.boot_id)
        except CorruptCheckpoint:
            self._snapshot_due = True
            raise
        self._replay(data)
        self._remember(_stored(data))
        if self._journal is None:
            # Opened now rather than by the first write, so the agent's descriptors are the
            # same before its first prepare as after it. Left as it is until that write's
            # snapshot; one that cannot be opened now (a read-only or full disk) is then.
            with contextlib.suppress(OSError):
                self._journal = Journal(self.journal_path, empty=False)
        return data

    def reread(self) -> CheckpointData | None:
        """The records if either file changed since this agent last saw them, else ``None``."""
        if self._seen is not None and self._stamp() == self._seen:
            return None
        try:
            data = self.read()
        finally:
            self._seen = self._stamp()
        return data if data.boot_id == self.boot_id else None

    def recovered(self, known: CheckpointData) -> CheckpointData:
        """After :meth:`read` found the snapshot corrupt (and moved it aside): ``known``, the
        records this agent holds, with the journal replayed onto it. Its changes are whole
        records in order, so those this agent saw already change nothing, and batches another
        agent appended since (a surge update) are not lost."""
        data = known.model_copy(deep=True)
        self._replay(data)
        return data

    def _replay(self, data: CheckpointData) -> None:
        """Apply the journal's changes to ``data``, up to its first unreadable record."""
        changes, whole = journal.scan(self.journal_path)
        if not whole:
            self._snapshot_due = True
        for change in changes:
            if not valid_uid(change.uid):
                _drop(change.uid, self.journal_path)
                continue
            if change.record is None:
                data.claims.pop(change.uid, None)
                continue
            try:
                data.claims[change.uid] = ClaimRecord.model_validate(change.record)
            except ValidationError as exc:
                reason = str(exc).splitlines()[0]
                log.warning("journal record unreadable: replay ends here", reason=reason)
                self._snapshot_due = True
                break

    def write(self, data: CheckpointData, changed: Collection[str] | None = None) -> None:
        """Record ``data`` durably (raises ``OSError``, the files left as they were) and
        remember it. ``changed``: the only claims whose records may differ from the last
        read or write (records added or removed are found either way); without it every
        record is compared. A batch touches its own claims only, and serialising every
        record per write would make each prepare cost as much as all prepared claims."""
        stored = self._stored_after(data, changed)
        if (
            self._journal is None
            or not self._journal.appendable
            or self._journal.full
            or self._snapshot_due
        ):
            save(self.path, data)
            if self._journal is None:
                self._journal = Journal(self.journal_path)
            else:
                self._journal.reset()
            self._snapshot_due = False
        else:
            changes = [
                Change(uid, record)
                for uid, record in stored.items()
                if (before := self._stored.get(uid)) is not record and before != record
            ]
            changes += [Change(uid, None) for uid in self._stored if uid not in stored]
            self._journal.append(changes)
        self._remember(stored)

    def _stored_after(
        self, data: CheckpointData, changed: Collection[str] | None
    ) -> dict[str, dict[str, Any]]:
        """Each record of ``data`` as stored; unchanged ones as last remembered."""
        if changed is None:
            return _stored(data)
        return {
            uid: (
                self._stored[uid] if uid in self._stored and uid not in changed else _dump(record)
            )
            for uid, record in data.claims.items()
        }

    def _remember(self, stored: dict[str, dict[str, Any]]) -> None:
        self._stored = stored
        self._seen = self._stamp()

    def distrust(self) -> None:
        """A write failed: memory is ahead of the files, so read them again next time."""
        self._seen = None

    def close(self) -> None:
        """Close the journal (idempotent)."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None


def stored_claims(path: Path) -> dict[str, dict[str, Any]]:
    """The claims as stored at ``path`` and its journal, by UID, as JSON: reads only, checks
    nothing (for people and tests looking at a node)."""
    try:
        claims = dict(json.loads(path.read_bytes())["data"]["claims"])
    except FileNotFoundError:
        claims = {}
    for change in journal.read(path.with_name(path.name + JOURNAL_SUFFIX)):
        if change.record is None:
            claims.pop(change.uid, None)
        else:
            claims[change.uid] = change.record
    return claims


def _stored(data: CheckpointData) -> dict[str, dict[str, Any]]:
    """Each claim's record as stored, by UID."""
    return {uid: _dump(rec) for uid, rec in data.claims.items()}


def _dump(record: ClaimRecord) -> dict[str, Any]:
    """A claim's record as stored."""
    return record.model_dump(mode="json", by_alias=True, exclude_none=True)
