"""When the controller's reconcile rounds run."""

from __future__ import annotations

import asyncio
import random

from dra_driver.resourceslice.controller import SliceController
from tests.unit.fakeapi import NODES, SLICES, Cluster, serving
from tests.unit.kubeserver import plain_client
from tests.unit.resourceslice.test_counter_layout import NODE, counted_pool
from tests.unit.resourceslice.test_planner import DRIVER


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
