"""Claim checks and the kubernetes.aio-backed fetcher (against a local HTTP stand-in)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes.aio.client import ApiClient, Configuration

from dra_driver.kubeletplugin import ClaimError, ClaimRef, KubeClaimFetcher, claim_to_prepare

from .helpers import DRIVER, NODE, make_claim

REF = ClaimRef("ns", "c", "u1")


def test_selects_results_of_this_driver_and_pool() -> None:
    mine = {"request": "a", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    claim = make_claim(
        "u1",
        "c",
        "ns",
        results=[
            mine,
            {"request": "b", "driver": "net.example.com", "pool": NODE, "device": "nic-0"},
            {"request": "c", "driver": DRIVER, "pool": "node-b", "device": "gpu-0"},
        ],
    )
    item = claim_to_prepare(REF, claim, DRIVER, NODE)
    assert item.results == (mine,)
    assert item.ref == REF
    assert len(claim_to_prepare(REF, claim, DRIVER, None).results) == 2


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (None, "not found"),
        (make_claim("other", "c", "ns"), "replaced"),
        (make_claim("u1", "c", "ns", allocated=False), "not allocated"),
        (
            make_claim(
                "u1",
                "c",
                "ns",
                results=[{"request": "a", "driver": "x.dev", "pool": NODE, "device": "d"}],
            ),
            "no devices allocated by driver gpu.dra.dev in pool node-a",
        ),
    ],
)
def test_rejects(claim: dict[str, Any] | None, message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        claim_to_prepare(REF, claim, DRIVER, NODE)


@pytest.fixture
async def api() -> AsyncIterator[tuple[dict[str, tuple[int, Any]], ApiClient]]:
    """A stand-in API server: path -> (status, JSON body)."""
    routes: dict[str, tuple[int, Any]] = {}

    async def handle(request: web.Request) -> web.Response:
        status, body = routes.get(request.path, (404, {"kind": "Status", "message": "nope"}))
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = Configuration(host=f"http://127.0.0.1:{port}")
    client = ApiClient(config)
    try:
        yield routes, client
    finally:
        await client.close()
        await runner.cleanup()


PATH = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"


async def test_fetcher_returns_raw_json(api: tuple[dict[str, tuple[int, Any]], ApiClient]) -> None:
    routes, client = api
    claim = make_claim("u1", "c", "ns")
    claim["status"]["allocation"]["devices"]["results"][0]["unknownFutureField"] = {"x": 1}
    routes[PATH] = (200, claim)
    got = await KubeClaimFetcher(client).get_claim("ns", "c")
    assert got == claim  # unconverted: fields unknown to the client survive


async def test_fetcher_not_found(api: tuple[dict[str, tuple[int, Any]], ApiClient]) -> None:
    _, client = api
    assert await KubeClaimFetcher(client).get_claim("ns", "c") is None


async def test_fetcher_error_carries_api_message(
    api: tuple[dict[str, tuple[int, Any]], ApiClient],
) -> None:
    routes, client = api
    routes[PATH] = (403, {"kind": "Status", "message": "forbidden: no RBAC"})
    with pytest.raises(ClaimError, match=r"HTTP 403: forbidden: no RBAC"):
        await KubeClaimFetcher(client).get_claim("ns", "c")
