"""Evaluate the selectors of a DeviceClass and/or a claim request against devices.

The scheduler checks a device against the class's selectors, then the request's, in order, and
stops at the first that is false (no match) or fails (error); so does :func:`match_device`.
Selectors come from ``spec.selectors[].cel.expression`` of a DeviceClass and from
``spec.devices.requests[]`` of a ResourceClaim (``exactly`` and each ``firstAvailable``
subrequest; the v1beta1 layout with the fields directly on the request works too). A
ResourceClaimTemplate is read through its ``spec.spec``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.cel.environment import (
    Outcome,
    Verdict,
    compile_selector,
    device_variables,
    evaluate,
)
from dra_driver.cel.errors import CompileError, EvalError
from dra_driver.cel.explain import Explanation, explain

JSON = dict[str, Any]


@dataclass(frozen=True)
class Selector:
    """One CEL selector and where it comes from (``class gpu.dra.dev``, ``request gpu``)."""

    origin: str
    expression: str


@dataclass(frozen=True)
class Device:
    """A device of a ResourceSlice, with the slice facts the selectors and reports need."""

    driver: str
    pool: str
    name: str
    data: JSON
    node: str = ""

    @property
    def id(self) -> str:
        """``driver/pool/device``: unique in a cluster, as in allocation results."""
        return f"{self.driver}/{self.pool}/{self.name}"


@dataclass(frozen=True)
class Request:
    """A (sub)request of a claim: its name, class, count and own selectors."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    count: int = 1
    all_devices: bool = False
    subrequests: tuple[Request, ...] = ()
    #: ``adminAccess``: devices allocated to other claims may be allocated again.
    admin_access: bool = False
    #: ``tolerations``: the device taints this request tolerates.
    tolerations: tuple[Mapping[str, Any], ...] = ()
    #: ``capacity.requests``: (capacity name, quantity text) the request consumes of a device.
    capacity: tuple[tuple[str, str], ...] = ()


@dataclass
class DeviceResult:
    """The verdict for one device: the first selector that did not match, and why."""

    device: Device
    verdict: Verdict
    selector: Selector | None = None
    error: str = ""
    explanation: Explanation | None = None

    @property
    def reason(self) -> str:
        """One line: empty for a match."""
        if self.verdict is Verdict.MATCH:
            return ""
        assert self.selector is not None
        if self.verdict is Verdict.ERROR:
            return f"{self.selector.origin}: {self.error}"
        detail = str(self.explanation) if self.explanation else f"{self.selector.expression}"
        return f"{self.selector.origin}: {detail}"

    def to_json(self) -> JSON:
        """A JSON-ready dict."""
        out: JSON = {
            "device": self.device.name,
            "pool": self.device.pool,
            "driver": self.device.driver,
            "node": self.device.node,
            "verdict": self.verdict.value,
        }
        if self.selector is not None:
            out["selector"] = {
                "origin": self.selector.origin,
                "expression": self.selector.expression,
            }
        if self.error:
            out["error"] = self.error
        if self.explanation is not None:
            out["explanation"] = self.explanation.to_json()
        return out


@dataclass
class SelectorSet:
    """The selectors one request (or a class alone) applies, in the scheduler's order."""

    label: str
    selectors: list[Selector] = field(default_factory=list)


def class_selectors(device_class: Mapping[str, Any]) -> list[Selector]:
    """The CEL selectors of a DeviceClass."""
    name = (device_class.get("metadata") or {}).get("name", "?")
    return [
        Selector(f"class {name}", expr)
        for expr in _cel_expressions((device_class.get("spec") or {}).get("selectors"))
    ]


def _cel_expressions(selectors: Any) -> list[str]:
    out = []
    for selector in selectors or []:
        expression = ((selector or {}).get("cel") or {}).get("expression")
        if isinstance(expression, str):
            out.append(expression)
    return out


def claim_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The claim spec of a ResourceClaim, or of a ResourceClaimTemplate (``spec.spec``)."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "ResourceClaimTemplate":
        return spec.get("spec") or {}
    return spec


def _request(raw: Mapping[str, Any], name: str) -> Request:
    mode = raw.get("allocationMode", "ExactCount")
    return Request(
        name=name,
        device_class=str(raw.get("deviceClassName", "")),
        selectors=tuple(_cel_expressions(raw.get("selectors"))),
        count=int(raw.get("count", 1) or 1),
        all_devices=mode == "All",
        admin_access=raw.get("adminAccess") is True,
        tolerations=tuple(t for t in raw.get("tolerations") or [] if isinstance(t, Mapping)),
        capacity=tuple(
            (str(k), str(v)) for k, v in ((raw.get("capacity") or {}).get("requests") or {}).items()
        ),
    )


def claim_requests(obj: Mapping[str, Any]) -> list[Request]:
    """The requests of a claim or claim template; firstAvailable ones carry subrequests."""
    requests: list[Request] = []
    for raw in (claim_spec(obj).get("devices") or {}).get("requests") or []:
        name = str(raw.get("name", ""))
        if raw.get("firstAvailable"):
            subs = tuple(
                _request(sub, f"{name}/{sub.get('name', '')}") for sub in raw["firstAvailable"]
            )
            requests.append(Request(name=name, device_class="", subrequests=subs))
        else:
            requests.append(_request(raw.get("exactly") or raw, name))
    return requests


