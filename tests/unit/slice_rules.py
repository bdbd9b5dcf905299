"""The resource.k8s.io/v1 ResourceSlice validation rules, as a checker for tests.

Written from the API's documented limits so rendered slices can be checked without a server
(the end-to-end suite checks the same slices against the real API server).
"""

from __future__ import annotations

import re
from typing import Any

from dra_driver.resourceapi import LIST_KINDS

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The API's semverRe; its own copy, so the checker does not trust the driver's. ASCII and
# fullmatch as in Go (\d is ASCII only there, and $ does not match before a newline).
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$",
    re.ASCII,
)
# DeviceAttributeMaxValueLength, compared with Go's len(): bytes, not characters.
MAX_VALUE_BYTES = 64
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE]|)$")
# Label names and values (taint keys and values, binding conditions), as IsQualifiedName.
_LABEL_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
# ResourceSliceMaxCounterSets, ...CountersPerCounterSet, ...DeviceCounterConsumptionsPerDevice,
# ...CountersPerDeviceCounterConsumption, DeviceTaintsMaxLength (4 in 1.34),
# BindingConditionsMaxSize and BindingFailureConditionsMaxSize.
MAX_COUNTER_SETS, MAX_COUNTERS, MAX_CONSUMPTIONS, MAX_TAINTS, MAX_CONDITIONS = 8, 32, 2, 16, 4
TAINT_EFFECTS = frozenset({"None", "NoSchedule", "NoExecute"})


def is_subdomain(value: str, limit: int = 253) -> bool:
    return len(value) <= limit and bool(DNS_SUBDOMAIN.match(value))


def check_qualified_name(name: str) -> list[str]:
    domain, sep, ident = name.rpartition("/")
    errors = []
    if sep and not is_subdomain(domain, 63):
        errors.append(f"attribute domain {domain!r} is not a DNS subdomain <= 63")
    if len(ident) > 32 or not C_IDENTIFIER.match(ident):
        errors.append(f"attribute name {ident!r} is not a C identifier <= 32")
    return errors


def _device_is_extended(device: dict[str, Any]) -> bool:
    attrs = device.get("attributes") or {}
    return bool(
        device.get("taints")
        or device.get("consumesCounters")
        or any(k in v for v in attrs.values() for k in LIST_KINDS)
    )


def is_label_name(name: str) -> bool:
    prefix, sep, rest = name.rpartition("/")
    if sep and not is_subdomain(prefix):
        return False
    return len(rest) <= 63 and bool(_LABEL_PART.match(rest))


def check_counters(where: str, counters: Any) -> list[str]:
    """A counter map: 1 to 32 counters, DNS-label names, quantity values."""
    if not isinstance(counters, dict) or not counters:
        return [f"{where}: counters are required"]
    errors = [] if len(counters) <= MAX_COUNTERS else [f"{where}: {len(counters)} counters > 32"]
    for name, counter in counters.items():
        if len(name) > 63 or not DNS_LABEL.match(name):
            errors.append(f"{where}: counter name {name!r} is not a DNS label")
        if not QUANTITY.match(str((counter or {}).get("value", ""))):
            errors.append(f"{where}/{name}: {counter!r} is not a quantity")
    return errors


