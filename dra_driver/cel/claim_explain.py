"""Why a ResourceClaim does not allocate: pure functions over the claim, classes, slices, claims.

For each (sub)request: per pool, how many devices each selector leaves (class selectors first,
then the request's, as the scheduler applies them), which of those are allocated to other
claims, and what is left. Then what blocks: a count larger than any pool can offer, an ``All``
request with busy devices, CEL errors, a class that does not exist, and the claim's constraints
(``matchAttribute`` without a value all requests can share, ``distinctAttribute`` with too few
distinct values). Devices of one allocation come from one node, so pools are judged one by one.
As in the scheduler, only each pool's newest generation counts (and only once all its slices
are listed), results with ``adminAccess`` do not make a device busy, and a device is also
unavailable when other claims used up its shared counters or the capacity the request asks for.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.cel.environment import Verdict, device_variables, split_name
from dra_driver.cel.errors import EvalError
from dra_driver.cel.match import (
    Device,
    Request,
    Selector,
    claim_requests,
    claim_spec,
    class_selectors,
    current_slices,
    incomplete_pools,
    match_device,
    slice_devices,
)
from dra_driver.quantity import Quantity, QuantityError, parse_quantity

JSON = dict[str, Any]
#: (driver, pool) -> counter set -> counter -> value in nano units.
Counters = dict[tuple[str, str], dict[str, dict[str, int]]]


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of an object."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _results(claims: Iterable[Mapping[str, Any]], skip: str) -> Iterable[tuple[str, JSON]]:
    # (claim key, allocation result) of the claims other than ``skip``; results with
    # adminAccess do not count as allocated for the scheduler.
    for claim in claims:
        key = object_key(claim)
        if key == skip:
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if isinstance(result, Mapping) and result.get("adminAccess") is not True:
                yield key, dict(result)


def _result_id(result: Mapping[str, Any]) -> str:
    return f"{result.get('driver')}/{result.get('pool')}/{result.get('device')}"


def allocated_devices(claims: Iterable[Mapping[str, Any]], skip: str = "") -> dict[str, str]:
    """Device id (``driver/pool/device``) -> the claim (``ns/name``) it is allocated to.

    Results with ``adminAccess`` are left out: the scheduler does not count them as in use.
    """
    owners: dict[str, str] = {}
    for key, result in _results(claims, skip):
        owners.setdefault(_result_id(result), key)
    return owners


def _nanos(text: Any) -> int | None:
    try:
        return parse_quantity(str(text)).nanos
    except QuantityError:
        return None


def consumed_capacity(
    claims: Iterable[Mapping[str, Any]], skip: str = ""
) -> dict[str, Counter[str]]:
    """Device id -> capacity (nano units) that shared allocations (``shareID``) consume."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for _, result in _results(claims, skip):
        if not result.get("shareID"):
            continue
        for name, value in (result.get("consumedCapacity") or {}).items():
            out[_result_id(result)][str(name)] += _nanos(value) or 0
    return dict(out)


def shared_counters(slices: Iterable[Mapping[str, Any]]) -> Counters:
    """The counter sets of each pool's newest generation."""
    out: Counters = defaultdict(dict)
    for obj in current_slices(slices):
        spec = obj.get("spec") or {}
        key = (str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))
        for counter_set in spec.get("sharedCounters") or []:
            counters = (counter_set or {}).get("counters") or {}
            out[key][str(counter_set.get("name", ""))] = {
                str(n): _nanos((c or {}).get("value")) or 0 for n, c in counters.items()
            }
    return dict(out)


@dataclass
class PoolState:
    """What the cluster's other claims and the slices say beyond the devices themselves."""

    #: (driver, pool) -> why the scheduler ignores it.
    incomplete: Mapping[tuple[str, str], str] = field(default_factory=dict)
    counters: Counters = field(default_factory=dict)
    #: Device id -> capacity consumed by shared allocations of other claims.
    consumed: Mapping[str, Counter[str]] = field(default_factory=dict)


