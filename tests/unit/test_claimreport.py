"""Claim device status as applied to the status subresource."""

from __future__ import annotations

from dra_driver.claimreport import DeviceStatus, status_body
from dra_driver.kubeletplugin.interfaces import ClaimRef


def test_status_body() -> None:
    body = status_body(ClaimRef("ns", "c", "u1"), "gpu.dra.dev", "node-1", [DeviceStatus("gpu-0", {"uuid": "GPU-1"})], "2026-01-01T00:00:00Z")
    assert body["metadata"] == {"name": "c", "namespace": "ns", "uid": "u1"}
    (device,) = body["status"]["devices"]
    assert (device["driver"], device["pool"], device["device"]) == ("gpu.dra.dev", "node-1", "gpu-0")
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
    shares = [DeviceStatus("gpu-0", {}, ("MIGDeviceReady",), None, "s-1"), DeviceStatus("gpu-1", {})]
    devices = status_body(ref, "d", "p", shares, "t")["status"]["devices"]
    assert devices[0]["shareID"] == "s-1"
    assert "MIGDeviceReady" in [c["type"] for c in devices[0]["conditions"]]
    assert "shareID" not in devices[1]
