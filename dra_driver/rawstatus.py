"""A ResourceClaim's status written back whole, with its opaque JSON spelled as stored.

The API server keeps opaque JSON (an allocation's ``config[].opaque.parameters``, a device
status entry's ``data``) byte for byte as the client that wrote it sent it, and refuses a
status write that changes those bytes in the allocation unless the writer may bind claims
("status.allocation: field cannot be modified once set"). Its apply and patch handlers
encode the stored claim to JSON and back first: apply sorts the keys, every patch removes
the spaces. So the device status of a claim whose parameters came in another spelling (a Go
client's struct with ``kind`` first, a Python client's ``", "`` separators, indented text)
can only be written by an update whose body spells them as stored. JSON reads compact them
too; a protobuf read carries them verbatim, so that is where :func:`stored_raw` takes them
from, and :func:`status_update` builds the update's body from the JSON read and those bytes.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver import protowire

#: Media type of a protobuf read; the answer starts with :data:`_MAGIC`.
PROTOBUF = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"

JSON = dict[str, Any]

# Field numbers of k8s.io/api/resource/v1 and apimachinery's generated.proto (protobuf
# field numbers never change within an API version).
_UNKNOWN_RAW = 2  # runtime.Unknown.raw: the object's own message
_CLAIM_METADATA, _CLAIM_STATUS = 1, 3
_META_RESOURCE_VERSION = 6
_STATUS_ALLOCATION, _STATUS_DEVICES = 1, 4
_ALLOCATION_DEVICES = 1
_DEVICES_CONFIG = 2
_CONFIG_DEVICE_CONFIGURATION = 3  # DeviceAllocationConfiguration's inlined DeviceConfiguration
_DEVICE_CONFIGURATION_OPAQUE = 1
_OPAQUE_PARAMETERS = 2
_DEVICE_STATUS_DATA = 5
_RAW_EXTENSION_RAW = 1


@dataclass(frozen=True)
class StoredRaw:
    """The opaque JSON of a claim's status as the API server holds it."""

    resource_version: str
    #: Each ``status.allocation.devices.config`` entry's parameters, in order (None: none).
    parameters: tuple[bytes | None, ...]
    #: Each ``status.devices`` entry's data, in order (None: none).
    device_data: tuple[bytes | None, ...]


def _all(buf: bytes, number: int) -> list[bytes]:
    """The values of every length-delimited field ``number`` (messages, strings, bytes)."""
    found = protowire.fields(buf)
    return [v for n, wire, v in found if n == number and wire == 2 and isinstance(v, bytes)]


def _last(buf: bytes, number: int) -> bytes | None:
    """The field's bytes (the last occurrence wins, as in protobuf), or None if absent."""
    found = _all(buf, number)
    return found[-1] if found else None


def _raw_extension(message: bytes | None) -> bytes | None:
    if message is None:
        return None
    return _last(message, _RAW_EXTENSION_RAW) or None


def stored_raw(data: bytes) -> StoredRaw:
    """The opaque JSON of a claim read as protobuf (:data:`PROTOBUF`), byte for byte.

    Raises ``ValueError`` for anything else than a Kubernetes protobuf object.
    """
    if not data.startswith(_MAGIC):
        raise ValueError("not a Kubernetes protobuf object")
    claim = _last(data[len(_MAGIC) :], _UNKNOWN_RAW) or b""
    meta = _last(claim, _CLAIM_METADATA) or b""
    status = _last(claim, _CLAIM_STATUS) or b""
    allocation = _last(status, _STATUS_ALLOCATION) or b""
    devices = _last(allocation, _ALLOCATION_DEVICES) or b""
    parameters = []
    for entry in _all(devices, _DEVICES_CONFIG):
        configuration = _last(entry, _CONFIG_DEVICE_CONFIGURATION) or b""
        opaque = _last(configuration, _DEVICE_CONFIGURATION_OPAQUE)
        parameters.append(_raw_extension(_last(opaque, _OPAQUE_PARAMETERS) if opaque else None))
    return StoredRaw(
        resource_version=(_last(meta, _META_RESOURCE_VERSION) or b"").decode(),
        parameters=tuple(parameters),
        device_data=tuple(
            _raw_extension(_last(entry, _DEVICE_STATUS_DATA))
            for entry in _all(status, _STATUS_DEVICES)
        ),
    )


def _configs(claim: Mapping[str, Any]) -> list[JSON]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("config") or [])


def status_update(
    claim: Mapping[str, Any],
    raw: StoredRaw,
    driver: str,
    pool: str,
    ours: Sequence[Mapping[str, Any]],
) -> bytes:
    """The body of a status update of ``claim`` (read as JSON at the version ``raw`` was
    read) that replaces this driver's entries of ``pool`` in ``status.devices`` with
    ``ours`` and keeps everything else, its opaque JSON spelled as stored.

    Raises ``ValueError`` when the two reads do not describe the same claim.
    """
    old = list((claim.get("status") or {}).get("devices") or [])
    configs = _configs(claim)
    version = (claim.get("metadata") or {}).get("resourceVersion")
    if (
        version != raw.resource_version
        or len(configs) != len(raw.parameters)
        or len(old) != len(raw.device_data)
        or any(
            ("parameters" in (c.get("opaque") or {})) != (p is not None)
            for c, p in zip(configs, raw.parameters, strict=True)
        )
        or any(("data" in d) != (r is not None) for d, r in zip(old, raw.device_data, strict=True))
    ):
        raise ValueError("the claim's JSON and protobuf reads differ (it changed in between)")
    body = copy.deepcopy(dict(claim))
    # Each stored value is first a unique placeholder string, then its bytes in the text.
    token = secrets.token_hex(16)
    stored: dict[str, bytes] = {}

    def placeholder(value: bytes) -> str:
        key = f"{token}-{len(stored)}"
        stored[key] = value
        return key

    for config, parameters in zip(_configs(body), raw.parameters, strict=True):
        if parameters is not None:
            config["opaque"]["parameters"] = placeholder(parameters)
    status = body.setdefault("status", {})
    kept = []
    for entry, data in zip(status.get("devices") or [], raw.device_data, strict=True):
        if entry.get("driver") == driver and entry.get("pool") == pool:
            continue
        if data is not None:
            entry["data"] = placeholder(data)
        kept.append(entry)
    status["devices"] = kept + [dict(d) for d in ours]
    text = json.dumps(body, separators=(",", ":")).encode()
    for key, value in stored.items():
        text = text.replace(json.dumps(key).encode(), value, 1)
    return text
