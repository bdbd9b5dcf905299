"""Claim device status as applied to the status subresource."""

from __future__ import annotations

from dra_driver.claimreport import DeviceStatus, status_body
from dra_driver.kubeletplugin.interfaces import ClaimRef


def test_status_body() -> None:
    body = status_body(
        ClaimRef("ns", "c", "u1"),
        "gpu.dra.dev",
        "node-1",
        [DeviceStatus("gpu-0", {"uuid": "GPU-1"})],
        "2026-01-01T00:00:00Z",
    )
    assert body["metadata"] == {"name": "c", "namespace": "ns", "uid": "u1"}
    (device,) = body["status"]["devices"]
    assert (device["driver"], device["pool"], device["device"]) == (
        "gpu.dra.dev",
        "node-1",
        "gpu-0",
    )
    assert device["data"] == {"uuid": "GPU-1"}
    assert device["conditions"][0] | {"message": ""} == {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def test_empty_list_clears() -> None:
    assert status_body(ClaimRef("ns", "c", "u"), "d", "p", [], "t")["status"] == {"devices": []}


async def test_reporter_applies_status_and_posts_events() -> None:
    import asyncio

    from dra_driver.claimreport import ClaimReporter
    from dra_driver.events import post_event
    from dra_driver.kube import APPLY_PATCH
    from tests.unit.kubeserver import plain_client, serve

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    async with serve() as server, plain_client(server) as client:
        server.json("PATCH", path, 200, {})
        server.json("POST", "/api/v1/namespaces/ns/events", 201, {})
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.01)
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ClaimRef("ns", "c", "u1"), [DeviceStatus("gpu-0", {"uuid": "GPU-1"})])
        reporter.prepare_failed(ClaimRef("ns", "c", "u1"), "no such GPU")
        for _ in range(100):
            if len(server.seen) == 2:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        # Events about cluster-scoped objects go to "default"; a refusal is reported as False.
        assert not await post_event(client, kind="Node", name="n1", reason="R", message="m")
    (patch,) = [s for s in server.seen if s["method"] == "PATCH"]
    assert patch["headers"]["Content-Type"] == APPLY_PATCH
    assert patch["query"] == [("fieldManager", "gpu.dra.dev"), ("force", "true")]
    assert patch["body"].startswith(b"{")
    event, node_event = [s for s in server.seen if s["method"] == "POST"]
    assert event["path"] == "/api/v1/namespaces/ns/events"
    assert b"PrepareFailed" in event["body"]
    assert node_event["path"] == "/api/v1/namespaces/default/events"


def test_metrics_observer_counts_requests() -> None:
    from dra_driver import metrics

    before = metrics.API_REQUESTS.labels(verb="GET", code="error")._value.get()
    metrics.observe_api_request("GET", "error")
    assert metrics.API_REQUESTS.labels(verb="GET", code="error")._value.get() == before + 1


async def test_status_cleared_before_it_was_written_costs_nothing() -> None:
    import asyncio

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    async with serve() as server, plain_client(server) as client:
        server.json("PATCH", path, 200, {})
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.2)
        task = asyncio.create_task(reporter.run())
        ref = ClaimRef("ns", "c", "u1")
        reporter.set_devices(ref, [DeviceStatus("gpu-0", {"uuid": "GPU-1"})])
        reporter.set_devices(ref, [])  # unprepared within the delay
        assert reporter.pending == 0
        await asyncio.sleep(0.4)
        # A clear for a claim whose status this process did not queue (e.g. after a restart)
        # is still written.
        reporter.set_devices(ref, [])
        for _ in range(100):
            if server.seen:
                break
            await asyncio.sleep(0.02)
        task.cancel()
    (patch,) = server.seen
    assert b'"devices": []' in patch["body"] or b'"devices":[]' in patch["body"]


def test_a_share_of_a_device_is_reported_under_its_share_id() -> None:
    # The API server accepts the status of a device allocated several times only with the
    # allocation's shareID ("must be an allocated device in the claim" otherwise).
    ref = ClaimRef("ns", "c", "u")
    shares = [
        DeviceStatus("gpu-0", {}, ("MIGDeviceReady",), None, "s-1"),
        DeviceStatus("gpu-1", {}),
    ]
    devices = status_body(ref, "d", "p", shares, "t")["status"]["devices"]
    assert devices[0]["shareID"] == "s-1"
    assert "MIGDeviceReady" in [c["type"] for c in devices[0]["conditions"]]
    assert "shareID" not in devices[1]


