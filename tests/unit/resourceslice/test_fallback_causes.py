"""Feature fallbacks follow the API server's structured answers, not its prose.

When the API server refuses a slice for a feature it (or the node) lacks, the controller gives
the feature's fields up and publishes without them. It must recognise the refusal by what the
API keeps stable (the Status' ``code`` and ``details.causes[].field`` / ``reason``, and the
Node's ``status.declaredFeatures``), so that a reworded message in the next release does not
silently disable the fallback, and a message that merely sounds alike does not trigger it.

The Status bodies below are the real ones (Kubernetes 1.37: ``apierrors.NewInvalid`` for
validation, ``admission.NewForbidden`` from NodeDeclaredFeatureValidator), with messages
reworded or causes swapped. A small stand-in API server answers the controller's requests.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.normalize import strip_paths
from dra_driver.resourceslice.rawapi import SLICES_PATH
from tests.unit.kubeserver import FakeApiServer, plain_client, serve
from tests.unit.resourceslice.test_planner import DRIVER, pool_of

JSON = dict[str, Any]
NODE = "n"
NODE_GATE = "DRANodeAllocatableResources"
LIST_GATE = "DRAListTypeAttributes"
OVERHEAD = {"nodeAllocatableResources": {"memory": {"overhead": {"perPod": "1Gi"}}}}

#: Decides the answer to a write: None stores it, else (code, Status body). Gets the slice and
#: how many writes came before.
Verdict = Callable[[JSON, int], tuple[int, JSON] | None]


def device(i: int, **extra: Any) -> JSON:
    return {"name": f"gpu-{i}", "attributes": {"index": {"int": i}}, **extra}


def forbidden(name: str, message: str) -> JSON:
    """What ``admission.NewForbidden`` answers: no causes, only the object's identity."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "details": {"name": name, "group": "resource.k8s.io", "kind": "resourceslices"},
        "code": 403,
    }


def invalid(name: str, message: str, causes: list[JSON]) -> JSON:
    """What ``apierrors.NewInvalid`` answers: one cause per field error."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Invalid",
        "details": {
            "name": name,
            "group": "resource.k8s.io",
            "kind": "ResourceSlice",
            "causes": causes,
        },
        "code": 422,
    }


class Cluster:
    """The stand-in API server's state: one Node, the stored slices, a verdict on writes."""

    def __init__(self, server: FakeApiServer, node: JSON | None, verdict: Verdict) -> None:
        self.stored: dict[str, JSON] = {}
        self.writes = 0
        self.closing = asyncio.Event()  # ends the watch, so the server stops at once
        self._rv = itertools.count(10)
        self._verdict = verdict
        server.routes[("GET", SLICES_PATH)] = self._list_or_watch
        server.routes[("POST", SLICES_PATH)] = self._write
        server.routes[("GET", f"/api/v1/nodes/{NODE}")] = self._node(node)

    @staticmethod
    def _node(node: JSON | None) -> Callable[[web.Request], Any]:
        async def get(_: web.Request) -> web.Response:
            if node is None:  # the agent may not read Nodes
                return web.json_response(forbidden(NODE, "nodes is forbidden"), status=403)
            return web.json_response(node)

        return get

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response(
                {"items": list(self.stored.values()), "metadata": {"resourceVersion": "1"}}
            )
        response = web.StreamResponse()
        await response.prepare(request)
        await self.closing.wait()  # a quiet watch until the test ends
        return response

    async def _write(self, request: web.Request) -> web.Response:
        body = await request.json()
        answer = self._verdict(body, self.writes)
        self.writes += 1
        if answer is not None:
            code, status = answer
            return web.json_response(status, status=code)
        stored = copy.deepcopy(body)
        stored["metadata"] |= {"uid": f"uid-{self.writes}", "resourceVersion": str(next(self._rv))}
        self.stored[stored["metadata"]["name"]] = stored
        return web.json_response(stored, status=201)


def node_object(declared: list[str] | None) -> JSON:
    node: JSON = {"kind": "Node", "metadata": {"name": NODE, "uid": "uid-node"}}
    if declared is not None:
        node["status"] = {"declaredFeatures": declared}
    return node