def selector_sets(
    device_class: Mapping[str, Any] | None,
    claim: Mapping[str, Any] | None,
    classes: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[SelectorSet]:
    """What to evaluate: one set per (sub)request of ``claim``, or the class alone.

    A request's class comes from ``classes`` (by name) or is ``device_class`` when the names
    agree; a request whose class is unknown is evaluated with its own selectors only, and its
    label says so.
    """
    known = dict(classes or {})
    if device_class is not None:
        known.setdefault((device_class.get("metadata") or {}).get("name", ""), device_class)
    if claim is None:
        if device_class is None:
            return []
        name = (device_class.get("metadata") or {}).get("name", "?")
        return [SelectorSet(f"class {name}", class_selectors(device_class))]
    sets = []
    for request in claim_requests(claim):
        for leaf in request.subrequests or (request,):
            klass = known.get(leaf.device_class)
            label = f"request {leaf.name} (class {leaf.device_class or '?'}"
            label += ")" if klass is not None else ", class not found: its selectors skipped)"
            selectors = class_selectors(klass) if klass is not None else []
            selectors += [Selector(f"request {leaf.name}", e) for e in leaf.selectors]
            sets.append(SelectorSet(label, selectors))
    return sets


def match_device(
    device: Device,
    selectors: Sequence[Selector],
    variables: dict[str, Any] | None = None,
    *,
    with_explanation: bool = True,
) -> DeviceResult:
    """Evaluate ``selectors`` in order against one device."""
    if variables is None:
        try:
            variables = device_variables(device.data, device.driver)
        except EvalError as exc:
            first = selectors[0] if selectors else None
            return DeviceResult(device, Verdict.ERROR, first, str(exc))
    for selector in selectors:
        try:
            program = compile_selector(selector.expression)
        except CompileError as exc:
            return DeviceResult(device, Verdict.ERROR, selector, str(exc))
        outcome: Outcome = evaluate(program, variables)
        if outcome.verdict is Verdict.ERROR:
            return DeviceResult(device, Verdict.ERROR, selector, outcome.error)
        if outcome.verdict is Verdict.NO_MATCH:
            why = explain(program, variables, device.driver) if with_explanation else None
            return DeviceResult(device, Verdict.NO_MATCH, selector, explanation=why)
    return DeviceResult(device, Verdict.MATCH)


def prepare(devices: Iterable[Device]) -> list[dict[str, Any] | EvalError]:
    """Each device's CEL variables (or the error converting it), to reuse across selector sets."""
    out: list[dict[str, Any] | EvalError] = []
    for device in devices:
        try:
            out.append(device_variables(device.data, device.driver))
        except EvalError as exc:
            out.append(exc)
    return out


def match_devices(
    devices: Sequence[Device],
    selectors: Sequence[Selector],
    *,
    with_explanation: bool = True,
    prepared: Sequence[dict[str, Any] | EvalError] | None = None,
) -> list[DeviceResult]:
    """Evaluate ``selectors`` against every device; pass ``prepared`` to skip the conversion."""
    variables = prepare(devices) if prepared is None else prepared
    results = []
    for device, prepared_variables in zip(devices, variables, strict=True):
        if isinstance(prepared_variables, EvalError):
            first = selectors[0] if selectors else None
            results.append(DeviceResult(device, Verdict.ERROR, first, str(prepared_variables)))
        else:
            results.append(
                match_device(
                    device, selectors, prepared_variables, with_explanation=with_explanation
                )
            )
    return results


def _pool_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    spec = obj.get("spec") or {}
    return str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", ""))


def _generation(obj: Mapping[str, Any]) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def current_slices(slices: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The slices of each pool's newest generation (the scheduler ignores older ones)."""
    listed = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for obj in listed:
        key = _pool_key(obj)
        newest[key] = max(newest.get(key, _generation(obj)), _generation(obj))
    return [obj for obj in listed if _generation(obj) == newest[_pool_key(obj)]]


def incomplete_pools(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(driver, pool) -> why the scheduler ignores it: fewer slices of its newest generation
    than its ``resourceSliceCount``."""
    found: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for obj in current_slices(slices):
        found.setdefault(_pool_key(obj), []).append(obj)
    out = {}
    for key, members in found.items():
        pool = (members[0].get("spec") or {}).get("pool") or {}
        expected = int(pool.get("resourceSliceCount") or 0)
        if expected and len(members) != expected:
            out[key] = (
                f"pool {key[1]} is incomplete: {len(members)} of {expected} ResourceSlice(s) "
                f"of generation {_generation(members[0])} published; the scheduler ignores "
                "it until all are"
            )
    return out


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> list[Device]:
    """The devices of ResourceSlice objects (JSON) of each pool's newest generation, in slice
    order."""
    devices = []
    for obj in current_slices(slices):
        spec = obj.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        node = str(spec.get("nodeName") or "")
        for raw in spec.get("devices") or []:
            # v1beta1 nests attributes under "basic"; v1 has them on the device.
            data = raw.get("basic") or raw
            devices.append(Device(driver, pool, str(raw.get("name", "")), dict(data), node))
    return devices
