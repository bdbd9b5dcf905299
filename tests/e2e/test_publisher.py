"""The ResourceSlice publisher against a real kube-apiserver (and the garbage collector).

Each test creates its own Node object through the API (no kubelet is needed to publish slices)
and runs a :class:`SliceController` for it inside the test's event loop.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from devenv.localcluster import ClusterError, LocalCluster
from dra_driver.kube import KubeClient
from dra_driver.kubeletplugin.sockets import answers
from dra_driver.resourceslice import DesiredPool, SliceController, contents_for, delete_pool_slices
from dra_driver.resourceslice.pool import slice_name
from dra_driver.resourceslice.publisher import Publisher
from dra_driver.resourceslice.rawapi import NODES_PATH, SLICES_PATH, RawApi
from dra_driver.resourceslice.store import field_selector

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
DRIVER = "gpu.dra.dev"


def device(i: int, memory: str = "80Gi") -> JSON:
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "index": {"int": i},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "driverVersion": {"version": "550.54.15"},
        },
        "capacity": {"memory": {"value": memory}},
    }


def pool_for(node: str, count: int = 4, memory: str = "80Gi") -> DesiredPool:
    devices = [device(i, memory) for i in range(count)]
    # Two groups -> two slices, so a single-slice repair is distinguishable from a republish.
    half = count // 2
    return DesiredPool(
        DRIVER, node, node, contents_for([], groups=[devices[:half], devices[half:]])
    )


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float, interval: float = 0.05
) -> float:
    """Wait until ``check`` passes; return how long it took."""
    start = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - start
        if time.monotonic() - start > within:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(interval)


@pytest.fixture
def raw(kube_client: KubeClient) -> RawApi:
    return RawApi(kube_client)


async def create_node(raw: RawApi, name: str) -> JSON:
    """POST a bare Node (the driver never writes Nodes; only these tests do)."""
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    response = await raw.api_client.request("POST", NODES_PATH, body=body)
    assert response.ok, response.body
    created: JSON = response.json()
    return created


async def delete_node(raw: RawApi, name: str) -> None:
    """DELETE a Node; one already gone is fine."""
    response = await raw.api_client.request("DELETE", f"{NODES_PATH}/{name}")
    assert response.ok or response.status == 404, response.body


@pytest.fixture
async def node(raw: RawApi) -> AsyncIterator[JSON]:
    name = f"pub-{uuid.uuid4().hex[:8]}"
    created = await create_node(raw, name)
    yield created
    await delete_node(raw, name)
    await delete_pool_slices(raw, name, DRIVER)


async def slices_of(raw: RawApi, node_name: str) -> list[JSON]:
    listing = await raw.list_slices(field_selector(node_name, DRIVER))
    return sorted(listing["items"], key=lambda o: o["metadata"]["name"])


@asynccontextmanager
async def running(controller: SliceController, desired: DesiredPool) -> AsyncIterator[None]:
    task = asyncio.create_task(controller.run())
    try:
        await controller.set_pool(desired)
        async with asyncio.timeout(20):
            await controller.wait_synced()
        yield
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def make_controller(api: KubeClient, node_name: str) -> SliceController:
    return SliceController(api, driver=DRIVER, node_name=node_name)


def content(objs: list[JSON]) -> list[tuple[str, int, int, list[str]]]:
    return [
        (
            o["metadata"]["name"],
            o["spec"]["pool"]["generation"],
            o["spec"]["pool"]["resourceSliceCount"],
            [d["name"] for d in o["spec"]["devices"]],
        )
        for o in objs
    ]


async def test_publish_and_update(kube_client: KubeClient, raw: RawApi, node: JSON) -> None:
    name = node["metadata"]["name"]
    controller = make_controller(kube_client, name)
    async with running(controller, pool_for(name)):
        objs = await slices_of(raw, name)
        assert [c[1:] for c in content(objs)] == [
            (1, 2, ["gpu-0", "gpu-1"]),
            (1, 2, ["gpu-2", "gpu-3"]),
        ]
        for obj in objs:
            assert obj["spec"]["nodeName"] == name
            assert obj["spec"]["pool"]["name"] == name
            assert obj["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": name,
                    "uid": node["metadata"]["uid"],
                    "controller": True,
                }
            ]
        assert controller.writes == 2
        assert controller.dropped_fields == frozenset()

        # Growing the pool past one more slice republishes at a new generation.
        await controller.set_pool(pool_for(name, count=6))
        async with asyncio.timeout(10):
            await controller.wait_synced()
        objs = await slices_of(raw, name)
        assert [c[1:3] for c in content(objs)] == [(2, 2), (2, 2)]
        assert sum(len(o["spec"]["devices"]) for o in objs) == 6


async def test_hand_deleted_slice_is_restored_within_2s(
    kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    name = node["metadata"]["name"]
    controller = make_controller(kube_client, name)
    async with running(controller, pool_for(name)):
        before = content(await slices_of(raw, name))
        victim = before[0][0]
        assert await raw.delete_slice(victim)

        async def restored() -> bool:
            return content(await slices_of(raw, name)) == before

        took = await eventually(restored, within=2.0)
        print(f"slice restored after {took:.2f} s")


async def test_kubelet_style_wipe_is_restored_within_2s(
    kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    """The kubelet deletes a driver's slices with one DeleteCollection by field selector."""
    name = node["metadata"]["name"]
    controller = make_controller(kube_client, name)
    async with running(controller, pool_for(name)):
        response = await raw.api_client.request(
            "DELETE", SLICES_PATH, query=[("fieldSelector", field_selector(name, DRIVER))]
        )
        assert response.status == 200, response.body

        async def republished() -> bool:
            objs = await slices_of(raw, name)
            return len(objs) == 2 and {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {2}

        await eventually(republished, within=2.0)


async def test_hand_edited_slice_is_restored(
    kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    name = node["metadata"]["name"]
    controller = make_controller(kube_client, name)
    async with running(controller, pool_for(name)):
        objs = await slices_of(raw, name)
        edited = objs[1]
        edited["spec"]["devices"][0]["attributes"]["productName"] = {"string": "tampered"}
        edited["spec"]["devices"].pop()
        await raw.replace_slice(edited, "someone-else")

        async def restored() -> bool:
            now = await slices_of(raw, name)
            dev = now[1]["spec"]["devices"]
            return len(dev) == 2 and dev[0]["attributes"]["productName"]["string"] != "tampered"

        await eventually(restored, within=2.0)
        # One slice repaired in place: the pool keeps its generation.
        assert {o["spec"]["pool"]["generation"] for o in await slices_of(raw, name)} == {1}


async def test_a_slice_given_another_controller_gets_ours_back(
    kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    """Someone made another object the controller of a slice (ours gone): the API server
    allows one controller, so the repair keeps theirs as a plain owner instead of sending an
    update the server refuses, again and again."""
    name = node["metadata"]["name"]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"own-{name}"}}
    response = await raw.api_client.request("POST", "/api/v1/namespaces", body=namespace)
    assert response.ok, response.body
    theirs = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "name": f"own-{name}",
        "uid": response.json()["metadata"]["uid"],
    }
    controller = make_controller(kube_client, name)
    try:
        async with running(controller, pool_for(name)):
            edited = (await slices_of(raw, name))[1]
            edited["metadata"]["ownerReferences"] = [{**theirs, "controller": True}]
            await raw.replace_slice(edited, "someone-else")

            async def restored() -> bool:
                refs = (await slices_of(raw, name))[1]["metadata"]["ownerReferences"]
                return [r["uid"] for r in refs if r.get("controller")] == [node["metadata"]["uid"]]

            await eventually(restored, within=2.0)
            refs = (await slices_of(raw, name))[1]["metadata"]["ownerReferences"]
            assert {**theirs, "controller": False} in refs
    finally:
        await raw.api_client.request("DELETE", f"/api/v1/namespaces/own-{name}")