def check_device_extras(device: dict[str, Any]) -> list[str]:
    """consumesCounters, taints and binding conditions of one device."""
    name = device.get("name", "")
    errors = []
    consumptions = device.get("consumesCounters") or []
    if len(consumptions) > MAX_CONSUMPTIONS:
        errors.append(f"{name}: {len(consumptions)} consumesCounters > {MAX_CONSUMPTIONS}")
    sets = [c.get("counterSet", "") for c in consumptions]
    if len(set(sets)) != len(sets):
        errors.append(f"{name}: duplicate counterSet in consumesCounters")
    for consumption in consumptions:
        counter_set = consumption.get("counterSet", "")
        if len(counter_set) > 63 or not DNS_LABEL.match(counter_set):
            errors.append(f"{name}: counterSet {counter_set!r} is not a DNS label")
        errors += check_counters(f"{name}/{counter_set}", consumption.get("counters"))
    taints = device.get("taints") or []
    if len(taints) > MAX_TAINTS:
        errors.append(f"{name}: {len(taints)} taints > {MAX_TAINTS}")
    for taint in taints:
        if not is_label_name(str(taint.get("key", ""))):
            errors.append(f"{name}: taint key {taint.get('key')!r} is not a label name")
        value = str(taint.get("value", ""))
        if value and (len(value) > 63 or not _LABEL_PART.match(value)):
            errors.append(f"{name}: taint value {value!r} is not a label value")
        if taint.get("effect") not in TAINT_EFFECTS:
            errors.append(f"{name}: taint effect {taint.get('effect')!r} is not supported")
    ready = device.get("bindingConditions") or []
    failed = device.get("bindingFailureConditions") or []
    for field, conditions in (("bindingConditions", ready), ("bindingFailureConditions", failed)):
        if len(conditions) > MAX_CONDITIONS:
            errors.append(f"{name}: {len(conditions)} {field} > {MAX_CONDITIONS}")
        if len(set(conditions)) != len(conditions):
            errors.append(f"{name}: duplicate {field}")
        errors += [
            f"{name}: {field} {c!r} is not a label name" for c in conditions if not is_label_name(c)
        ]
    if bool(ready) != bool(failed):
        errors.append(f"{name}: bindingConditions and bindingFailureConditions go together")
    if set(ready) & set(failed):
        errors.append(f"{name}: bindingFailureConditions overlap bindingConditions")
    return errors


def check_device(device: dict[str, Any]) -> list[str]:
    errors = []
    name = device.get("name", "")
    if len(name) > 63 or not DNS_LABEL.match(name):
        errors.append(f"device name {name!r} is not a DNS label")
    attrs = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attrs) + len(capacity) > 32:
        errors.append(f"{name}: {len(attrs) + len(capacity)} attributes+capacities > 32")
    values = sum(len(v.get(k) or ()) for v in attrs.values() for k in LIST_KINDS)
    values += sum(not any(k in v for k in LIST_KINDS) for v in attrs.values())
    if values > 48:
        errors.append(f"{name}: {values} attribute values > 48")
    for key, value in attrs.items():
        errors += check_qualified_name(key)
        if len(value) != 1:
            errors.append(f"{name}/{key}: exactly one value type, got {sorted(value)}")
        kind, val = next(iter(value.items()))
        if kind in LIST_KINDS:
            if not isinstance(val, list) or not val:
                errors.append(f"{name}/{key}: a list-type attribute must be a non-empty list")
            for item in val:
                errors += check_device({"name": name, "attributes": {key: {kind[:-1]: item}}})
        elif kind == "string" and (not isinstance(val, str) or len(val.encode()) > MAX_VALUE_BYTES):
            errors.append(f"{name}/{key}: string longer than {MAX_VALUE_BYTES} bytes")
        elif kind == "version" and (
            len(val.encode()) > MAX_VALUE_BYTES or not SEMVER.fullmatch(val)
        ):
            errors.append(f"{name}/{key}: {val!r} is not semver <= {MAX_VALUE_BYTES} bytes")
        elif kind == "int" and not isinstance(val, int):
            errors.append(f"{name}/{key}: int expected")
        elif kind == "bool" and not isinstance(val, bool):
            errors.append(f"{name}/{key}: bool expected")
        elif kind not in ("string", "version", "int", "bool"):
            errors.append(f"{name}/{key}: unknown value type {kind}")
    for key, cap in capacity.items():
        errors += check_qualified_name(key)
        if not QUANTITY.match(str(cap.get("value", ""))):
            errors.append(f"{name}/{key}: {cap.get('value')!r} is not a quantity")
        if "requestPolicy" in cap:
            if device.get("allowMultipleAllocations") is not True:
                errors.append(f"{name}/{key}: requestPolicy needs allowMultipleAllocations")
            errors += [f"{name}/{key}: {e}" for e in check_request_policy(cap)]
    return errors


def _int(text: str) -> int:
    """A whole-number quantity as an int (the shapes a driver publishes)."""
    from dra_driver.quantity import NANOS, parse_quantity

    nanos = parse_quantity(text).nanos
    assert nanos % NANOS == 0, text
    return nanos // NANOS


