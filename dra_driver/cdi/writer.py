"""Atomic CDI spec files: a runtime never sees a half-written spec."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dra_driver import faults


def spec_file_name(vendor: str, cls: str, spec_id: str) -> str:
    """The transient spec file name ``<vendor>-<class>_<id>.json``."""
    return f"{vendor}-{cls}_{spec_id}.json"


def write_atomic(
    path: Path, data: dict[str, Any], fault: str | None = None, sync_dir: bool = True
) -> None:
    """Write JSON to ``path`` via a temp file, fsync and rename, then fsync the directory.

    ``fault`` names a crash point between the fsync and the rename (see :mod:`faults`).
    ``sync_dir=False`` leaves the directory fsync to the caller, who writes several files
    and makes their renames durable with one :func:`fsync_dir`.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # A dot-prefixed temp name: runtimes only load files ending in .json/.yaml.
    tmp = path.with_name(f".{path.name}.tmp")
    payload = json.dumps(data, indent=2, sort_keys=False).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    if fault is not None:
        faults.point(fault)
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent)


def remove(path: Path, sync_dir: bool = True) -> bool:
    """Remove a file; True if it existed. The unlink is made durable unless ``sync_dir`` is
    False (the caller syncs the directory once for several removals)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if sync_dir:
        fsync_dir(path.parent)
    return True


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