async def test_a_slice_name_held_by_another_nodes_slice_is_reported_then_published(
    kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    """A ResourceSlice of another node holds the name of one of ours: our watch cannot see
    it, so every create conflicts. The agent says once which object to delete (not an info
    line per retry, forever); once it is gone, the pool is published."""
    from structlog.testing import capture_logs

    name = node["metadata"]["name"]
    other = await create_node(raw, f"{name}-b")
    squatter = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(name, DRIVER, 0)},
        "spec": {
            "driver": DRIVER,
            "nodeName": other["metadata"]["name"],
            "pool": {"name": "squatter", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "x"}],
        },
    }
    await raw.create_slice(squatter, "someone-else")
    try:
        with capture_logs() as logs:
            controller = make_controller(kube_client, name)
            task = asyncio.create_task(controller.run())
            try:
                await controller.set_pool(pool_for(name))
                await asyncio.sleep(3)
                assert not controller.synced
                taken = [e for e in logs if "is taken by a ResourceSlice" in e["event"]]
                assert [e["log_level"] for e in taken][:1] == ["error"], logs
                assert [e["log_level"] for e in taken[1:]] == ["debug"] * (len(taken) - 1)
                assert not [e for e in logs if e["event"].startswith("conflict")]
                assert (
                    f"kubectl delete resourceslice {slice_name(name, DRIVER, 0)}"
                    in (taken[0]["event"])
                )

                await raw.delete_slice(slice_name(name, DRIVER, 0))
                async with asyncio.timeout(20):
                    await controller.wait_synced()
                assert len(await slices_of(raw, name)) == 2
            finally:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
    finally:
        await delete_node(raw, other["metadata"]["name"])