async def test_devices_the_api_server_already_holds_are_not_written_again() -> None:
    import asyncio
    import json

    from aiohttp import web

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    version = 6

    async def apply(_: web.Request) -> web.Response:
        nonlocal version
        version += 1  # every write moves the claim to a new version
        return web.json_response({"metadata": {"resourceVersion": str(version)}})

    async def writes() -> list[bytes]:
        await asyncio.sleep(0.15)  # the delay, and the write
        return [s["body"] for s in server.seen]

    ref = ClaimRef("ns", "c", "u1")
    gpu0 = [DeviceStatus("gpu-0", {"uuid": "GPU-1"})]
    async with serve() as server, plain_client(server) as client:
        server.routes[("PATCH", path)] = apply
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.02)
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ref, gpu0, "6")
        assert len(await writes()) == 1  # the claim is now at "7"
        # Unprepared, then prepared again from a read at "7" before the clear went out: the
        # API server holds these devices, so neither the clear nor the devices are written.
        reporter.set_devices(ref, [])
        reporter.set_devices(ref, gpu0, "7")
        assert reporter.pending == 0
        # Prepared again at "7" (a kubelet restart): nothing to write.
        reporter.set_devices(ref, gpu0, "7")
        assert len(await writes()) == 1
        # Other devices, or a claim something else changed since: written.
        reporter.set_devices(ref, [DeviceStatus("gpu-1", {"uuid": "GPU-2"})], "7")
        assert len(await writes()) == 2  # now at "8", with gpu-1
        version = 9  # another writer changed the claim
        reporter.set_devices(ref, [DeviceStatus("gpu-1", {"uuid": "GPU-2"})], "9")
        assert len(await writes()) == 3  # "10"
        # Cleared: a read from before the clear ("10") no longer proves the devices are there.
        reporter.set_devices(ref, [])
        assert len(await writes()) == 4  # "11", no devices
        reporter.set_devices(ref, [DeviceStatus("gpu-1", {"uuid": "GPU-2"})], "10")
        bodies = await writes()
        task.cancel()
    assert len(bodies) == 5
    assert [len(json.loads(b)["status"]["devices"]) for b in bodies] == [1, 1, 1, 0, 1]


async def test_a_clear_is_written_when_the_api_server_may_show_the_devices() -> None:
    # The shortcut "cleared before its devices were written" holds only for devices the API
    # server never got: after a write of them (landed, or still in flight) the clear must go
    # out, or the claim shows Ready devices on a node that no longer prepares it.
    import asyncio
    import json

    from aiohttp import web

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    release = asyncio.Event()
    release.set()

    async def apply(_: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"metadata": {"resourceVersion": str(len(server.seen))}})

    async def written(count: int) -> list[int]:
        for _ in range(200):
            if len(server.seen) >= count and release.is_set():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # nothing more follows
        return [len(json.loads(s["body"])["status"]["devices"]) for s in server.seen]

    ref = ClaimRef("ns", "c", "u1")
    gpu0 = [DeviceStatus("gpu-0", {"uuid": "GPU-1"})]
    async with serve() as server, plain_client(server) as client:
        server.routes[("PATCH", path)] = apply
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.02)
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ref, gpu0, "5")
        assert await written(1) == [1]
        # Prepared again from a read that does not prove the devices stand (another writer
        # moved the claim on), then unprepared before that write went out.
        reporter.set_devices(ref, gpu0, "9")
        reporter.set_devices(ref, [])
        assert reporter.pending == 1
        assert await written(2) == [1, 0]
        # Once the clear is written, the shortcut holds again.
        reporter.set_devices(ref, gpu0, "9")
        reporter.set_devices(ref, [])
        assert reporter.pending == 0
        # A write of devices in flight: the clear that follows is written after it.
        release.clear()
        reporter.set_devices(ref, gpu0, "9")
        for _ in range(200):
            if len(server.seen) == 3:
                break
            await asyncio.sleep(0.01)
        reporter.set_devices(ref, gpu0, "11")
        reporter.set_devices(ref, [])
        release.set()
        bodies = await written(4)
        task.cancel()
    assert bodies == [1, 0, 1, 0]


