"""Durable, atomic JSON files (CDI specs, the checkpoint, the publishers' record): a reader
never sees a half-written file, and a write that fails leaves the previous file as it was. And
the node's file lock, which serialises the processes that share such files.

The temp file is created in the target's directory with O_CREAT|O_EXCL, so nothing placed at
its path beforehand, a symlink least of all, is ever opened for writing: a name that is taken
is skipped. Its name is the target's, the process id and a counter, between a leading dot and
a ``.tmp`` suffix, which container runtimes do not load and :func:`sweep_temp_files` removes
at start-up. A lock file is opened with O_NOFOLLOW for the same reason.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from dra_driver import faults
from dra_driver.errors import DriverError

log = structlog.get_logger(__name__)

TEMP_SUFFIX = ".tmp"
#: Names tried before a write gives up when every one is taken (by files nobody removed).
TEMP_ATTEMPTS = 100
_temp_names = itertools.count()


class DurableWriteError(DriverError, OSError):
    """Writing a file failed; the previous content of the file is unchanged."""

    def __str__(self) -> str:
        return str(self.strerror)


def spec_file_name(vendor: str, cls: str, spec_id: str) -> str:
    """The transient spec file name ``<vendor>-<class>_<id>.json``."""
    return f"{vendor}-{cls}_{spec_id}.json"


def write_all(fd: int, payload: bytes) -> None:
    """Write every byte: ``os.write`` may write fewer bytes than asked (a full disk, a
    signal), and a zero-byte write would otherwise loop forever."""
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(f"write made no progress with {len(view)} bytes left")
        view = view[written:]


def write_atomic(
    path: Path,
    data: dict[str, Any],
    fault: str | None = None,
    sync_dir: bool = True,
    sync: bool = True,
) -> None:
    """Write JSON to ``path`` through a fresh temp file: write all, fsync, check the size,
    rename, then fsync the directory.

    Raises :class:`DurableWriteError` (an ``OSError``) naming the file and the cause; the temp
    file is gone and ``path`` holds its previous content. ``fault`` names a crash point between
    the fsync and the rename (see :mod:`faults`). ``sync_dir=False`` leaves the directory fsync
    to the caller, who writes several files and makes their renames durable with one
    :func:`fsync_dir`. ``sync=False`` skips both fsyncs: the rename still replaces the file
    whole for every reader, but only until the machine goes down (for files that are written
    again after a crash that loses the page cache).
    """
    # One line: with an indent, json takes its pure-Python encoder, which made the spec's
    # encoding a tenth of a prepare's CPU; readers (containerd, jq) do not care.
    payload = json.dumps(data).encode()
    try:
        try:
            _replace(path, payload, fault, sync)
        except FileNotFoundError:
            # The directory is missing (removed, or never made): made on demand, so the
            # usual write costs no mkdir.
            path.parent.mkdir(parents=True, exist_ok=True)
            _replace(path, payload, fault, sync)
        if sync and sync_dir:
            _fsync_dir(path.parent)
    except OSError as exc:
        raise write_error(path, exc) from exc


def _replace(path: Path, payload: bytes, fault: str | None, sync: bool) -> None:
    fd, tmp = _create_temp(path)
    try:
        try:
            os.fchmod(fd, 0o644)
            write_all(fd, payload)
            if sync:
                os.fsync(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size != len(payload):
            raise OSError(f"wrote {size} of {len(payload)} bytes")
        if fault is not None:
            faults.point(fault)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temp file beside ``path``, open for writing. Not a random name (what
    tempfile does costs more than the rest of a spec's write): O_EXCL already refuses any
    name that exists, and the next one is tried."""
    for _ in range(TEMP_ATTEMPTS):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_temp_names)}{TEMP_SUFFIX}")
        try:
            # Mode 0600 until written; specs and the checkpoint are 0644 (set in _replace).
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, f"no free temp file name beside {path.name}")


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def write_error(path: Path, exc: OSError) -> DurableWriteError:
    """The error for a failed write of ``path``: names the file and keeps the errno."""
    return DurableWriteError(exc.errno, f"cannot write {path}: {_reason(exc)}")


def is_temp_file(name: str, prefix: str = "") -> bool:
    """Whether ``name`` is a :func:`write_atomic` temp file of a file named ``prefix...``."""
    return name.startswith(f".{prefix}") and name.endswith(TEMP_SUFFIX)


def sweep_temp_files(directory: Path, prefix: str = "") -> list[str]:
    """Remove temp files a crash or a failed write left in ``directory``; returns their names.

    ``prefix`` limits the sweep to temp files of targets named ``prefix...`` (a CDI directory
    is shared with other vendors' specs). Symlinks of that naming are unlinked, never
    followed; a missing directory has nothing to sweep.
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for entry in entries:
        if not is_temp_file(entry.name, prefix) or entry.is_dir(follow_symlinks=False):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
            removed.append(entry.name)
    if removed:
        log.info("removed stale temp files", directory=str(directory), files=sorted(removed))
    return removed


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
    """Make a rename or unlink in ``directory`` durable; raises :class:`DurableWriteError`."""
    try:
        _fsync_dir(directory)
    except OSError as exc:
        raise DurableWriteError(
            exc.errno, f"cannot sync directory {directory}: {_reason(exc)}"
        ) from exc


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_lock_file(path: Path) -> int:
    """Open a lock file for ``flock``, creating it (and its directory, should that have been
    removed). A symlink at ``path`` is refused (ELOOP), never followed."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags, 0o600)


@contextlib.contextmanager
def hold_file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the body of a ``with``, from blocking code:
    another process of the node holding it (a second agent in a surge update) makes this wait.
    The lock is a fresh open file description, so it conflicts with every other holder."""
    fd = open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor drops the flock
