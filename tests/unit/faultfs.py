"""A filesystem fault layer for unit tests of the durable writer and what is built on it.

:class:`FaultFS` stands in for the ``os`` module as ``dra_driver.cdi.writer`` and the journal
see it (and only there: pytest and the rest of the process keep
the real ones). It counts calls per operation and, at the Nth call of one operation, injects
one fault:

- ``ENOSPC`` / ``EIO``: the call raises ``OSError`` with that errno (a ``write`` first writes
  half its bytes, as a filling disk does);
- ``short``: a ``write`` writes and reports only part of its bytes; the caller must go on.

Operations: ``create`` (the temp file), ``write``, ``fsync`` (file and directory, and the
journal's ``fdatasync``), ``rename``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from dra_driver.cdi import writer
from dra_driver.gpu.state import journal

OPERATIONS = ("create", "write", "fsync", "rename")
KINDS = ("ENOSPC", "EIO", "short")


@dataclass
class Fault:
    """Inject ``kind`` at the ``nth`` call of ``op`` (counted from the start of the test);
    ``every`` keeps injecting from then on."""

    op: str
    nth: int
    kind: str
    every: bool = False


@dataclass
class FaultFS:
    """Counts the writer's filesystem calls and injects the armed faults."""

    faults: list[Fault] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPERATIONS, 0))
    injected: list[Fault] = field(default_factory=list)

    def arm(self, op: str, nth: int, kind: str, every: bool = False) -> None:
        """Inject ``kind`` at the ``nth`` (1-based) call of ``op`` from now on."""
        assert op in OPERATIONS and kind in KINDS, (op, kind)
        self.faults.append(Fault(op, self.calls[op] + nth, kind, every))

    def clear(self) -> None:
        """Disarm every fault (the counters keep going)."""
        self.faults.clear()

    def _due(self, op: str) -> Fault | None:
        self.calls[op] += 1
        for fault in self.faults:
            if fault.op == op and (
                self.calls[op] == fault.nth or (fault.every and self.calls[op] >= fault.nth)
            ):
                self.injected.append(fault)
                return fault
        return None

    @staticmethod
    def _raise(kind: str) -> None:
        code = errno.ENOSPC if kind == "ENOSPC" else errno.EIO
        raise OSError(code, os.strerror(code))

    # --- the wrapped calls ---------------------------------------------------------------

    def write(self, fd: int, data: Any) -> int:
        fault = self._due("write")
        if fault is None:
            return os.write(fd, data)
        part = bytes(data)[: max(1, len(data) // 2)]
        if fault.kind == "short":
            return os.write(fd, part)
        os.write(fd, part)
        self._raise(fault.kind)
        raise AssertionError("unreachable")

    def fsync(self, fd: int) -> None:
        fault = self._due("fsync")
        if fault is not None and fault.kind != "short":
            self._raise(fault.kind)
        os.fsync(fd)

    def replace(self, src: Any, dst: Any) -> None:
        fault = self._due("rename")
        if fault is not None and fault.kind != "short":
            self._raise(fault.kind)
        os.replace(src, dst)

    def open(self, path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        # Only an exclusive create is a "create": a temp file (lock files and directories are
        # opened, not created fresh).
        if flags & os.O_EXCL:
            fault = self._due("create")
            if fault is not None and fault.kind != "short":
                self._raise(fault.kind)
        return os.open(path, flags, *args, **kwargs)

    def os_module(self) -> Any:
        """An ``os`` whose open/write/fsync/replace are these; everything else is the real one."""

        class _Os(SimpleNamespace):
            def __getattr__(inner, name: str) -> Any:
                return getattr(os, name)

        # fdatasync (the checkpoint's journal) is one more kind of fsync.
        return _Os(
            write=self.write,
            fsync=self.fsync,
            fdatasync=self.fsync,
            replace=self.replace,
            open=self.open,
        )


@pytest.fixture
def faultfs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultFS]:
    """A :class:`FaultFS` installed under ``dra_driver.cdi.writer`` and the checkpoint's
    journal for the test."""
    fs = FaultFS()
    monkeypatch.setattr(writer, "os", fs.os_module())
    monkeypatch.setattr(journal, "os", fs.os_module())
    yield fs
