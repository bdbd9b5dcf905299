"""Detect fields the API server silently dropped, and name the feature gate that is likely off.

When a feature gate such as DRAPartitionableDevices is disabled, the API server accepts a
ResourceSlice but removes the fields that belong to the feature. The only way to notice is to
compare what was sent with what was stored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from dra_driver.resourceapi import LIST_KINDS
from dra_driver.resourceslice.normalize import NAMED_MAPS, normalize_spec

#: Field path (as produced by :func:`find_dropped`) -> the feature gate that guards it.
FEATURE_GATES: Mapping[str, str] = {
    "sharedCounters": "DRAPartitionableDevices",
    "perDeviceNodeSelection": "DRAPartitionableDevices",
    "devices[].consumesCounters": "DRAPartitionableDevices",
    "devices[].nodeName": "DRAPartitionableDevices",
    "devices[].nodeSelector": "DRAPartitionableDevices",
    "devices[].allNodes": "DRAPartitionableDevices",
    "devices[].taints": "DRADeviceTaints",
    "devices[].allowMultipleAllocations": "DRAConsumableCapacity",
    "devices[].capacity.*.requestPolicy": "DRAConsumableCapacity",
    "devices[].bindsToNode": "DRADeviceBindingConditions",
    "devices[].bindingConditions": "DRADeviceBindingConditions",
    "devices[].bindingFailureConditions": "DRADeviceBindingConditions",
    "devices[].nodeAllocatableResources": "DRANodeAllocatableResources",
    **{f"devices[].attributes.*.{kind}": "DRAListTypeAttributes" for kind in LIST_KINDS},
}

UNKNOWN_GATE = "unknown (is the API server older than this driver?)"

#: How the API server refuses a slice whose feature the node does not declare (Kubernetes
#: 1.37: the kubelet lists what it supports in Node.status.declaredFeatures).
_NODE_LACKS = re.compile(r'node "[^"]*" does not support (\w+) feature')


def refused_paths(message: str) -> frozenset[str]:
    """The field paths of the feature an API server refused because the node does not
    support it (from the error message), to be left out like dropped fields; empty when the
    message says nothing of the kind."""
    match = _NODE_LACKS.search(message)
    if match is None:
        return frozenset()
    return frozenset(p for p, gate in FEATURE_GATES.items() if gate == match.group(1))


_ATTRIBUTE_NAMED = re.compile(r"attributes\[([^\]]+)\]")


def refused_list_attributes(message: str, spec: Mapping[str, Any]) -> frozenset[str]:
    """The list-attribute paths of ``spec`` that an API server without DRAListTypeAttributes
    refused: it drops the list fields (gate off) or does not know them (before 1.36), then
    finds those attributes without a value and names them in its validation error."""
    listed = {
        name: kind
        for device in spec.get("devices") or ()
        for name, attribute in (device.get("attributes") or {}).items()
        for kind in LIST_KINDS
        if isinstance(attribute, Mapping) and kind in attribute
    }
    return frozenset(
        f"devices[].attributes.*.{listed[name]}"
        for name in _ATTRIBUTE_NAMED.findall(message)
        if name in listed
    )


def feature_gate_for(path: str) -> str:
    """Name the feature gate that most likely caused ``path`` to be dropped."""
    return FEATURE_GATES.get(path, UNKNOWN_GATE)


def _walk(sent: Any, stored: Any, path: str, parent_key: str, found: set[str]) -> None:
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return
        for key, value in sent.items():
            token = "*" if parent_key in NAMED_MAPS else key
            child_path = f"{path}.{token}" if path else token
            if key not in stored:
                found.add(child_path)
                continue
            _walk(value, stored[key], child_path, key, found)
    elif isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        # Lists the server keeps in order (devices, counter sets); a length mismatch is not a
        # dropped field but a different object, so it is not reported.
        for sent_item, stored_item in zip(sent, stored, strict=True):
            _walk(sent_item, stored_item, path + "[]", parent_key, found)


def find_dropped(sent_spec: Mapping[str, Any], stored_spec: Mapping[str, Any]) -> frozenset[str]:
    """Return the field paths present in ``sent_spec`` but missing from ``stored_spec``.

    Both specs are normalised first, so empty or false optional fields and server defaults never
    count. Paths use ``[]`` for list elements and ``*`` for keys of attribute, capacity and
    counter maps, e.g. ``devices[].capacity.*.requestPolicy``.
    """
    found: set[str] = set()
    _walk(normalize_spec(sent_spec), normalize_spec(stored_spec), "", "", found)
    return frozenset(found)


def describe_dropped(paths: Iterable[str]) -> dict[str, list[str]]:
    """Group dropped field paths by the feature gate that likely caused them."""
    by_gate: dict[str, list[str]] = {}
    for path in sorted(paths):
        by_gate.setdefault(feature_gate_for(path), []).append(path)
    return by_gate