async def test_updates_queued_during_a_round_wait_for_the_next() -> None:
    # Under steady churn the writer must not fall into writing every update as it comes:
    # what is queued while a round writes waits a delay, so it can still be coalesced.
    import asyncio

    from aiohttp import web

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    release = asyncio.Event()

    async def slow_apply(_: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"metadata": {"resourceVersion": "1"}})

    base = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
    async with serve() as server, plain_client(server) as client:
        server.routes[("PATCH", f"{base}/a/status")] = slow_apply
        server.json("PATCH", f"{base}/b/status", 200, {})
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.6)
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ClaimRef("ns", "a", "ua"), [DeviceStatus("gpu-0", {})])
        for _ in range(100):
            if server.seen:
                break
            await asyncio.sleep(0.01)
        reporter.set_devices(ClaimRef("ns", "b", "ub"), [DeviceStatus("gpu-1", {})])
        release.set()
        await asyncio.sleep(0.3)  # the next round starts 0.6 s after this one ends
        assert [s["path"] for s in server.seen] == [f"{base}/a/status"]
        assert reporter.pending == 1
        for _ in range(200):
            if len(server.seen) == 2:
                break
            await asyncio.sleep(0.01)
        task.cancel()
    assert server.seen[1]["path"] == f"{base}/b/status"


async def test_status_the_api_server_cannot_apply_is_written_by_update() -> None:
    # A claim whose allocation's opaque parameters are spelled otherwise than the API server
    # would spell them: the apply is refused ("status.allocation: field cannot be modified
    # once set"); the status is then written whole, the stored spelling kept, and so on for
    # the claim's later writes. A conflict (the claim changed meanwhile) is tried again.
    import asyncio
    import json

    from aiohttp import web

    from dra_driver.claimreport import ClaimReporter
    from dra_driver.rawstatus import PROTOBUF
    from tests.unit.kubeserver import plain_client, serve
    from tests.unit.test_rawstatus import PARAMS, claim_json, claim_protobuf

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    refused = {
        "kind": "Status",
        "code": 422,
        "message": 'ResourceClaim "c" is invalid: status.allocation: Invalid value: null: '
        "field cannot be modified once set",
    }
    conflicts = 1

    async def read(request: web.Request) -> web.Response:
        if request.headers.get("Accept") == PROTOBUF:
            return web.Response(body=claim_protobuf(), content_type=PROTOBUF)
        return web.json_response(claim_json())

    async def update(_: web.Request) -> web.Response:
        nonlocal conflicts
        if conflicts:
            conflicts -= 1
            return web.json_response({"kind": "Status", "code": 409}, status=409)
        return web.json_response({"metadata": {"resourceVersion": "43"}})

    ref = ClaimRef("ns", "c", "uid-1")
    async with serve() as server, plain_client(server) as client:
        server.json("PATCH", f"{path}/status", 422, refused)
        server.routes[("GET", path)] = read
        server.routes[("PUT", f"{path}/status")] = update
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.01)
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ref, [DeviceStatus("gpu-1", {"uuid": "GPU-2"})])
        for _ in range(200):
            if sum(s["method"] == "PUT" for s in server.seen) == 2:
                break
            await asyncio.sleep(0.02)
        first = len(server.seen)
        reporter.set_devices(ref, [])
        for _ in range(200):
            if sum(s["method"] == "PUT" for s in server.seen) == 3:
                break
            await asyncio.sleep(0.02)
        task.cancel()
    methods = [s["method"] for s in server.seen]
    # One apply, refused; then read twice and update, a conflict, again; the clear goes
    # straight to the update.
    assert methods == ["PATCH", *(["GET", "GET", "PUT"] * 3)], methods
    assert first == 7
    puts = [s for s in server.seen if s["method"] == "PUT"]
    assert all(p["query"] == [("fieldManager", "gpu.dra.dev")] for p in puts)
    assert PARAMS in puts[1]["body"]
    written = json.loads(puts[1]["body"])["status"]["devices"]
    assert [(d["driver"], d["device"]) for d in written] == [
        ("other.dev", "d"),
        ("gpu.dra.dev", "gpu-1"),
    ]
    assert written[1]["data"] == {"uuid": "GPU-2"}
    cleared = json.loads(puts[2]["body"])["status"]["devices"]
    assert [d["driver"] for d in cleared] == ["other.dev"]