@dataclass
class PoolReport:
    """One pool's devices as seen by one request."""

    driver: str
    pool: str
    node: str
    devices: int
    #: (selector origin, expression, devices left after it), cumulative.
    steps: list[tuple[str, str, int]] = field(default_factory=list)
    matching: list[str] = field(default_factory=list)
    busy: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    #: Matching devices with a NoSchedule/NoExecute taint the request does not tolerate.
    tainted: dict[str, str] = field(default_factory=dict)
    #: Matching devices whose shared counters are used up by devices of other claims.
    counters: dict[str, str] = field(default_factory=dict)
    #: Matching devices without the capacity the request asks for (or left of it).
    capacity: dict[str, str] = field(default_factory=dict)
    #: Why the scheduler ignores the whole pool (not all slices of its generation listed).
    incomplete: str = ""

    @property
    def available(self) -> list[str]:
        """Matching devices the scheduler could allocate to this request."""
        if self.incomplete:
            return []
        blocked = (self.busy, self.tainted, self.counters, self.capacity)
        return [d for d in self.matching if not any(d in b for b in blocked)]

    def to_json(self) -> JSON:
        """A JSON-ready dict."""
        return {
            "driver": self.driver,
            "pool": self.pool,
            "node": self.node,
            "devices": self.devices,
            "selectors": [{"origin": o, "expression": e, "remaining": n} for o, e, n in self.steps],
            "matching": self.matching,
            "allocatedToOthers": self.busy,
            "tainted": self.tainted,
            "countersExhausted": self.counters,
            "capacityMissing": self.capacity,
            "incomplete": self.incomplete,
            "available": self.available,
            "errors": self.errors,
        }


@dataclass
class RequestReport:
    """One (sub)request: its class, count, per-pool results and what blocks it."""

    name: str
    device_class: str
    count: int
    all_devices: bool
    class_found: bool
    pools: list[PoolReport] = field(default_factory=list)
    blocking: list[str] = field(default_factory=list)

    @property
    def satisfiable_pools(self) -> list[PoolReport]:
        """Pools with enough available devices for this request alone."""
        return [p for p in self.pools if _enough(self, p)]

    def to_json(self) -> JSON:
        """A JSON-ready dict."""
        return {
            "name": self.name,
            "deviceClassName": self.device_class,
            "classFound": self.class_found,
            "allocationMode": "All" if self.all_devices else "ExactCount",
            "count": self.count,
            "pools": [p.to_json() for p in self.pools],
            "blocking": self.blocking,
        }


@dataclass
class ClaimReport:
    """The whole explanation of one claim."""

    claim: str
    allocated: list[str]
    requests: list[RequestReport]
    constraints: list[str] = field(default_factory=list)
    #: firstAvailable requests: request name -> its subrequest names, in preference order.
    alternatives: dict[str, list[str]] = field(default_factory=dict)

    @property
    def blocking(self) -> list[str]:
        """Every blocking reason, prefixed with its request (constraints last).

        A firstAvailable request blocks only when none of its subrequests can be satisfied:
        the scheduler then uses the first one that can.
        """
        blocked = {r.name for r in self.requests if r.blocking}
        satisfied = {
            name for name, subs in self.alternatives.items() if any(s not in blocked for s in subs)
        }
        out = []
        for request in self.requests:
            if request.name.partition("/")[0] in satisfied:
                continue
            out += [f"request {request.name}: {b}" for b in request.blocking]
        return out + self.constraints

    def to_json(self) -> JSON:
        """A JSON-ready dict."""
        return {
            "claim": self.claim,
            "allocated": self.allocated,
            "requests": [r.to_json() for r in self.requests],
            "firstAvailable": self.alternatives,
            "constraints": self.constraints,
            "blocking": self.blocking,
        }


def _enough(request: RequestReport, pool: PoolReport) -> bool:
    if request.all_devices:
        # Devices without the requested capacity are left out of "all"; every other matching
        # device must be allocatable.
        wanted = [d for d in pool.matching if d not in pool.capacity]
        return bool(wanted) and not pool.errors and set(wanted) <= set(pool.available)
    return len(pool.available) >= request.count


def explain_request(
    request: Request,
    classes: Mapping[str, Mapping[str, Any]],
    devices: Sequence[Device],
    busy: Mapping[str, str],
    variables: Mapping[str, dict[str, Any] | EvalError],
    state: PoolState | None = None,
) -> RequestReport:
    """The report for one leaf request (an ``exactly`` request or one subrequest)."""
    klass = classes.get(request.device_class)
    report = RequestReport(
        request.name, request.device_class, request.count, request.all_devices, klass is not None
    )
    if klass is None:
        report.blocking.append(f"device class {request.device_class!r} does not exist")
        return report
    selectors = class_selectors(klass)
    selectors += [Selector(f"request {request.name}", e) for e in request.selectors]
    by_pool: dict[tuple[str, str], list[Device]] = defaultdict(list)
    for device in devices:
        by_pool[(device.driver, device.pool)].append(device)
    for (driver, pool), members in sorted(by_pool.items()):
        report.pools.append(
            _pool_report(driver, pool, members, selectors, busy, variables, request, state)
        )
    _judge(report)
    return report


