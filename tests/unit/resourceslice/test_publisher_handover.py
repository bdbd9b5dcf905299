"""An older agent takes the pool back once the newer agent it left it to no longer runs."""

from __future__ import annotations

import asyncio
import random
import socket
from pathlib import Path

from dra_driver.kubeletplugin.sockets import answers
from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.pool import render_pool
from dra_driver.resourceslice.publisher import Publisher, recorded_publisher
from tests.unit.fakeapi import NODES, SLICES, Cluster, serving
from tests.unit.kubeserver import plain_client
from tests.unit.resourceslice.test_planner import DRIVER, NODE, device, pool_of

OLD = Publisher(10, "pod-old")
NEW = Publisher(20, "pod-new")
POOL = pool_of([device(0), device(1)])


def test_answers_tells_a_serving_socket_from_a_dead_one(tmp_path: Path) -> None:
    path = tmp_path / "reg.sock"
    assert not answers(path)  # no file
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    # Connections it does not take yet fill its backlog: busy, not gone.
    assert all(answers(path) for _ in range(5))
    server.close()  # the file stays, as after SIGKILL
    assert path.exists() and not answers(path)


async def test_the_older_agent_publishes_again_when_the_newer_one_is_gone() -> None:
    cluster = Cluster(random.Random(0))
    node = cluster.create(NODES, {"metadata": {"name": NODE}})
    for body in render_pool(POOL, 3, None, NEW):
        cluster.create(SLICES, body)
    runs = {NEW.id: True}
    async with serving(cluster) as server, plain_client(server) as client:
        controller = SliceController(
            client,
            driver=DRIVER,
            node_name=NODE,
            debounce=0.01,
            publisher=OLD,
            publisher_alive=lambda p: runs.get(p.id, True),
            publisher_check=0.05,
        )
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(pool_of([device(0), device(1, memory="40Gi")]))
            await asyncio.sleep(0.3)
            # The newer agent runs: its pool stays as it wrote it.
            stored = cluster.list(SLICES)
            assert {recorded_publisher(s, DRIVER) for s in stored} == {NEW}
            assert controller.writes == 0
            runs[NEW.id] = False  # its pod removed (a surge update rolled back)
            async with asyncio.timeout(5):
                await controller.wait_synced()
            stored = cluster.list(SLICES)
            assert {recorded_publisher(s, DRIVER) for s in stored} == {OLD}
            memories = [d["capacity"]["memory"]["value"] for s in stored for d in s["spec"]["devices"]]
            assert sorted(memories) == ["40Gi", "80Gi"]
            owners = [s["metadata"]["ownerReferences"][0]["uid"] for s in stored]
            assert owners == [node["metadata"]["uid"]] * len(stored)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
