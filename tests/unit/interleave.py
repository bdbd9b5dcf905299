"""An event loop that perturbs the scheduling of tasks, and helpers to watch what goes wrong.

:class:`InterleavingLoop` is a selector event loop whose ``call_soon`` takes the resumptions
of tasks suspended in the code under test (their coroutine chain runs through one of the
``scope`` directories) and, driven by a seeded :class:`random.Random`:

* *postpones* some behind everything already ready: the step is queued again 1..``max_hops``
  times before it runs, so callbacks that became ready after it run first (the order in which
  concurrent completions are observed changes);
* *delays* some by a timer of up to ``max_delay`` seconds (I/O and timers fire in between).

Only task resumptions are moved, and only later, never earlier: a task resumed later than
it could have been is an interleaving a slower machine produces too, so whatever breaks is a
real ordering assumption of the code under test. Callbacks asyncio and the libraries schedule
for themselves (transports, futures' plumbing) keep their FIFO order, which they rely on.
``call_soon_threadsafe`` is left alone.

The loop also records every call of its exception handler. :func:`fresh_loggers` and
:func:`crash_events` collect the structlog events of the code under test and pick the ones
that say a loop or a handler crashed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextvars import Context
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from structlog.testing import capture_logs

import dra_driver

PACKAGE = Path(dra_driver.__file__).parent
#: Where the awaits that are perturbed live, by default.
DEFAULT_SCOPE = (
    str(PACKAGE / "kubeletplugin") + os.sep,
    str(PACKAGE / "resourceslice") + os.sep,
)
#: The environment variable that picks the seed of a run.
SEED_ENV = "INTERLEAVE_SEED"


@dataclass(frozen=True)
class Perturbation:
    """How often and how far task resumptions are moved."""

    postpone: float = 0.25  # probability of re-queueing a resumption behind the ready ones
    delay: float = 0.08  # probability of delaying it by a timer
    max_hops: int = 3
    max_delay: float = 0.004
    scope: tuple[str, ...] = DEFAULT_SCOPE


@dataclass
class Stats:
    """What the loop did to the resumptions it saw."""

    counts: Counter[str] = field(default_factory=Counter)


def _task_of(callback: Callable[..., Any]) -> asyncio.Task[Any] | None:
    """The task a ``call_soon`` callback resumes (its step or wakeup method), if any."""
    owner = getattr(callback, "__self__", None)
    return owner if isinstance(owner, asyncio.Task) else None


def _files(task: asyncio.Task[Any]) -> Iterator[str]:
    """The source files of the frames a task is suspended in, outermost first."""
    coro: Any = task.get_coro()
    for _ in range(64):
        if coro is None:
            return
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            yield frame.f_code.co_filename
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


class InterleavingLoop(asyncio.SelectorEventLoop):
    """A selector event loop that moves task resumptions later at random (see the module)."""

    def __init__(self, seed: int, perturbation: Perturbation | None = None) -> None:
        super().__init__()
        self.seed = seed
        self.rng = random.Random(seed)
        self.perturbation = perturbation or Perturbation()
        #: Switched off to let the system settle without being pushed around.
        self.perturbing = True
        self.stats = Stats()
        #: Every context the exception handler was called with.
        self.unhandled: list[dict[str, Any]] = []
        self._in_scope: dict[str, bool] = {}
        self.set_exception_handler(self._record)

    def _record(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.unhandled.append(context)
        self.default_exception_handler(context)

    def _scoped(self, task: asyncio.Task[Any]) -> bool:
        for filename in _files(task):
            hit = self._in_scope.get(filename)
            if hit is None:
                hit = filename.startswith(self.perturbation.scope)
                self._in_scope[filename] = hit
            if hit:
                return True
        return False

    def call_soon(
        self, callback: Callable[..., Any], *args: Any, context: Context | None = None
    ) -> asyncio.Handle:
        """Schedule ``callback``; a task resumption in scope may be moved later."""
        task = _task_of(callback) if self.perturbing else None
        if task is None or not self._scoped(task):
            return super().call_soon(callback, *args, context=context)
        p = self.perturbation
        roll = self.rng.random()
        if roll < p.delay:
            self.stats.counts["delayed"] += 1
            delay = self.rng.uniform(0, p.max_delay)
            return super().call_later(delay, callback, *args, context=context)
        if roll < p.delay + p.postpone:
            self.stats.counts["postponed"] += 1
            # The handle the caller gets is the one that finally runs, so cancelling it
            # still works.
            handle = asyncio.Handle(callback, args, self, context)
            super().call_soon(self._hop, handle, self.rng.randint(1, p.max_hops))
            return handle
        self.stats.counts["kept"] += 1
        return super().call_soon(callback, *args, context=context)

    def _hop(self, handle: asyncio.Handle, left: int) -> None:
        if handle.cancelled():
            return
        if left > 1:
            super().call_soon(self._hop, handle, left - 1)
        else:
            handle._run()


def run(main: Callable[[], Any], loop: InterleavingLoop) -> Any:
    """Run the coroutine ``main()`` to completion on ``loop`` (a fresh one).

    Afterwards every task left is cancelled and the loop closed, as ``asyncio.run`` does.
    """
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main())
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def current_loop() -> InterleavingLoop:
    """The running :class:`InterleavingLoop` (inside :func:`run`)."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, InterleavingLoop), "not running on an InterleavingLoop"
    return loop


def seeds(fixed: Sequence[int]) -> list[int]:
    """The seeds of a bounded run: ``$INTERLEAVE_SEED`` alone when set, else ``fixed``."""
    chosen = os.environ.get(SEED_ENV)
    return [int(chosen)] if chosen else list(fixed)


# ----------------------------------------------------------------- log events


#: Modules whose module-level logger is swapped while events are collected.
LOGGED = ("dra_driver.kubeletplugin", "dra_driver.resourceslice", "dra_driver.supervise")

_PROXY = type(structlog.get_logger())

#: Events that say a loop, a handler or a callback died of an exception.
CRASH_EVENTS = frozenset({"background loop crashed", "background loop ended unexpectedly"})


@contextlib.contextmanager
def fresh_loggers() -> Iterator[list[dict[str, Any]]]:
    """Collect the structlog events of the code under test (as ``capture_logs`` does).

    The modules' loggers may have cached the configuration in force when they were first
    used (an earlier test may have configured logging), so each module's ``log`` is replaced
    by a fresh proxy for the duration, and objects created inside bind the capturing one.
    """
    swapped: list[tuple[Any, Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(LOGGED):
            continue
        old = getattr(module, "log", None)
        if isinstance(old, _PROXY):
            swapped.append((module, old))
            module.log = structlog.get_logger(name)
    try:
        with capture_logs() as events:
            yield events
    finally:
        for module, old in swapped:
            module.log = old


def crash_events(
    events: Sequence[dict[str, Any]], allowed: Callable[[dict[str, Any]], bool]
) -> list[str]:
    """The events that report a crash (a loop died, an exception was logged with its
    traceback), except those ``allowed`` expects; one line each."""
    out = []
    for event in events:
        crashed = event.get("event") in CRASH_EVENTS or bool(event.get("exc_info"))
        if crashed and not allowed(event):
            error = event.get("error") or event.get("exc_info")
            out.append(
                f"{event.get('log_level')}: {event.get('event')} ({event.get('loop', '')}) {error!r}"
            )
    return out
