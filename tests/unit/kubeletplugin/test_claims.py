"""Claim checks and the API-backed fetcher (against a local HTTP stand-in)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from dra_driver.kube import KubeClient
from dra_driver.kubeletplugin import ClaimRef, KubeClaimFetcher, PrepareError, claim_to_prepare
from tests.unit.kubeserver import FakeApiServer, plain_client, serve

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
    with pytest.raises(PrepareError, match=message):
        claim_to_prepare(REF, claim, DRIVER, NODE)


def _allocated(**devices: Any) -> dict[str, Any]:
    claim = make_claim("u1", "c", "ns")
    claim["status"]["allocation"]["devices"].update(devices)
    return claim


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ({"metadata": "u1"}, "metadata is str, expected an object"),
        ({"metadata": {"uid": "u1"}, "status": ["x"]}, "status is list, expected an object"),
        (
            {"metadata": {"uid": "u1"}, "status": {"allocation": 7}},
            "status.allocation is int, expected an object",
        ),
        (
            {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": "gpu-0"}}},
            "status.allocation.devices is str, expected an object",
        ),
        (_allocated(results="gpu-0"), r"devices.results is str, expected a list"),
        (_allocated(results=["gpu-0"]), r"devices.results\[0\] is str, expected an object"),
        (_allocated(config={"opaque": {}}), r"devices.config is dict, expected a list"),
        (_allocated(config=[None]), r"devices.config\[0\] is NoneType, expected an object"),
    ],
)
def test_wrong_shape_is_a_clear_claim_error(claim: dict[str, Any], message: str) -> None:
    with pytest.raises(PrepareError, match=message):
        claim_to_prepare(REF, claim, DRIVER, NODE)


def test_opaque_of_the_wrong_shape_is_not_ours() -> None:
    claim = _allocated(config=[{"opaque": "x"}])
    assert claim_to_prepare(REF, claim, DRIVER, NODE).config == ()


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, KubeClient]]:
    """A stand-in API server and a client for it."""
    async with serve() as server, plain_client(server) as client:
        yield server, client


PATH = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"


async def test_fetcher_returns_raw_json(api: tuple[FakeApiServer, KubeClient]) -> None:
    server, client = api
    claim = make_claim("u1", "c", "ns")
    claim["status"]["allocation"]["devices"]["results"][0]["unknownFutureField"] = {"x": 1}
    server.json("GET", PATH, 200, claim)
    got = await KubeClaimFetcher(client).get_claim("ns", "c")
    assert got == claim  # unconverted: fields unknown to the client survive


async def test_fetcher_not_found(api: tuple[FakeApiServer, KubeClient]) -> None:
    _, client = api
    assert await KubeClaimFetcher(client).get_claim("ns", "c") is None


async def test_fetcher_error_carries_api_message(api: tuple[FakeApiServer, KubeClient]) -> None:
    server, client = api
    server.json("GET", PATH, 403, {"kind": "Status", "message": "forbidden: no RBAC"})
    with pytest.raises(PrepareError, match=r"HTTP 403: forbidden: no RBAC"):
        await KubeClaimFetcher(client).get_claim("ns", "c")


async def test_list_claims_reads_every_page(api: tuple[FakeApiServer, KubeClient]) -> None:
    from aiohttp import web

    server, client = api
    pages = {
        "": {"items": [make_claim("u1", "a", "ns")], "metadata": {"continue": "t1"}},
        "t1": {"items": [make_claim("u2", "b", "ns"), "junk"], "metadata": {}},
    }

    async def handler(request: web.Request) -> web.Response:
        assert request.query["limit"] == "1"
        return web.json_response(pages[request.query.get("continue", "")])

    server.routes[("GET", "/apis/resource.k8s.io/v1/resourceclaims")] = handler
    claims = await KubeClaimFetcher(client).list_claims(page=1)
    assert [c["metadata"]["uid"] for c in claims] == ["u1", "u2"]


async def test_list_claims_failure_raises(api: tuple[FakeApiServer, KubeClient]) -> None:
    server, client = api
    server.json("GET", "/apis/resource.k8s.io/v1/resourceclaims", 403, {"message": "forbidden"})
    with pytest.raises(PrepareError, match="listing ResourceClaims: HTTP 403: forbidden"):
        await KubeClaimFetcher(client).list_claims()


async def test_deeply_nested_claim_is_a_clear_error(api: tuple[FakeApiServer, KubeClient]) -> None:
    from aiohttp import web

    server, client = api
    depth = 3000  # the API server accepts this much nesting in opaque parameters
    body = '{"metadata":{"uid":"u1"},"x":' + '{"a":' * depth + "1" + "}" * depth + "}"

    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    server.routes[("GET", PATH)] = handler
    with pytest.raises(PrepareError, match="nested too deeply to read"):
        await KubeClaimFetcher(client).get_claim("ns", "c")


async def test_a_deeply_nested_claim_does_not_hide_the_others_in_a_listing(
    api: tuple[FakeApiServer, KubeClient],
) -> None:
    from aiohttp import web

    server, client = api
    depth = 5000  # within the API server's 10 KiB bound on opaque parameters
    deep = '{"metadata":{"uid":"u-deep"},"x":' + '{"a":' * depth + "1" + "}" * depth + "}"
    body = '{"items":[' + deep + ',{"metadata":{"uid":"u2"}}],"metadata":{}}'

    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    server.routes[("GET", "/apis/resource.k8s.io/v1/resourceclaims")] = handler
    claims = await KubeClaimFetcher(client).list_claims()
    assert [c["metadata"]["uid"] for c in claims] == ["u-deep", "u2"]
