"""Start-up: read the checkpoint and undo what a reboot or a crash left half done."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog

from dra_driver.gpu.sharing.backend import SharingError
from dra_driver.gpu.sharing.manager import SharingManager
from dra_driver.gpu.state import checkpoint
from dra_driver.gpu.state.checkpoint import CheckpointData, ClaimState, CorruptCheckpoint

log = structlog.get_logger(__name__)


def load(
    path: Path, boot_id: str, node_name: str
) -> tuple[CheckpointData, CorruptCheckpoint | None]:
    """The checkpoint at ``path``; a corrupt one is moved aside and an empty state returned."""
    try:
        return checkpoint.load(path, boot_id), None
    except CorruptCheckpoint as exc:
        log.error(
            "checkpoint corrupt", reason=exc.reason, moved_to=str(exc.moved_to), node=node_name
        )
        return CheckpointData(boot_id=boot_id), exc


def recover(
    data: CheckpointData,
    boot_id: str,
    *,
    node_name: str,
    sharing: SharingManager,
    remove_artifacts: Callable[[str], None],
) -> bool:
    """Drop what a reboot made stale and undo prepares a crash interrupted (in ``data``);
    True if a claim was dropped.

    Undone claims' MIG devices are left to :meth:`.Carver.destroy_orphans`.
    """
    stale: list[str] = []
    if data.boot_id != boot_id:
        stale = list(data.claims)
        log.info("node rebooted: dropping prepared claims", count=len(stale), node=node_name)
    else:
        stale = [
            uid for uid, rec in data.claims.items() if rec.state is not ClaimState.PREPARE_COMPLETED
        ]
    dropped = [data.claims.pop(uid) for uid in stale]
    try:
        # Daemons first: their pipe directories go with the claims' artifacts.
        sharing.release(dropped, data.claims.values())
    except SharingError as exc:
        log.error("undoing sharing of dropped claims failed", error=str(exc))
    sharing.sweep(data.claims.values())
    for uid, rec in zip(stale, dropped, strict=True):
        remove_artifacts(uid)
        # An interrupted unprepare is finished, an interrupted prepare undone: either way
        # the claim goes, and its MIG devices with it (see Carver.destroy_orphans).
        log.info(
            "finished interrupted unprepare"
            if rec.state is ClaimState.UNPREPARE_STARTED
            else "undid interrupted prepare",
            claim=f"{rec.namespace}/{rec.name}",
            claim_uid=uid,
        )
    data.boot_id = boot_id
    return bool(stale)
