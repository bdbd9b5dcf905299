"""Fixtures of the real-node tier: a node started by ``make node-up``.

These tests run only when selected with ``-m node`` (``make e2e-node``); otherwise they are
deselected (pytest reports how many), because they need root and a node already running.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.probe import Node

DEFAULT_BASE = "/var/lib/dra-node"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "node" in (config.option.markexpr or ""):
        return
    here = Path(__file__).parent
    selected = [i for i in items if here not in Path(str(i.path)).parents]
    deselected = [i for i in items if here in Path(str(i.path)).parents]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.fixture(scope="session")
def node() -> Iterator[Node]:
    base = Path(os.environ.get("DRA_NODE_BASE", DEFAULT_BASE))
    try:
        node = Node.from_state(base)
    except OSError as e:
        pytest.fail(f"no real node at {base} ({e}); start one with `make node-up`")
    yield node
    node.api.close()


@pytest.fixture
def namespace(node: Node) -> Iterator[str]:
    name = node.new_namespace("node-e2e-")
    yield name
    node.delete_namespace(name)