def _pool_report(
    driver: str,
    pool: str,
    members: list[Device],
    selectors: list[Selector],
    busy: Mapping[str, str],
    variables: Mapping[str, dict[str, Any] | EvalError],
    request: Request | None = None,
    state: PoolState | None = None,
) -> PoolReport:
    state = state or PoolState()
    report = PoolReport(driver, pool, members[0].node, len(members))
    report.incomplete = state.incomplete.get((driver, pool), "")
    admin = request is not None and request.admin_access
    tolerations = request.tolerations if request is not None else ()
    left = _counters_left(members, busy, state.counters.get((driver, pool), {}))
    remaining = Counter[str]()
    for device in members:
        prepared = variables.get(device.id)
        if isinstance(prepared, EvalError):
            report.errors[device.name] = str(prepared)
            continue
        result = match_device(device, selectors, prepared, with_explanation=False)
        if result.verdict is Verdict.ERROR:
            report.errors[device.name] = result.reason
            continue
        # A device passes every selector before the one that rejected it.
        passed = len(selectors) if result.selector is None else selectors.index(result.selector)
        for i in range(passed):
            remaining[str(i)] += 1
        if result.verdict is Verdict.MATCH:
            report.matching.append(device.name)
            shared = device.data.get("allowMultipleAllocations") or admin
            if device.id in busy and not shared:
                report.busy[device.name] = busy[device.id]
            taint = _untolerated_taint(device, tolerations)
            if taint:
                report.tainted[device.name] = taint
            in_use = device.id in busy and bool(device.data.get("allowMultipleAllocations"))
            short = "" if in_use else _counters_short(device, left)
            if short:
                report.counters[device.name] = short
            wanted = request.capacity if request is not None else ()
            missing = _capacity_problem(device, wanted, state.consumed.get(device.id))
            if missing:
                report.capacity[device.name] = missing
    report.steps = [(s.origin, s.expression, remaining[str(i)]) for i, s in enumerate(selectors)]
    return report


def _consumption(device: Device) -> Iterable[tuple[str, str, int]]:
    for entry in device.data.get("consumesCounters") or []:
        for name, counter in ((entry or {}).get("counters") or {}).items():
            yield (
                str(entry.get("counterSet", "")),
                str(name),
                _nanos((counter or {}).get("value")) or 0,
            )


