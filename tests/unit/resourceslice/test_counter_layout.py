"""The layout of counter sets follows the API server, also when it is upgraded under the agent."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from aiohttp import web

from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.pool import DesiredPool, contents_for, slice_name
from dra_driver.resourceslice.rawapi import SLICES_PATH
from tests.unit.fakeapi import NODES, SLICES, ApiStatus, Cluster, serving
from tests.unit.kubeserver import plain_client
from tests.unit.resourceslice.test_planner import DRIVER

JSON = dict[str, Any]
NODE = "n"
APART = "must reference a counterSet defined in the ResourceSlice sharedCounters"
TOGETHER = "only one of `sharedCounters` or `devices` is allowed"


def counted_pool(taint: bool = False) -> DesiredPool:
    device: JSON = {
        "name": "gpu-0-mig-1g",
        "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "1"}}}],
    }
    if taint:
        device["taints"] = [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}]
    return DesiredPool(
        DRIVER,
        NODE,
        NODE,
        contents_for([], [{"name": "gpu-0", "counters": {"memory": {"value": "8"}}}], [[device]]),
    )


def refusal(spec: JSON, version: str) -> str | None:
    """What an API server of ``version`` says against a slice (None: it accepts it)."""
    sets = {c["name"] for c in spec.get("sharedCounters") or ()}
    if version == "1.34":
        for device in spec.get("devices") or ():
            if any(c["counterSet"] not in sets for c in device.get("consumesCounters") or ()):
                return f'ResourceSlice.resource.k8s.io "x" is invalid: spec.devices[0]: {APART}'
    elif "sharedCounters" in spec and "devices" in spec:
        return f'ResourceSlice.resource.k8s.io "x" is invalid: spec: Invalid value: "": {TOGETHER}'
    return None


async def test_an_api_server_upgraded_past_1_34_gets_counter_sets_apart_again() -> None:
    """Counter sets go beside their devices for a 1.34 API server; once the control plane is
    upgraded (1.35 refuses that layout), the next change is published apart again."""
    cluster = Cluster(random.Random(0))
    cluster.create(NODES, {"metadata": {"name": NODE}})
    version = ["1.34"]

    async def write(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        message = refusal(body.get("spec") or {}, version[0])
        if message is not None:
            return web.json_response(ApiStatus(422, "Invalid", message).body(), status=422)
        try:
            if request.method == "POST":
                return web.json_response(cluster.create(SLICES, body), status=201)
            return web.json_response(cluster.update(SLICES, body))
        except ApiStatus as err:
            return web.json_response(err.body(), status=err.code)

    async with serving(cluster) as server, plain_client(server) as client:
        server.routes[("POST", SLICES_PATH)] = write
        for i in range(2):
            server.routes[("PUT", f"{SLICES_PATH}/{slice_name(NODE, DRIVER, i)}")] = write
        controller = SliceController(
            client, driver=DRIVER, node_name=NODE, debounce=0.01, backoff_cap=0.2
        )
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(counted_pool())
            async with asyncio.timeout(5):
                await controller.wait_synced()
            assert [bool(s["spec"].get("sharedCounters")) for s in cluster.list(SLICES)] == [True]

            version[0] = "1.35"
            await controller.set_pool(counted_pool(taint=True))
            try:
                async with asyncio.timeout(3):
                    await controller.wait_synced()
            except TimeoutError:
                pass  # the assertions say what is wrong
            stored = cluster.list(SLICES)
            assert controller.synced, "the pool is never published on the upgraded server"
            assert all(refusal(s["spec"], "1.35") is None for s in stored)
            devices = [d for s in stored for d in s["spec"].get("devices") or ()]
            assert [d.get("taints", [{}])[0].get("value") for d in devices] == ["79"]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