@asynccontextmanager
async def published(
    devices: list[JSON], node: JSON | None, verdict: Verdict
) -> AsyncIterator[tuple[SliceController, Cluster]]:
    """Run a controller publishing ``devices``; yields once it settled (or gave up waiting).

    Like a driver, it publishes the pool again without the fields of a feature found missing.
    """

    async def without_dropped(_: frozenset[str]) -> None:
        spec = strip_paths({"devices": devices}, controller.dropped_fields)
        for dev in spec["devices"]:  # an attribute without its list has no value left
            dev["attributes"] = {k: v for k, v in dev["attributes"].items() if v}
        await controller.set_pool(pool_of(spec["devices"], node=NODE))

    async with serve() as server:
        cluster = Cluster(server, node, verdict)
        client = plain_client(server)
        controller = SliceController(
            client,
            driver=DRIVER,
            node_name=NODE,
            debounce=0.01,
            backoff_cap=0.2,
            on_dropped=without_dropped,
        )
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(pool_of(devices, node=NODE))
            try:
                async with asyncio.timeout(5):
                    await controller.wait_synced()
            except TimeoutError:
                pass  # the assertions say what is missing
            yield controller, cluster
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
            cluster.closing.set()


def stored_devices(cluster: Cluster) -> list[JSON]:
    return [d for s in cluster.stored.values() for d in s["spec"].get("devices", [])]


def carries(body: JSON, field: str) -> bool:
    return any(field in d for d in body["spec"].get("devices", []))


# ------------------------------------------------------------- features the node does not declare


def refuse_overhead(message: str, times: int = 1_000_000) -> Verdict:
    """NodeDeclaredFeatureValidator: a slice with node-allocatable resources is forbidden
    (the first ``times`` writes: an admission cache that catches up afterwards)."""

    def verdict(body: JSON, writes: int) -> tuple[int, JSON] | None:
        if carries(body, "nodeAllocatableResources") and writes < times:
            return 403, forbidden(body["metadata"]["name"], message)
        return None

    return verdict


async def test_an_undeclared_feature_is_given_up_whatever_the_message_says() -> None:
    reworded = "admission denied: the kubelet on n lacks DRANodeAllocatableResources"
    async with published(
        [device(0, **OVERHEAD), device(1, **OVERHEAD)],
        node_object([]),  # a kubelet that declares nothing
        refuse_overhead(reworded),
    ) as (controller, cluster):
        assert controller.dropped_features == {NODE_GATE}, "the refusal was not recognised"
        assert controller.synced
        assert sorted(d["name"] for d in stored_devices(cluster)) == ["gpu-0", "gpu-1"]
        assert not any("nodeAllocatableResources" in d for d in stored_devices(cluster))


async def test_a_node_that_declares_the_feature_keeps_it_despite_the_old_message() -> None:
    """A refusal whose text reads like the old one, for a node that does declare the feature
    (say the API server's Node cache lags): not a missing feature, so it is retried."""
    old_text = (
        f'resourceslices.resource.k8s.io "x" is forbidden: node "{NODE}" does not support '
        f"{NODE_GATE} feature"
    )
    async with published(
        [device(0, **OVERHEAD)], node_object([NODE_GATE]), refuse_overhead(old_text, times=2)
    ) as (controller, cluster):
        assert controller.dropped_features == frozenset(), "given up on the message's word"
        assert controller.synced
        assert all("nodeAllocatableResources" in d for d in stored_devices(cluster))


async def test_without_the_node_the_message_is_the_last_resort() -> None:
    """An agent that may not read Nodes has no structured evidence (the admission Status has
    no causes): the message is all there is, and still works."""
    old_text = (
        f'resourceslices.resource.k8s.io "x" is forbidden: node "{NODE}" does not support '
        f"{NODE_GATE} feature"
    )
    async with published([device(0, **OVERHEAD)], None, refuse_overhead(old_text)) as (
        controller,
        cluster,
    ):
        assert controller.dropped_features == {NODE_GATE}
        assert controller.synced
        assert not any("nodeAllocatableResources" in d for d in stored_devices(cluster))