async def test_steady_state_makes_no_writes(
    kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    name = node["metadata"]["name"]
    controller = make_controller(kube_client, name)
    async with running(controller, pool_for(name)):
        writes = controller.writes
        versions = [o["metadata"]["resourceVersion"] for o in await slices_of(raw, name)]
        # Setting an identical pool must not write either.
        await controller.set_pool(pool_for(name))
        await asyncio.sleep(60)
        assert controller.writes == writes
        assert [o["metadata"]["resourceVersion"] for o in await slices_of(raw, name)] == versions
        assert controller.synced


async def test_deleted_node_takes_its_slices_along(
    kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    name = node["metadata"]["name"]
    controller = make_controller(kube_client, name)
    async with running(controller, pool_for(name)):
        assert len(await slices_of(raw, name)) == 2
        await delete_node(raw, name)

        async def gone() -> bool:
            return not await slices_of(raw, name)

        # The garbage collector deletes dependents; the controller must not bring them back
        # for a node that no longer exists.
        await eventually(gone, within=60.0, interval=0.5)
        await asyncio.sleep(2)
        assert not await slices_of(raw, name)


async def test_cleanup_deletes_only_that_node(
    kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    name = node["metadata"]["name"]
    other = await create_node(raw, f"{name}-other")
    other_name = other["metadata"]["name"]
    try:
        for node_name in (name, other_name):
            controller = make_controller(kube_client, node_name)
            async with running(controller, pool_for(node_name)):
                pass
        # Controllers stopped: their slices stay.
        assert len(await slices_of(raw, name)) == 2
        assert await delete_pool_slices(kube_client, name, DRIVER) == 2
        assert await slices_of(raw, name) == []
        assert len(await slices_of(raw, other_name)) == 2
    finally:
        await delete_node(raw, other_name)
        await delete_pool_slices(raw, other_name, DRIVER)


async def test_recovers_after_the_api_server_was_down_for_30s(
    kube_client: KubeClient, raw: RawApi, node: JSON, cluster: LocalCluster
) -> None:
    name = node["metadata"]["name"]
    controller = make_controller(kube_client, name)
    async with running(controller, pool_for(name)):
        await asyncio.to_thread(cluster.stop_apiserver)
        try:
            # Ask for a change while the server is away: it must land once it is back.
            await controller.set_pool(pool_for(name, memory="40Gi"))
            await asyncio.sleep(30)
        finally:
            # Returns once /readyz answers; the publisher must notice on its own.
            await asyncio.to_thread(cluster.start_apiserver)

        async def republished() -> bool:
            try:
                objs = await slices_of(raw, name)
            except Exception:
                return False
            return bool(objs) and all(
                d["capacity"]["memory"]["value"] == "40Gi"
                for o in objs
                for d in o["spec"]["devices"]
            )

        took = await eventually(republished, within=60.0, interval=0.5)
        print(f"republished {took:.1f} s after the API server came back")
        async with asyncio.timeout(10):
            await controller.wait_synced()

        # And it still repairs: the watch is back as well.
        victim = (await slices_of(raw, name))[0]["metadata"]["name"]
        await raw.delete_slice(victim)

        async def restored() -> bool:
            return len(await slices_of(raw, name)) == 2

        await eventually(restored, within=5.0)
    # The control plane's own informers are not under test: spare later tests their relist
    # backoff after the outage.
    await asyncio.to_thread(cluster.restart_controllers)


# Gates switched off in a second, short-lived control plane, with the gates that depend on them.
_GATES_OFF = (
    "DRAPartitionableDevices",
    "DRADeviceBindingConditions",
    "DRAPartitionableDevicesType",
    "DRADeviceCompatibilityGroups",
    "DRAConsumableCapacity",
    "DRAFractionalCapacityRange",
)


@pytest.fixture(scope="module")
def gated_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """A control plane whose API server drops partitionable-device, capacity and binding
    condition fields."""
    # Only the gates this release has: naming an unknown one stops the API server.
    off = ",".join(f"{gate}=false" for gate in _GATES_OFF if cluster.gate_stage(gate))
    gated = LocalCluster(
        binary=cluster.binary,
        apiserver_extra_args=(f"--feature-gates={off}",),
        controllers=("garbage-collector-controller",),
    )
    try:
        gated.start()
    except ClusterError as err:
        pytest.skip(f"cannot start an API server with {off}: {err}")
    try:
        yield gated
    finally:
        gated.stop()


def partitioned_pool(node: str) -> DesiredPool:
    shared = [{"name": "gpu-0-counters", "counters": {"multiprocessors": {"value": "7"}}}]
    devices = [
        {
            "name": f"gpu-0-mig-1g-{i}",
            "attributes": {"profile": {"string": "1g.10gb"}},
            "capacity": {
                "memory": {
                    "value": "10Gi",
                    "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi"}},
                }
            },
            "allowMultipleAllocations": True,
            "consumesCounters": [
                {"counterSet": "gpu-0-counters", "counters": {"multiprocessors": {"value": "1"}}}
            ],
            "bindingConditions": ["MIGDeviceReady"],
            "bindingFailureConditions": ["MIGDeviceFailed"],
        }
        for i in range(2)
    ]
    return DesiredPool(DRIVER, node, node, contents_for(devices, counter_sets=shared))


async def test_dropped_fields_are_reported_once_and_not_fought_over(
    gated_cluster: LocalCluster,
) -> None:
    async with await KubeClient.create(str(gated_cluster.kubeconfig)) as api:
        raw = RawApi(api)
        name = f"gated-{uuid.uuid4().hex[:8]}"
        await create_node(raw, name)
        reported: list[frozenset[str]] = []
        controller = SliceController(api, driver=DRIVER, node_name=name, on_dropped=reported.append)
        async with running(controller, partitioned_pool(name)):
            assert controller.dropped_features == {
                "DRAPartitionableDevices",
                "DRAConsumableCapacity",
                "DRADeviceBindingConditions",
            }
            assert controller.dropped_fields >= {
                "sharedCounters",
                "devices[].bindingConditions",
                "devices[].bindingFailureConditions",
                "devices[].consumesCounters",
                "devices[].allowMultipleAllocations",
                "devices[].capacity.*.requestPolicy",
            }
            assert set().union(*reported) == controller.dropped_features
            writes = controller.writes
            await asyncio.sleep(3)
            assert controller.writes == writes, "the controller keeps rewriting dropped fields"

            # The driver's fallback: publish whole devices only.
            await controller.set_pool(pool_for(name))
            async with asyncio.timeout(10):
                await controller.wait_synced()
            objs = await slices_of(raw, name)
            assert sorted(d["name"] for o in objs for d in o["spec"]["devices"]) == [
                f"gpu-{i}" for i in range(4)
            ]


async def test_a_feature_the_node_does_not_declare_is_given_up_like_dropped_fields(
    cluster: LocalCluster, kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    """The API server refuses node-allocatable resources on a node whose kubelet does not
    declare the feature (this Node has no status at all): the controller reports the gate as
    it reports dropped fields, and the pool without them is published."""
    if why := cluster.feature_off("DRANodeAllocatableResources"):
        pytest.skip(f"no node-allocatable resources: {why}")
    if cluster.minor < 37:
        pytest.skip(
            f"Kubernetes {cluster.version} has node-allocatable resources in its alpha shape "
            "(nodeAllocatableResourceMappings); the driver publishes the 1.37 one"
        )
    name = node["metadata"]["name"]
    overhead = {"nodeAllocatableResources": {"memory": {"overhead": {"perPod": "1Gi"}}}}
    reported: list[frozenset[str]] = []

    async def on_dropped(gates: frozenset[str]) -> None:
        reported.append(gates)
        await controller.set_pool(pool_for(name, count=2))

    controller = SliceController(kube_client, driver=DRIVER, node_name=name, on_dropped=on_dropped)
    with_overhead = DesiredPool(
        DRIVER, name, name, contents_for([{**device(i), **overhead} for i in range(2)])
    )
    async with running(controller, with_overhead):
        assert reported == [frozenset({"DRANodeAllocatableResources"})]
        devices = [d for o in await slices_of(raw, name) for d in o["spec"]["devices"]]
        assert sorted(d["name"] for d in devices) == ["gpu-0", "gpu-1"]
        assert not any("nodeAllocatableResources" in d for d in devices)


async def test_forbidden_does_not_crash_or_write(cluster: LocalCluster, node: JSON) -> None:
    # A user without any RBAC grants: every request is forbidden.
    async with await KubeClient.create(
        str(cluster.kubeconfig), headers={"Impersonate-User": "e2e-nobody"}
    ) as api:
        controller = make_controller(api, node["metadata"]["name"])
        task = asyncio.create_task(controller.run())
        try:
            await controller.set_pool(pool_for(node["metadata"]["name"]))
            await asyncio.sleep(3)
            assert not task.done()
            assert controller.writes == 0
            assert not controller.synced
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def test_rolling_update_hands_the_pool_to_the_newer_agent(
    kube_client: KubeClient, raw: RawApi, node: JSON
) -> None:
    """An update with surge that changes the pool: old and new agent run side by side, and
    the old one is stopped last. The pool must end as the new agent publishes it, at once,
    with no fight between the two."""
    name = node["metadata"]["name"]
    old = SliceController(
        kube_client, driver=DRIVER, node_name=name, publisher=Publisher(1, "pod-old")
    )
    new = SliceController(
        kube_client, driver=DRIVER, node_name=name, publisher=Publisher(2, "pod-new")
    )
    old_pool = pool_for(name, count=4)
    new_pool = DesiredPool(DRIVER, name, name, contents_for([device(i) for i in range(3)]))

    def devices(objs: list[JSON]) -> list[str]:
        return sorted(d["name"] for o in objs for d in o["spec"].get("devices", []))

    async with running(old, old_pool):
        async with running(new, new_pool):
            await asyncio.sleep(3)  # time for a fight, if there were one
            objs = await slices_of(raw, name)
            assert devices(objs) == ["gpu-0", "gpu-1", "gpu-2"]
            assert {o["metadata"]["annotations"][f"{DRIVER}/publisher"] for o in objs} == {
                "2/pod-new"
            }
            old_writes = old.writes
            # The old agent republishes (say, after a health event): it still must not write.
            await old.set_pool(pool_for(name, count=4, memory="40Gi"))
            await asyncio.sleep(1)
            assert old.writes == old_writes
            assert not old.synced
        # The new agent stops first here: the old one still leaves the pool alone.
        await asyncio.sleep(1)
        assert old.writes == old_writes
    assert devices(await slices_of(raw, name)) == ["gpu-0", "gpu-1", "gpu-2"]


async def test_a_rolled_back_update_hands_the_pool_back_to_the_older_agent(
    kube_client: KubeClient, raw: RawApi, node: JSON, tmp_path: Path
) -> None:
    """A surge update rolled back: the new pod, which took the pool over, is removed and
    the old one stays. Its stamp is left on the slices; the old agent, finding the new one's
    registration socket gone, publishes its own pool again."""
    name = node["metadata"]["name"]
    registration = tmp_path / "new-reg.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(registration))
    listener.listen(1)
    old = SliceController(
        kube_client,
        driver=DRIVER,
        node_name=name,
        publisher=Publisher(1, "pod-old"),
        publisher_alive=lambda other: answers(registration),
        publisher_check=0.5,
    )
    new = SliceController(
        kube_client, driver=DRIVER, node_name=name, publisher=Publisher(2, "pod-new")
    )
    new_pool = DesiredPool(DRIVER, name, name, contents_for([device(i) for i in range(3)]))

    def stamps(objs: list[JSON]) -> set[str]:
        return {o["metadata"]["annotations"][f"{DRIVER}/publisher"] for o in objs}

    try:
        async with running(old, pool_for(name, count=4)):
            async with running(new, new_pool):
                await asyncio.sleep(2)
                assert stamps(await slices_of(raw, name)) == {"2/pod-new"}
                assert not old.synced
            listener.close()
            registration.unlink()
            async with asyncio.timeout(10):
                await old.wait_synced()
            objs = await slices_of(raw, name)
            assert stamps(objs) == {"1/pod-old"}
            devices = sorted(d["name"] for o in objs for d in o["spec"]["devices"])
            assert devices == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    finally:
        listener.close()
