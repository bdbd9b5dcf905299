"""Options shared by every test directory (so they work from the repository root)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("e2e")
    group.addoption(
        "--keep-cluster",
        action="store_true",
        default=False,
        help="keep the e2e control plane running after the session and print its kubeconfig",
    )