async def test_an_rbac_refusal_for_a_node_that_declares_the_feature_is_an_error() -> None:
    rbac = (
        'resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:x:y" '
        'cannot create resource "resourceslices" in API group "resource.k8s.io"'
    )
    async with published(
        [device(0, **OVERHEAD)], node_object([NODE_GATE]), refuse_overhead(rbac)
    ) as (controller, cluster):
        assert controller.dropped_features == frozenset()
        assert not controller.synced and cluster.stored == {}


# ------------------------------------------------------------- list-type attributes


LISTED = [
    device(0),
    device(1, attributes={"index": {"int": 1}, "migProfiles": {"strings": ["1g.10gb", "7g.80gb"]}}),
]


def refuse_lists(
    message: str, causes: Callable[[int, str], list[JSON]], times: int = 1_000_000
) -> Verdict:
    """An API server without DRAListTypeAttributes: it drops (or does not know) the list
    field, then finds the attribute without a value."""

    def verdict(body: JSON, writes: int) -> tuple[int, JSON] | None:
        if writes >= times:
            return None
        for i, dev in enumerate(body["spec"].get("devices", [])):
            for name, attribute in (dev.get("attributes") or {}).items():
                if "strings" in attribute:
                    return 422, invalid(body["metadata"]["name"], message, causes(i, name))
        return None

    return verdict


def required(i: int, name: str) -> list[JSON]:  # the hand-written validation, 1.34 - 1.36
    return [
        {
            "reason": "FieldValueRequired",
            "message": "Required value: exactly one value must be specified",
            "field": f"spec.devices[{i}].attributes[{name}]",
        }
    ]


def invalid_union(i: int, name: str) -> list[JSON]:  # 1.37 and declarative validation
    return [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "": exactly one value must be specified',
            "field": f"spec.devices[{i}].attributes[{name}]",
        }
    ]


@pytest.mark.parametrize("causes", [required, invalid_union], ids=["required", "invalid"])
async def test_refused_lists_are_given_up_whatever_the_message_says(
    causes: Callable[[int, str], list[JSON]],
) -> None:
    reworded = 'ResourceSlice "x" could not be accepted: one attribute has no value'
    async with published(LISTED, node_object([]), refuse_lists(reworded, causes)) as (
        controller,
        cluster,
    ):
        assert controller.dropped_features == {LIST_GATE}, "the refusal was not recognised"
        assert controller.synced
        attributes = {d["name"]: d["attributes"] for d in stored_devices(cluster)}
        assert attributes == {"gpu-0": {"index": {"int": 0}}, "gpu-1": {"index": {"int": 1}}}


def unrelated_name(i: int, _: str) -> list[JSON]:
    return [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: must be a DNS label",
            "field": f"spec.devices[{i}].name",
        }
    ]


def list_item_too_long(i: int, name: str) -> list[JSON]:
    """An error inside the list (the server knows lists): not a refusal of lists."""
    return [
        {
            "reason": "FieldValueTooLong",
            "message": "Too long: may not be more than 64 bytes",
            "field": f"spec.devices[{i}].attributes[{name}].strings[0]",
        }
    ]


def scalar_attribute(_: int, __: str) -> list[JSON]:
    """The union error, but for an attribute that was sent with a scalar value."""
    return required(0, "index")


@pytest.mark.parametrize(
    "causes",
    [unrelated_name, list_item_too_long, scalar_attribute],
    ids=["other-field", "inside-the-list", "scalar-attribute"],
)
async def test_the_old_message_with_unrelated_causes_keeps_the_lists(
    causes: Callable[[int, str], list[JSON]],
) -> None:
    old_text = (
        'ResourceSlice.resource.k8s.io "x" is invalid: spec.devices[1].attributes[migProfiles]: '
        "Required value: exactly one value must be specified"
    )
    async with published(LISTED, node_object([]), refuse_lists(old_text, causes, times=2)) as (
        controller,
        cluster,
    ):
        assert controller.dropped_features == frozenset(), "given up on the message's word"
        assert controller.synced
        profiles = {d["name"]: d["attributes"].get("migProfiles") for d in stored_devices(cluster)}
        assert profiles["gpu-1"] == {"strings": ["1g.10gb", "7g.80gb"]}
