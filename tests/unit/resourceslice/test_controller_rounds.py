"""When the controller's reconcile rounds run."""

from __future__ import annotations

import asyncio
import copy
import random

from aiohttp import web

from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.pool import slice_name
from dra_driver.resourceslice.rawapi import SLICES_PATH
from tests.unit.fakeapi import NODES, SLICES, ApiStatus, Cluster, serving
from tests.unit.kubeserver import plain_client
from tests.unit.resourceslice.test_counter_layout import NODE, counted_pool
from tests.unit.resourceslice.test_planner import DRIVER, device, pool_of


async def test_the_first_round_publishes_without_waiting_for_the_debounce() -> None:
    """The debounce coalesces bursts of changes; a starting agent has none, and its devices
    should not wait for it before the scheduler can see them."""
    cluster = Cluster(random.Random(0))
    cluster.create(NODES, {"metadata": {"name": NODE}})
    async with serving(cluster) as server, plain_client(server) as client:
        controller = SliceController(client, driver=DRIVER, node_name=NODE, debounce=30)
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(counted_pool())

            def published() -> int:
                return sum(len(s["spec"].get("devices") or ()) for s in cluster.list(SLICES))

            for _ in range(500):
                if published():
                    break
                await asyncio.sleep(0.02)
            assert published() == 1
            # The rounds after it wait for the debounce as before: the write's echo and the
            # round that verifies it are coalesced.
            await asyncio.sleep(0.5)
            assert not controller.synced
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_writer_undoing_every_write_slows_the_writes_down() -> None:
    """Another writer that changes our slice back after every write (a second controller,
    an old agent of another name) must not get a write from us every debounce: the pool
    settling in between does not end the row of rounds, so the backoff takes over."""
    cluster = Cluster(random.Random(0))
    cluster.create(NODES, {"metadata": {"name": NODE}})
    name = slice_name(NODE, DRIVER, 0)
    undos: set[asyncio.Task[None]] = set()

    async def undo() -> None:
        await asyncio.sleep(0.05)  # after our verifying round has found the pool settled
        theirs = copy.deepcopy(cluster.get(SLICES, "", name))
        assert theirs is not None
        theirs["spec"]["devices"][0]["attributes"]["model"] = {"string": "theirs"}
        cluster.update(SLICES, theirs)

    async def write(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        try:
            if request.method == "POST":
                stored = cluster.create(SLICES, body)
            else:
                stored = cluster.update(SLICES, body)
        except ApiStatus as err:
            return web.json_response(err.body(), status=err.code)
        task = asyncio.create_task(undo())
        undos.add(task)
        task.add_done_callback(undos.discard)
        return web.json_response(stored, status=201 if request.method == "POST" else 200)

    async with serving(cluster) as server, plain_client(server) as client:
        server.routes[("POST", SLICES_PATH)] = write
        server.routes[("PUT", f"{SLICES_PATH}/{name}")] = write
        controller = SliceController(client, driver=DRIVER, node_name=NODE, debounce=0.01)
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(pool_of([device(0)], node=NODE))
            await asyncio.sleep(4)
        finally:
            task.cancel()
            await asyncio.gather(task, *undos, return_exceptions=True)
    # Four eager rounds, then pauses of about 0.4, 0.75, 1.5 and 3 s: about eight writes.
    # Alternating with the other writer every round would have made about fifty.
    assert 5 <= controller.writes <= 12, controller.writes
