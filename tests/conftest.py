"""Options shared by every test directory (so they work from the repository root)."""

from __future__ import annotations

import signal
from types import FrameType

import pytest
from hypothesis import settings

# `make test` is repeatable: every property test draws the same examples on every run and
# machine, so a red run reproduces and a green one is not luck. Fresh seeds are what
# `make fuzz-cel`, `make fuzz-state` and `make fuzz-async` are for.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.load_profile("repeatable")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("e2e")
    group.addoption(
        "--keep-cluster",
        action="store_true",
        default=False,
        help="keep the e2e control plane running after the session and print its kubeconfig",
    )


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped with SIGTERM (a CI timeout, `kill`) ends as Ctrl-C would: pytest tears
    # the fixtures down, so the control planes, nodes and drivers they started stop with the
    # run instead of outliving it and loading the machine.
    _catch_sigterm()


def pytest_runtest_setup(item: pytest.Item) -> None:
    # A test's event loop that handled SIGTERM itself resets it to the default on closing.
    _catch_sigterm()


def _catch_sigterm() -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")
