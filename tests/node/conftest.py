"""Fixtures of the real-node tier: a node started by ``make node-up``.

These tests run only when selected with ``-m node`` (``make e2e-node``); otherwise they are
deselected (pytest reports how many), because they need root and a node already running.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.node.probe import REPO, Node

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
        state = json.loads((base / "node-state.json").read_text())
    except OSError as e:
        pytest.fail(f"no real node at {base} ({e}); start one with `make node-up`")
    api = config.new_client_from_config(config_file=state["kubeconfig"])
    yield Node(
        api=api,
        name=state["node"],
        base=base,
        kubeconfig=Path(state["kubeconfig"]),
        helm_bin=Path(os.environ.get("DRA_NODE_HELM", REPO / ".cache/tools/bin/helm")),
        ctr_bin=Path(os.environ.get("DRA_NODE_CTR", REPO / ".cache/node/bin/ctr")),
    )
    api.close()


@pytest.fixture
def namespace(node: Node) -> Iterator[str]:
    core = client.CoreV1Api(node.api)
    ns = core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(generate_name="node-e2e-"))
    )
    name: str = ns.metadata.name
    node.wait_service_account(name)
    yield name
    node.delete_namespace(name)
