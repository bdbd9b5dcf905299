"""RawApi over the API client: paths, query parameters, ApiError and watch streams."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from dra_driver.kube import KubeClient
from dra_driver.resourceslice.cleanup import delete_pool_slices
from dra_driver.resourceslice.rawapi import SLICES_PATH, ApiError, RawApi
from tests.unit.kubeserver import FakeApiServer, plain_client, serve


def slice_obj(name: str, node: str = "n", driver: str = "d") -> dict[str, object]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"driver": driver, "nodeName": node},
    }


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApiServer, KubeClient]]:
    async with serve() as server, plain_client(server) as client:
        yield server, client


async def test_api_error_carries_status_reason_and_retry_after(
    api: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = api
    server.json(
        "POST",
        SLICES_PATH,
        429,
        {"kind": "Status", "reason": "TooManyRequests", "message": "slow down"},
        **{"Retry-After": "3"},
    )
    with pytest.raises(ApiError) as err:
        await RawApi(client).create_slice(slice_obj("s1"), "mgr")
    assert (err.value.status, err.value.reason, err.value.message) == (
        429,
        "TooManyRequests",
        "slow down",
    )
    assert err.value.retry_after == 3.0
    assert (err.value.verb, err.value.resource, err.value.name) == (
        "create",
        "resourceslices",
        "s1",
    )
    assert server.seen[0]["query"] == [("fieldManager", "mgr")]
    assert json.loads(server.seen[0]["body"])["metadata"]["name"] == "s1"


async def test_list_follows_continue_and_delete_is_conditional(
    api: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = api

    async def listing(request: web.Request) -> web.Response:
        if request.query.get("continue") == "next":
            return web.json_response(
                {"items": [slice_obj("b")], "metadata": {"resourceVersion": "9"}}
            )
        return web.json_response({"items": [slice_obj("a")], "metadata": {"continue": "next"}})

    server.routes[("GET", SLICES_PATH)] = listing
    server.json("DELETE", f"{SLICES_PATH}/a", 200, {})
    # b is already gone: 404, not counted, not an error
    assert await delete_pool_slices(client, "n", "d") == 1
    listed = [s for s in server.seen if s["method"] == "GET"]
    assert listed[0]["query"] == [
        ("fieldSelector", "spec.nodeName=n,spec.driver=d"),
        ("limit", "500"),
    ]
    deletes = [json.loads(s["body"]) for s in server.seen if s["method"] == "DELETE"]
    assert deletes[0]["preconditions"] == {"uid": "uid-a"}


async def test_watch_events_and_watch_errors(api: tuple[FakeApiServer, KubeClient]) -> None:
    server, client = api

    async def watch(request: web.Request) -> web.StreamResponse:
        if request.query.get("resourceVersion") == "old":
            return web.json_response(
                {"kind": "Status", "reason": "Expired", "message": "too old"}, status=410
            )
        response = web.StreamResponse()
        await response.prepare(request)
        for event in (
            {"type": "ADDED", "object": slice_obj("a")},
            {"type": "BOOKMARK", "object": {}},
        ):
            await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        return response

    server.routes[("GET", SLICES_PATH)] = watch
    raw = RawApi(RawApi(client))  # a RawApi over a RawApi shares the client
    assert raw.api_client is client
    events = [e async for e in raw.watch_slices("spec.nodeName=n", "5", 60)]
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert ("timeoutSeconds", "60") in server.seen[0]["query"]
    with pytest.raises(ApiError) as err:
        _ = [e async for e in raw.watch_slices("spec.nodeName=n", "old", 60)]
    assert (err.value.status, err.value.verb, err.value.message) == (410, "watch", "too old")


def _nested(depth: int) -> str:
    """A claim whose opaque parameters are ``depth`` levels deep (the API server allows it)."""
    parameters = '{"a":' * depth + "1" + "}" * depth
    return '{"metadata":{"name":"deep","uid":"u-deep"},"spec":{"p":' + parameters + "}}"


async def test_a_deeply_nested_object_does_not_stop_the_watch(
    api: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = api
    path = "/apis/resource.k8s.io/v1/resourceclaims"

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b'{"type":"ADDED","object":' + _nested(5000).encode() + b"}\n")
        await response.write(b'{"type":"ADDED","object":{"metadata":{"name":"plain"}}}\n')
        await response.write_eof()
        return response

    server.routes[("GET", path)] = watch
    limit = sys.getrecursionlimit()
    events = [e async for e in RawApi(client).watch_objects(path, "resourceclaims", "", "1", 60)]
    assert [e["object"]["metadata"]["name"] for e in events] == ["deep", "plain"]
    assert sys.getrecursionlimit() == limit