def check_request_policy(cap: dict[str, Any]) -> list[str]:
    """The CapacityRequestPolicy rules: one of validValues/validRange, a default that is valid."""
    policy = cap["requestPolicy"]
    value = _int(str(cap["value"]))
    unknown = set(policy) - {"default", "validValues", "validRange"}
    if unknown:
        return [f"unknown requestPolicy fields {sorted(unknown)}"]
    if "validValues" in policy and "validRange" in policy:
        return ["validValues and validRange are exclusive"]
    if ("validValues" in policy or "validRange" in policy) and "default" not in policy:
        return ["default is required with validValues or validRange"]
    errors = []
    default = _int(str(policy["default"])) if "default" in policy else None
    if "validValues" in policy:
        values = [_int(str(v)) for v in policy["validValues"]]
        if values != sorted(values) or len(values) > 10 or any(v > value for v in values):
            errors.append(f"validValues {values} unsorted, too many or above {value}")
        if default not in values:
            errors.append(f"default {default} not in validValues")
    if "validRange" in policy:
        rng = policy["validRange"]
        if "min" not in rng:
            return ["validRange.min is required"]
        low = _int(str(rng["min"]))
        high = _int(str(rng["max"])) if "max" in rng else None
        assert default is not None
        if low < 0 or low > value or (high is not None and not low <= high <= value):
            errors.append(f"validRange min {low} / max {high} outside 0..{value}")
        if default < low or (high is not None and default > high):
            errors.append(f"default {default} outside the range")
        if "step" in rng:
            step = _int(str(rng["step"]))
            if step <= 0 or low + step > value:
                errors.append(f"step {step} is not positive or one step exceeds {value}")
            elif (default - low) % step or (high is not None and (high - low) % step):
                errors.append("default or max is not a whole number of steps from min")
    return errors


def check_slice(obj: dict[str, Any]) -> list[str]:
    """Every violation of the ResourceSlice validation rules, as messages."""
    errors = []
    if obj.get("apiVersion") != "resource.k8s.io/v1" or obj.get("kind") != "ResourceSlice":
        errors.append("not a resource.k8s.io/v1 ResourceSlice")
    if not is_subdomain(obj["metadata"]["name"]):
        errors.append(f"slice name {obj['metadata']['name']!r} is not a DNS subdomain")
    spec = obj["spec"]
    if not is_subdomain(spec["driver"], 63):
        errors.append("driver is not a DNS subdomain <= 63")
    pool = spec["pool"]
    if len(pool["name"]) > 253 or not all(is_subdomain(p) for p in pool["name"].split("/")):
        errors.append("pool name is not DNS subdomains joined by '/'")
    if pool["generation"] < 0 or pool["resourceSliceCount"] < 1:
        errors.append("bad pool generation or count")
    selectors = [
        k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)
    ]
    if len(selectors) != 1:
        errors.append(f"exactly one node selector, got {selectors}")
    devices = spec.get("devices") or []
    counters = spec.get("sharedCounters") or []
    # The server checks for set fields (non-nil), not for non-empty ones.
    if spec.get("devices") is not None and spec.get("sharedCounters") is not None:
        errors.append("devices and sharedCounters in one slice")
    if len(counters) > MAX_COUNTER_SETS:
        errors.append(f"{len(counters)} counter sets > {MAX_COUNTER_SETS}")
    set_names = [c.get("name", "") for c in counters]
    if len(set(set_names)) != len(set_names):
        errors.append("duplicate counter set names")
    for counter_set in counters:
        set_name = counter_set.get("name", "")
        if len(set_name) > 63 or not DNS_LABEL.match(set_name):
            errors.append(f"counter set name {set_name!r} is not a DNS label")
        errors += check_counters(set_name, counter_set.get("counters"))
    limit = 64 if any(_device_is_extended(d) for d in devices) else 128
    if len(devices) > limit:
        errors.append(f"{len(devices)} devices > {limit}")
    names = [d.get("name") for d in devices]
    if len(set(names)) != len(names):
        errors.append("duplicate device names")
    for device in devices:
        errors += check_device(device) + check_device_extras(device)
    return errors


def check_pool(slices: list[dict[str, Any]]) -> list[str]:
    """Per-slice rules plus the pool-wide ones (count, unique names and devices)."""
    errors = [e for s in slices for e in check_slice(s)]
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    if counts != {len(slices)}:
        errors.append(f"resourceSliceCount {counts} != {len(slices)} slices")
    names = [s["metadata"]["name"] for s in slices]
    if len(set(names)) != len(names):
        errors.append("duplicate slice names")
    devices = [d["name"] for s in slices for d in s["spec"].get("devices") or []]
    if len(set(devices)) != len(devices):
        errors.append("duplicate device names across the pool")
    return errors