def _counters_left(
    members: Sequence[Device], busy: Mapping[str, str], counters: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    """The pool's counters minus what devices allocated to other claims consume."""
    left = {name: dict(values) for name, values in counters.items()}
    for device in members:
        if device.id in busy:
            for counter_set, name, value in _consumption(device):
                if name in left.get(counter_set, {}):
                    left[counter_set][name] -= value
    return left


def _counters_short(device: Device, left: Mapping[str, Mapping[str, int]]) -> str:
    """Which shared counter the device needs more of than other claims left, if any."""
    for counter_set, name, value in _consumption(device):
        have = left.get(counter_set, {}).get(name)
        if have is not None and value > have:
            return f"counter {name} of set {counter_set}: needs {_q(value)}, {_q(have)} left"
    return ""


def _q(nanos: int) -> str:
    return Quantity(nanos).human()


def _consumes(requested: int | None, capacity: Mapping[str, Any], value: int) -> int | None:
    """What a request consumes of one device capacity (the scheduler rounds a request up to
    the capacity's requestPolicy; no request takes the policy's default or everything), or
    None when the policy does not allow it."""
    policy = capacity.get("requestPolicy") or {}
    default = _nanos(policy["default"]) if policy.get("default") is not None else None
    valid_range = policy.get("validRange") or {}
    valid_values = [_nanos(v) for v in policy.get("validValues") or []]
    low = _nanos(valid_range["min"]) if valid_range.get("min") is not None else None
    step = _nanos(valid_range["step"]) if valid_range.get("step") is not None else None
    high = _nanos(valid_range["max"]) if valid_range.get("max") is not None else None
    if requested is None:
        consumed = value if default is None else default
    elif low is not None:
        consumed = max(requested, low)
        if step and requested > low:
            consumed = low + -(-(requested - low) // step) * step
    elif valid_values:
        consumed = next((v for v in valid_values if v is not None and requested <= v), requested)
    else:
        consumed = requested
    if not policy or consumed == default:
        return consumed
    if valid_range:
        if high is not None and consumed > high:
            return None
        if step and (consumed - (low or 0)) % step:
            return None
    elif valid_values and consumed not in valid_values:
        return None
    return consumed


def _capacity_problem(
    device: Device, wanted: Sequence[tuple[str, str]], consumed: Mapping[str, int] | None
) -> str:
    """Why the device cannot give the request the capacity it asks for, if it cannot."""
    capacities = device.data.get("capacity") or {}
    requests = dict(wanted)
    for name in requests:
        if name not in capacities:
            return f"no capacity {name}"
    for name, capacity in capacities.items():
        if not isinstance(capacity, Mapping):
            continue
        value = _nanos(capacity.get("value"))
        if value is None:
            continue
        requested = _nanos(requests[name]) if name in requests else None
        need = _consumes(requested, capacity, value)
        if need is None:
            return f"capacity {name}: {requests.get(name)} is not allowed by its requestPolicy"
        used = (consumed or {}).get(name, 0)
        if used + need > value:
            return f"capacity {name}: needs {_q(need)}, {_q(value - used)} of {_q(value)} left"
    return ""


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    # As resourceclaim.ToleratesTaint: an empty key or effect matches every taint.
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def _untolerated_taint(device: Device, tolerations: Sequence[Mapping[str, Any]]) -> str:
    """``key=value:effect`` of the first taint that keeps the scheduler off the device."""
    for taint in device.data.get("taints") or []:
        if not isinstance(taint, Mapping) or taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"{taint.get('key', '')}{value}:{taint['effect']}"
    return ""


def _judge(report: RequestReport) -> None:
    if report.satisfiable_pools:
        return
    if not report.pools:
        report.blocking.append("no ResourceSlices (no devices) in the cluster")
        return
    errors = sum(len(p.errors) for p in report.pools)
    if errors:
        report.blocking.append(
            f"{errors} device(s) fail CEL evaluation with an error; "
            "the scheduler aborts the allocation attempt"
        )
    best = max(report.pools, key=lambda p: len(p.available))
    matching = max(len(p.matching) for p in report.pools)
    if report.all_devices:
        report.blocking.append(
            "allocationMode All needs every matching device of a pool free; "
            "no pool has matching devices that are all unallocated (and untainted)"
        )
    elif matching == 0:
        report.blocking.append("no device in any pool matches the selectors")
    elif len(best.available) < report.count:
        report.blocking.append(
            f"needs {report.count} device(s) from one pool; the most any pool has available is "
            f"{len(best.available)} (pool {best.pool}: {len(best.matching)} matching, "
            f"{len(best.busy)} allocated to other claims"
            + (f", {len(best.tainted)} tainted without a toleration" if best.tainted else "")
            + (f", {len(best.counters)} without enough shared counters" if best.counters else "")
            + (f", {len(best.capacity)} without the requested capacity" if best.capacity else "")
            + (", the pool is incomplete" if best.incomplete else "")
            + ")"
        )
    report.blocking += list(dict.fromkeys(p.incomplete for p in report.pools if p.incomplete))


def _attribute(device: Device, qualified: str) -> frozenset[tuple[str, Any]]:
    domain, name = split_name(qualified, device.driver)
    attributes = device.data.get("attributes") or {}
    raw = attributes.get(qualified) if "/" in qualified else None
    if raw is None and domain == device.driver:
        raw = attributes.get(name)
    if raw is None:
        raw = attributes.get(f"{domain}/{name}")
    if not isinstance(raw, Mapping):
        return frozenset()
    # A list-type attribute is the set of its values; a scalar, a set of one (DRAListTypeAttributes
    # semantics, which equal the old ones for scalars). The kind keeps 1 and "1" apart.
    for kind in ("int", "bool", "string", "version"):
        if kind in raw:
            return frozenset({(kind, raw[kind])})
        if isinstance(raw.get(kind + "s"), list):
            return frozenset((kind, v) for v in raw[kind + "s"])
    return frozenset()


def explain_constraints(
    spec: Mapping[str, Any],
    reports: Mapping[str, RequestReport],
    devices: Mapping[str, Device],
) -> list[str]:
    """Blocking reasons from ``spec.devices.constraints`` over the requests' available devices."""
    problems = []
    for constraint in (spec.get("devices") or {}).get("constraints") or []:
        names = constraint.get("requests") or _parents(reports)
        if constraint.get("matchAttribute"):
            attribute, check = str(constraint["matchAttribute"]), _match_attribute
        elif constraint.get("distinctAttribute"):
            attribute, check = str(constraint["distinctAttribute"]), _distinct_attribute
        else:
            continue
        # A firstAvailable request takes part with the one subrequest the scheduler picks:
        # the constraint holds when it holds for some choice of subrequests.
        found = []
        for choice in itertools.product(*_leaves(names, reports)):
            found.append(check(attribute, [reports[n] for n in choice], devices) if choice else "")
            if not found[-1]:
                break
        if found and found[-1]:
            problems.append(found[0])
    return problems


def _parents(reports: Mapping[str, RequestReport]) -> list[str]:
    return list(dict.fromkeys(r.partition("/")[0] for r in reports))


def _leaves(names: Iterable[str], reports: Mapping[str, RequestReport]) -> list[list[str]]:
    # Per named request, the leaves it may be satisfied by: itself, or one of its subrequests.
    out = []
    for name in names:
        leaves = [r for r in reports if r == name or r.startswith(name + "/")]
        if leaves:
            out.append(leaves)
    return out


def _nodes(reports: Sequence[RequestReport]) -> set[tuple[str, str]]:
    return {(p.driver, p.pool) for r in reports for p in r.pools}


def _available(report: RequestReport, pool_key: tuple[str, str]) -> list[str]:
    for pool in report.pools:
        if (pool.driver, pool.pool) == pool_key:
            return pool.available
    return []


def _needed(report: RequestReport, pool_key: tuple[str, str]) -> int:
    """How many devices the request takes from the pool: all available ones in mode All."""
    return max(1, len(_available(report, pool_key))) if report.all_devices else report.count


def _match_attribute(
    attribute: str, reports: Sequence[RequestReport], devices: Mapping[str, Device]
) -> str:
    for pool_key in sorted(_nodes(reports)):
        per_request: list[Counter[Any]] = []
        for report in reports:
            values = Counter[Any]()
            for name in _available(report, pool_key):
                values.update(_attribute(devices[f"{pool_key[0]}/{pool_key[1]}/{name}"], attribute))
            per_request.append(values)
        common = set(per_request[0])
        for values in per_request[1:]:
            common &= set(values)
        needed = [_needed(r, pool_key) for r in reports]
        if any(
            all(v[value] >= n for v, n in zip(per_request, needed, strict=True)) for value in common
        ):
            return ""
    names = ", ".join(r.name for r in reports)
    return (
        f"constraint matchAttribute {attribute} over [{names}]: no pool has enough available "
        "devices sharing one value of it (devices without the attribute never qualify)"
    )


def _distinct_attribute(
    attribute: str, reports: Sequence[RequestReport], devices: Mapping[str, Device]
) -> str:
    needed = sum(r.count for r in reports)
    best = 0
    for pool_key in sorted(_nodes(reports)):
        wanted = sum(_needed(r, pool_key) for r in reports)
        values: set[tuple[str, Any]] = set()
        for report in reports:
            for name in _available(report, pool_key):
                values |= _attribute(devices[f"{pool_key[0]}/{pool_key[1]}/{name}"], attribute)
        if len(values) >= wanted:
            return ""
        if len(values) >= best:
            best, needed = len(values), wanted
    names = ", ".join(r.name for r in reports)
    return (
        f"constraint distinctAttribute {attribute} over [{names}]: needs {needed} distinct "
        f"values, the most any pool offers is {best}"
    )


def explain_claim(
    claim: Mapping[str, Any],
    classes: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
) -> ClaimReport:
    """Explain ``claim`` against the cluster's DeviceClasses, ResourceSlices and claims."""
    by_name = {(c.get("metadata") or {}).get("name", ""): c for c in classes}
    devices = slice_devices(slices)
    claims = list(claims)
    slices = list(slices)
    busy = allocated_devices(claims, skip=object_key(claim))
    state = PoolState(
        incomplete_pools(slices),
        shared_counters(slices),
        consumed_capacity(claims, skip=object_key(claim)),
    )
    prepared: dict[str, dict[str, Any] | EvalError] = {}
    for device in devices:
        try:
            prepared[device.id] = device_variables(device.data, device.driver)
        except EvalError as exc:
            prepared[device.id] = exc
    allocation = (claim.get("status") or {}).get("allocation") or {}
    allocated = [
        f"{r.get('request')}: {r.get('driver')}/{r.get('pool')}/{r.get('device')}"
        for r in (allocation.get("devices") or {}).get("results") or []
    ]
    reports: dict[str, RequestReport] = {}
    alternatives: dict[str, list[str]] = {}
    for request in claim_requests(claim):
        leaves = request.subrequests or (request,)
        if request.subrequests:
            alternatives[request.name] = [s.name for s in request.subrequests]
        for leaf in leaves:
            reports[leaf.name] = explain_request(leaf, by_name, devices, busy, prepared, state)
    by_id = {d.id: d for d in devices}
    constraints = explain_constraints(claim_spec(claim), reports, by_id)
    return ClaimReport(
        object_key(claim), allocated, list(reports.values()), constraints, alternatives
    )
