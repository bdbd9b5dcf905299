"""A claim's opaque JSON read from its protobuf form and spelled back verbatim in an update."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver.rawstatus import StoredRaw, status_update, stored_raw


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def msg(number: int, *parts: bytes | str) -> bytes:
    """A length-delimited field holding ``parts`` (messages, or a string's bytes)."""
    payload = b"".join(p.encode() if isinstance(p, str) else p for p in parts)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def num(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


PARAMS = b'{\n  "kind": "GpuConfig", "apiVersion": "gpu.dra.dev/v1alpha1"\n}'
DATA = b'{"z": 1,  "a": "<&>"}'


def claim_protobuf(resource_version: str = "42") -> bytes:
    """A claim as the API server sends it in protobuf: two allocation configs (the first
    opaque with parameters, the second without) and two device status entries (with data
    and without), among fields of every wire type."""
    meta = msg(1, msg(1, "c"), msg(5, "uid-1"), msg(6, resource_version), num(7, 3))
    opaque = msg(1, msg(1, "gpu.dra.dev"), msg(2, msg(1, PARAMS)))
    config_with = msg(2, msg(1, "FromClaim"), msg(2, "gpu"), msg(3, opaque))
    config_without = msg(2, msg(1, "FromClass"), msg(2, "gpu"), msg(3))
    results = msg(1, msg(1, "gpu"), msg(2, "gpu.dra.dev"), msg(3, "node-1"), msg(4, "gpu-0"))
    allocation = msg(1, msg(1, results, config_with, config_without), msg(5, num(1, 1700000000)))
    other = msg(4, msg(1, "other.dev"), msg(2, "p"), msg(3, "d"), msg(5, msg(1, DATA)))
    ours = msg(4, msg(1, "gpu.dra.dev"), msg(2, "node-1"), msg(3, "gpu-0"))
    fixed = bytes([0x79]) + bytes(8) + bytes([0x85, 0x01]) + bytes(4)  # fixed64 15, fixed32 16
    claim = meta + msg(2, msg(1)) + msg(3, allocation, other, ours) + fixed
    type_meta = msg(1, msg(1, "resource.k8s.io/v1"), msg(2, "ResourceClaim"))
    return b"k8s\x00" + type_meta + msg(2, claim) + msg(4, "application/vnd.kubernetes.protobuf")


def claim_json(resource_version: str = "42") -> dict[str, Any]:
    """The same claim as a JSON read shows it: its opaque JSON compacted."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "uid": "uid-1", "resourceVersion": resource_version},
        "spec": {"devices": {}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.dra.dev", "pool": "node-1"},
                    ],
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": ["gpu"],
                            "opaque": {
                                "driver": "gpu.dra.dev",
                                "parameters": json.loads(PARAMS),
                            },
                        },
                        {"source": "FromClass", "requests": ["gpu"]},
                    ],
                },
            },
            "devices": [
                {"driver": "other.dev", "pool": "p", "device": "d", "data": json.loads(DATA)},
                {"driver": "gpu.dra.dev", "pool": "node-1", "device": "gpu-0"},
            ],
        },
    }


def test_stored_raw_reads_the_opaque_json_verbatim() -> None:
    raw = stored_raw(claim_protobuf())
    assert raw == StoredRaw("42", (PARAMS, None), (DATA, None))


def test_stored_raw_of_a_claim_without_status() -> None:
    claim = msg(1, msg(6, "7"))
    assert stored_raw(b"k8s\x00" + msg(2, claim)) == StoredRaw("7", (), ())


@pytest.mark.parametrize(
    "data",
    [
        b'{"kind": "ResourceClaim"}',  # JSON, not protobuf
        b"k8s\x00" + msg(2, b"\x0a\x05ab"),  # a field longer than its message
        b"k8s\x00\x12\x80",  # a varint cut off
        b"k8s\x00" + bytes([0x0B]),  # a group (wire type 3), never in Kubernetes objects
    ],
)
def test_stored_raw_refuses_what_is_not_a_claim(data: bytes) -> None:
    with pytest.raises(ValueError):
        stored_raw(data)


def test_status_update_spells_the_stored_json_and_replaces_our_entries() -> None:
    ours = [{"driver": "gpu.dra.dev", "pool": "node-1", "device": "gpu-1", "data": {"u": 1}}]
    body = status_update(claim_json(), stored_raw(claim_protobuf()), "gpu.dra.dev", "node-1", ours)
    # The stored bytes appear as they are, once each (not compacted, not re-sorted).
    assert body.count(PARAMS) == 1 and body.count(DATA) == 1
    decoded = json.loads(body)
    expected = claim_json()
    expected["status"]["devices"] = [expected["status"]["devices"][0], *ours]
    assert decoded == expected


def test_status_update_clears_only_our_entries() -> None:
    body = status_update(claim_json(), stored_raw(claim_protobuf()), "gpu.dra.dev", "node-1", [])
    assert [d["driver"] for d in json.loads(body)["status"]["devices"]] == ["other.dev"]
    # Another pool of the same driver is not ours to clear.
    body = status_update(claim_json(), stored_raw(claim_protobuf()), "gpu.dra.dev", "node-2", [])
    assert len(json.loads(body)["status"]["devices"]) == 2


def test_status_update_of_a_claim_without_status() -> None:
    claim = {"metadata": {"name": "c", "resourceVersion": "7"}}
    ours = [{"driver": "d", "pool": "p", "device": "x"}]
    body = status_update(claim, StoredRaw("7", (), ()), "d", "p", ours)
    assert json.loads(body)["status"] == {"devices": ours}


@pytest.mark.parametrize(
    "raw",
    [
        StoredRaw("43", (PARAMS, None), (DATA, None)),  # read at another version
        StoredRaw("42", (PARAMS,), (DATA, None)),  # a config more or less
        StoredRaw("42", (PARAMS, None), (DATA,)),  # a device status entry more or less
        StoredRaw("42", (None, None), (DATA, None)),  # parameters in one read only
        StoredRaw("42", (PARAMS, None), (DATA, DATA)),  # data in one read only
    ],
)
def test_status_update_refuses_reads_of_different_claims(raw: StoredRaw) -> None:
    with pytest.raises(ValueError, match="changed in between"):
        status_update(claim_json(), raw, "gpu.dra.dev", "node-1", [])