async def test_flush_writes_what_is_pending_at_shutdown_within_its_time() -> None:
    """At shutdown the status the last prepares queued is written at once (the loop that
    waits out the write delay is cancelled by then), and a server that does not answer
    holds the shutdown no longer than asked."""
    import asyncio

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    async with serve() as server, plain_client(server) as client:
        server.json("PATCH", path, 200, {})
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=60)
        reporter.set_devices(ClaimRef("ns", "c", "u1"), [DeviceStatus("gpu-0", {"uuid": "GPU-1"})])
        await reporter.flush(5.0)
        assert [s["path"] for s in server.seen] == [path]
        assert reporter.pending == 0

        stuck = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=60)
        server.seen.clear()

        async def never(*_: object, **__: object) -> tuple[int, str]:
            await asyncio.sleep(3600)
            return 200, "{}"

        stuck._server_side_apply = never  # type: ignore[method-assign]
        stuck.set_devices(ClaimRef("ns", "c", "u1"), [DeviceStatus("gpu-0", {"uuid": "GPU-1"})])
        started = asyncio.get_running_loop().time()
        await stuck.flush(0.2)
        assert asyncio.get_running_loop().time() - started < 2


async def test_a_failed_write_is_tried_again_until_it_lands_without_holding_others() -> None:
    """An API server that refuses writes for longer than a few attempts (a restart, a
    control-plane upgrade) does not lose a claim's status: the scheduler waits for it
    (binding conditions) up to its 10-minute timeout. Meanwhile other claims' writes go on."""
    import asyncio

    from aiohttp import web

    from dra_driver.claimreport import WARN_AFTER, ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    base = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
    failures = WARN_AFTER + 3

    async def flaky(_: web.Request) -> web.Response:
        nonlocal failures
        if failures:
            failures -= 1
            return web.json_response({"message": "etcdserver: leader changed"}, status=503)
        return web.json_response({"metadata": {"resourceVersion": "7"}})

    async with serve() as server, plain_client(server) as client:
        server.routes[("PATCH", f"{base}/a/status")] = flaky
        server.json("PATCH", f"{base}/b/status", 200, {})
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.01, max_backoff=0.05)
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ClaimRef("ns", "a", "ua"), [DeviceStatus("gpu-0", {"uuid": "A"})])
        await asyncio.sleep(0.05)
        reporter.set_devices(ClaimRef("ns", "b", "ub"), [DeviceStatus("gpu-1", {"uuid": "B"})])
        for _ in range(300):
            if failures == 0 and reporter.pending == 0:
                break
            await asyncio.sleep(0.02)
        task.cancel()
    paths = [s["path"] for s in server.seen]
    assert paths.count(f"{base}/a/status") == WARN_AFTER + 4
    assert paths.count(f"{base}/b/status") == 1
    # b was written while a was still being refused, not after a's last attempt.
    assert paths.index(f"{base}/b/status") < len(paths) - 1
    assert reporter.pending == 0


async def test_a_write_awaiting_its_answer_is_still_pending() -> None:
    """A claim whose write is on the wire counts as pending: its status has not landed and
    may yet have to be tried again."""
    import asyncio

    from aiohttp import web

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a/status"
    arrived, answer = asyncio.Event(), asyncio.Event()

    async def held(_: web.Request) -> web.Response:
        arrived.set()
        await answer.wait()
        return web.json_response({"metadata": {"resourceVersion": "3"}})

    async with serve() as server, plain_client(server) as client:
        server.routes[("PATCH", path)] = held
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.01)
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ClaimRef("ns", "a", "ua"), [DeviceStatus("gpu-0", {"uuid": "A"})])
        await asyncio.wait_for(arrived.wait(), 5)
        assert reporter.pending == 1
        answer.set()
        for _ in range(250):
            if reporter.pending == 0:
                break
            await asyncio.sleep(0.02)
        task.cancel()
    assert reporter.pending == 0


async def test_a_newer_update_replaces_the_write_waiting_for_its_retry() -> None:
    """A retry never writes over a newer update: the claim was unprepared (status cleared)
    while its prepared status waited to be tried again."""
    import asyncio

    from aiohttp import web

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a/status"
    bodies: list[bytes] = []

    async def first_fails(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        if len(bodies) == 1:
            return web.json_response({}, status=500)
        return web.json_response({"metadata": {"resourceVersion": "9"}})

    async with serve() as server, plain_client(server) as client:
        server.routes[("PATCH", path)] = first_fails
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.01, max_backoff=0.3)
        task = asyncio.create_task(reporter.run())
        ref = ClaimRef("ns", "a", "ua")
        reporter.set_devices(ref, [DeviceStatus("gpu-0", {"uuid": "A"})])
        for _ in range(100):
            if bodies:
                break
            await asyncio.sleep(0.01)
        reporter.set_devices(ref, [])
        for _ in range(100):
            if len(bodies) == 2 and reporter.pending == 0:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.4)  # past the failed write's backoff
        task.cancel()
    assert len(bodies) == 2
    assert b'"devices":[]' in bodies[1].replace(b" ", b"")


