"""Detect fields the API server silently dropped, and name the feature gate that is likely off.

When a feature gate such as DRAPartitionableDevices is disabled, the API server accepts a
ResourceSlice but removes the fields that belong to the feature. The only way to notice is to
compare what was sent with what was stored.

Some refusals mean the same: a slice refused for a feature the node does not declare, or for
list-type attributes the server does not know. They are recognised by what the API keeps
stable (the Node's ``status.declaredFeatures``, a Status' ``details.causes``), not by the
wording of the message, which may change in any release.
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

#: Features a node declares in ``Node.status.declaredFeatures`` (Kubernetes 1.37) -> the field
#: paths that need them: the API server's NodeDeclaredFeatureValidator admission forbids a slice
#: using them for a node that does not declare the feature.
NODE_FEATURES: Mapping[str, frozenset[str]] = {
    "DRANodeAllocatableResources": frozenset({"devices[].nodeAllocatableResources"}),
}


def declared_features(node: Mapping[str, Any]) -> frozenset[str]:
    """The features a Node declares (none when its kubelet declares nothing)."""
    declared = (node.get("status") or {}).get("declaredFeatures") or ()
    return frozenset(str(f) for f in declared if isinstance(f, str))


def _present(value: Any, tokens: list[str]) -> bool:
    """Whether the path ``tokens`` (``name[]`` for each list element, ``*`` for each map
    value) leads to a field in ``value``."""
    if not tokens:
        return True
    if not isinstance(value, Mapping):
        return False
    head, rest = tokens[0], tokens[1:]
    if head == "*":
        return any(_present(v, rest) for v in value.values())
    each = head.endswith("[]")
    name = head[:-2] if each else head
    if name not in value:
        return False
    if each:
        return isinstance(value[name], list) and any(_present(v, rest) for v in value[name])
    return _present(value[name], rest)


def undeclared_paths(spec: Mapping[str, Any], declared: Iterable[str]) -> frozenset[str]:
    """The field paths of ``spec`` whose feature the node does not declare: what a
    refusal (403) of the slice for that node is about, to be left out like dropped fields."""
    have = set(declared)
    normalized = normalize_spec(spec)  # empty fields do not count as used
    return frozenset(
        path
        for feature, paths in NODE_FEATURES.items()
        if feature not in have
        for path in paths
        if _present(normalized, path.split("."))
    )


#: How NodeDeclaredFeatureValidator words its refusal (1.37). Its Status has no causes (only
#: the slice's name, group and kind), so when the Node cannot be read the words are all there
#: is; see :func:`refused_paths`.
_NODE_LACKS = re.compile(r'node "[^"]*" does not support (\w+) feature')


def refused_paths(message: str) -> frozenset[str]:
    """The last resort for a refusal (403) when the Node's declared features are unknown (the
    agent may not read Nodes): the field paths of the feature the message names, else none.

    With the Node at hand, :func:`undeclared_paths` decides, whatever the message says.
    """
    match = _NODE_LACKS.search(message)
    if match is None:
        return frozenset()
    return NODE_FEATURES.get(match.group(1), frozenset())


#: Cause reasons (``metav1.CauseType``, stable API values) of an attribute left without a
#: value: ``field.Required`` of the hand-written validation (1.34 to 1.36), ``field.Invalid``
#: of 1.37's and of declarative validation ("exactly one value must be specified").
_NO_VALUE = frozenset({"FieldValueRequired", "FieldValueInvalid"})

#: The field path of one attribute, as ``field.Path`` renders it.
_ATTRIBUTE_FIELD = re.compile(r"spec\.devices\[(\d+)\]\.attributes\[([^\]]+)\]")


def status_causes(status: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(reason, field)`` of each cause in a Status body's ``details.causes``."""
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, Mapping) else None
    return [
        (str(c.get("reason") or ""), str(c.get("field") or ""))
        for c in causes or ()
        if isinstance(c, Mapping)
    ]


def refused_list_attributes(status: Mapping[str, Any], spec: Mapping[str, Any]) -> frozenset[str]:
    """The list-attribute paths of ``spec`` that an API server without DRAListTypeAttributes
    refused (422): it drops the list fields (gate off) or does not know them (before 1.36),
    then finds those attributes without a value and names each in a cause of its Status.

    Decided by the causes alone (the field is an attribute sent with a list, the reason says
    it has no value), never by the message.
    """
    devices = spec.get("devices") or []
    found: set[str] = set()
    for reason, field in status_causes(status):
        match = _ATTRIBUTE_FIELD.fullmatch(field)
        if reason not in _NO_VALUE or match is None:
            continue
        index, name = int(match.group(1)), match.group(2)
        if index >= len(devices) or not isinstance(devices[index], Mapping):
            continue
        attribute = (devices[index].get("attributes") or {}).get(name)
        if not isinstance(attribute, Mapping):
            continue
        found.update(f"devices[].attributes.*.{kind}" for kind in LIST_KINDS if kind in attribute)
    return frozenset(found)


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
    if sent_spec == stored_spec:
        return frozenset()  # stored as sent (the usual answer): nothing can be missing
    found: set[str] = set()
    _walk(normalize_spec(sent_spec), normalize_spec(stored_spec), "", "", found)
    return frozenset(found)


def describe_dropped(paths: Iterable[str]) -> dict[str, list[str]]:
    """Group dropped field paths by the feature gate that likely caused them."""
    by_gate: dict[str, list[str]] = {}
    for path in sorted(paths):
        by_gate.setdefault(feature_gate_for(path), []).append(path)
    return by_gate
