"""The agent asks the API server which claims hold the node's devices before start-up."""

from __future__ import annotations

from pathlib import Path

from dra_driver.agent import ask_api
from dra_driver.settings import Settings
from tests.unit.kubeletplugin.helpers import make_claim
from tests.unit.kubeserver import plain_client, serve

CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


def _settings(tmp_path: Path) -> Settings:
    return Settings(node_name="node-a", driver_name="gpu.dra.dev", plugins_dir=tmp_path)


async def test_claims_of_the_pool_become_evidence(tmp_path: Path) -> None:
    async with serve() as server, plain_client(server) as client:
        server.json("GET", CLAIMS, 200, {"items": [make_claim("u1", "c", "ns")], "metadata": {}})
        evidence = await ask_api(client, _settings(tmp_path))
    assert evidence.api is not None and list(evidence.api) == ["u1"]


async def test_no_answer_is_no_evidence(tmp_path: Path) -> None:
    async with serve() as server, plain_client(server) as client:
        server.json("GET", CLAIMS, 403, {"message": "forbidden"})
        evidence = await ask_api(client, _settings(tmp_path))
    assert evidence.api is None
