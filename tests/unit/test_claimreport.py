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
