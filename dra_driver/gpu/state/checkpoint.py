"""The crash-safe record of prepared claims.

One JSON file in the plugin directory, written atomically, carrying a schema version, the
node's boot id and a checksum of its content. A claim is recorded as ``PrepareStarted`` before
anything is written for it and ``PrepareCompleted`` once its CDI spec exists, so a restart can
finish or undo whatever a crash interrupted.
"""

from __future__ import annotations

import hashlib
import json
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from dra_driver.cdi.writer import write_atomic

SCHEMA_VERSION = 1
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


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


def _omit_none(body: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    # Files written before a field existed lack its key; leaving it out when unset keeps their
    # checksums (computed over the re-serialised body) valid.
    for key in keys:
        if body.get(key) is None:
            body.pop(key, None)
    return body


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

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _omit_none(handler(self), ("mig", "timeslice", "consumedCapacity", "mps"))


class ClaimRecord(_Model):
    """One claim's entry."""

    state: ClaimState
    namespace: str
    name: str
    devices: list[DeviceRecord] = Field(default_factory=list)
    mps: MpsRecord | None = None  # the claim's own MPS control daemon (MPS config)

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _omit_none(handler(self), ("mps",))


class CheckpointData(_Model):
    """The checksummed body of the file."""

    version: int = SCHEMA_VERSION
    boot_id: str = Field(alias="bootID")
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)


class CorruptCheckpoint(Exception):
    """The file exists but cannot be trusted; it has been moved aside to ``moved_to``."""

    def __init__(self, reason: str, moved_to: Path) -> None:
        super().__init__(f"checkpoint corrupt ({reason}); moved aside to {moved_to}")
        self.reason = reason
        self.moved_to = moved_to


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot id, which changes on every reboot."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _checksum(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def _body(data: CheckpointData) -> str:
    return json.dumps(
        data.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":")
    )


def save(path: Path, data: CheckpointData) -> None:
    """Write the checkpoint atomically with its checksum."""
    body = _body(data)
    write_atomic(
        path,
        {"checksum": _checksum(body), "data": json.loads(body)},
        fault="checkpoint.before-rename",
    )


def load(path: Path, boot_id: str) -> CheckpointData:
    """Read the checkpoint; a missing file is an empty one.

    Raises :class:`CorruptCheckpoint` after moving an unreadable file aside, so the agent
    starts with an empty state instead of crash-looping on it.
    """
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return CheckpointData(boot_id=boot_id)
    try:
        envelope = json.loads(raw)
        data = CheckpointData.model_validate(envelope["data"])
        if data.version != SCHEMA_VERSION:
            raise ValueError(f"schema version {data.version}, expected {SCHEMA_VERSION}")
        if envelope.get("checksum") != _checksum(_body(data)):
            raise ValueError("checksum mismatch")
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        moved = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        path.replace(moved)
        raise CorruptCheckpoint(reason, moved) from None
    return data