async def test_a_write_waiting_for_its_retry_is_written_at_shutdown() -> None:
    import asyncio

    from aiohttp import web

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a/status"
    answers = [503, 200]

    async def answer(_: web.Request) -> web.Response:
        return web.json_response({}, status=answers.pop(0))

    async with serve() as server, plain_client(server) as client:
        server.routes[("PATCH", path)] = answer
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.01, max_backoff=60)
        reporter._failures["ua"] = 10  # the next retry would be tens of seconds away
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ClaimRef("ns", "a", "ua"), [DeviceStatus("gpu-0", {"uuid": "A"})])
        for _ in range(100):
            if server.seen:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        assert reporter.pending == 1
        await reporter.flush(2.0)
    assert answers == []
    assert reporter.pending == 0


async def test_a_claim_gone_or_refusing_its_status_is_not_tried_again() -> None:
    import asyncio

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    base = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
    async with serve() as server, plain_client(server) as client:
        server.json("PATCH", f"{base}/bad/status", 422, {"message": "status.devices: Invalid"})
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.01, max_backoff=0.02)
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ClaimRef("ns", "gone", "ug"), [DeviceStatus("gpu-0", {})])
        reporter.set_devices(ClaimRef("ns", "bad", "ub"), [DeviceStatus("gpu-1", {})])
        await asyncio.sleep(0.3)
        task.cancel()
    assert sorted(s["path"] for s in server.seen) == [f"{base}/bad/status", f"{base}/gone/status"]
    assert reporter.pending == 0


async def test_a_write_cut_short_by_shutdown_is_written_by_flush() -> None:
    import asyncio

    from aiohttp import web

    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a/status"
    hang = asyncio.Event()

    async def first_hangs(_: web.Request) -> web.Response:
        if not hang.is_set():
            hang.set()
            await asyncio.sleep(3600)
        return web.json_response({"metadata": {"resourceVersion": "3"}})

    async with serve() as server, plain_client(server) as client:
        server.routes[("PATCH", path)] = first_hangs
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1", delay=0.01)
        task = asyncio.create_task(reporter.run())
        reporter.set_devices(ClaimRef("ns", "a", "ua"), [DeviceStatus("gpu-0", {"uuid": "A"})])
        await asyncio.wait_for(hang.wait(), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert reporter.pending == 1
        await reporter.flush(5.0)
    assert reporter.pending == 0
    assert [s["path"] for s in server.seen] == [path, path]


async def test_a_claim_failing_the_same_way_on_every_kubelet_retry_gets_one_event() -> None:
    """The kubelet calls prepare again every few seconds while a pod waits: one Event per
    call (each a new object, count 1) flooded the namespace and `kubectl describe`. The same
    failure of the same claim is posted again only after EVENT_REPEAT; another is at once."""
    import asyncio
    import json

    from dra_driver import claimreport
    from dra_driver.claimreport import ClaimReporter
    from tests.unit.kubeserver import plain_client, serve

    async def posted() -> list[tuple[str, str]]:
        await asyncio.sleep(0.1)
        bodies = [json.loads(s["body"]) for s in server.seen]
        return [(b["involvedObject"]["uid"], b["message"]) for b in bodies]

    a, b = ClaimRef("ns", "a", "ua"), ClaimRef("ns", "b", "ub")
    async with serve() as server, plain_client(server) as client:
        server.json("POST", "/api/v1/namespaces/ns/events", 201, {})
        reporter = ClaimReporter(client, "gpu.dra.dev", "node-1")
        for _ in range(5):
            reporter.prepare_failed(a, "no such GPU")
        reporter.prepare_failed(b, "no such GPU")
        reporter.prepare_failed(a, "config invalid")
        assert sorted(await posted()) == [
            ("ua", "config invalid"),
            ("ua", "no such GPU"),
            ("ub", "no such GPU"),
        ]
        reporter._events[("ua", "no such GPU")] -= claimreport.EVENT_REPEAT  # time passed
        reporter.prepare_failed(a, "no such GPU")
        assert len(await posted()) == 4
