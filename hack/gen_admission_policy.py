#!/usr/bin/env python3
"""Generate the admission policy that checks opaque configs from the agent's own models.

The agent parses the opaque configs of a claim (``dra_driver.gpu.config``) only when the kubelet
prepares it, so a typo used to surface as a pod that cannot start. This generator turns the same
pydantic models into a ValidatingAdmissionPolicy (and its binding) that refuses, when a
ResourceClaim or ResourceClaimTemplate is created, every opaque config addressed to this driver
that the agent would refuse:

- ``apiVersion`` and ``kind`` dispatch (one model per kind, per registered API);
- unknown keys (the models forbid extra keys), required fields, types (strict: no coercion, so
  ``true`` is not 1, ``"50"`` and ``50.0`` are not 50), enums and literals, numeric bounds,
  null only where the model accepts it, maps' and lists' elements;
- quantities (the JSON schema's ``x-dra-quantity``: ``isQuantity()`` and bounds, rounded up
  to a whole unit as the agent reads them);
- the models' rules across fields (``x-dra-rules``: :class:`dra_driver.gpu.config.Rule`,
  whose CEL the agent's validator also states in Python).

Everything comes from ``model_json_schema()``; a schema construct this generator does not know
is an error (so a new model cannot be checked only partly without anyone noticing).

Usage::

    .venv/bin/python hack/gen_admission_policy.py          # write the chart and kustomize files
    .venv/bin/python hack/gen_admission_policy.py --check  # exit 1 when they are stale

A second config API is one more :class:`ConfigApi` in :data:`APIS`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from dra_driver.gpu.config import (  # noqa: E402
    API_GROUP_VERSION,
    QUANTITY_KEY,
    QUOTE_LIMIT,
    RULES_KEY,
    GpuConfig,
    MigDeviceConfig,
)
from dra_driver.gpu.nvidia_config import API_GROUP_VERSION as NVIDIA_API_VERSION  # noqa: E402
from dra_driver.gpu.nvidia_config import NvidiaGpuConfig, NvidiaMigDeviceConfig  # noqa: E402
from dra_driver.quantity import is_quantity, parse_quantity  # noqa: E402
from dra_driver.settings import NVIDIA_DRIVER_NAME  # noqa: E402

KUSTOMIZE_FILE = ROOT / "manifests" / "base" / "opaque-config-policy.yaml"
CHART_FILE = (
    ROOT / "deployments" / "helm" / "dra-driver" / "templates" / "opaque-config-policy.yaml"
)
#: The chart value that renders the policy (on by default).
CHART_VALUE = "opaqueConfigPolicy.enabled"
#: The kustomize base installs the driver under this name (the chart: its driver-name helper).
DEFAULT_DRIVER = "gpu.dra.dev"
NAME_SUFFIX = "opaque-config"


@dataclass(frozen=True)
class ConfigApi:
    """One opaque config API: its ``apiVersion`` and one model per ``kind``.

    ``driver``: the driver name under which configs of this API are accepted; None for
    whatever name the driver is installed under. An API registered for a fixed name (the NVIDIA
    driver's ``resource.nvidia.com/v1beta1`` for ``gpu.nvidia.com``) is accepted only when the
    driver is installed under that name; otherwise its apiVersion is refused like any other.
    """

    api_version: str
    models: tuple[type[BaseModel], ...]
    driver: str | None = None


#: The config APIs the policy checks, in the order their apiVersions are listed in messages.
APIS: tuple[ConfigApi, ...] = (
    ConfigApi(API_GROUP_VERSION, (GpuConfig, MigDeviceConfig)),
    # Compat mode (compat: nvidia): the NVIDIA driver's API under its driver name.
    ConfigApi(
        NVIDIA_API_VERSION,
        (NvidiaGpuConfig, NvidiaMigDeviceConfig),
        driver=NVIDIA_DRIVER_NAME,
    ),
)


class Unsupported(Exception):
    """A schema construct the generator cannot turn into CEL."""


# ------------------------------------------------------------------------------------
# CEL text helpers
# ------------------------------------------------------------------------------------


def lit(value: Any) -> str:
    """A CEL literal of a JSON scalar or a list of them."""
    if isinstance(value, list):
        return "[" + ", ".join(lit(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def at(base: str, key: str) -> str:
    """``base["key"]``: index syntax, so any key works (also CEL's reserved words)."""
    return f"{base}[{lit(key)}]"


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'")
_SELF = re.compile(r"\bself\b")


def bind_self(expression: str, value: str) -> str:
    """``expression`` with the identifier ``self`` (outside string literals) replaced by
    ``value``: the VAP environment has no ``cel.bind``."""
    out, pos = [], 0
    for m in _STRING.finditer(expression):
        out.append(_SELF.sub(f"({value})", expression[pos : m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_SELF.sub(f"({value})", expression[pos:]))
    return "".join(out)


def show(v: str) -> str:
    """CEL for how a message shows the user's value ``v``: strings quoted and cut as the
    agent's ``quote()`` cuts them, scalars as they are, objects and lists by their kind."""
    # A message with a line break is not used by the API server: escape them, as repr does.
    cut = (
        f'(size({v}) > {QUOTE_LIMIT} ? {v}.substring(0, {QUOTE_LIMIT}) + "..." : {v})'
        '.replace("\\n", "\\\\n").replace("\\r", "\\\\r")'
    )
    return (
        f'(type({v}) == string ? "\'" + {cut} + "\'" : type({v}) == null_type ? "null" : '
        f'type({v}) == map ? "an object" : type({v}) == list ? "a list" : string({v}))'
    )


def field_prefix(path: str) -> str:
    """CEL for ``field 'a.b': `` (the agent's wording); ``path`` is a CEL string."""
    return f'"field \'" + {path} + "\': "'


def path_lit(path: Sequence[str]) -> str:
    return lit(".".join(path))


def _words(values: Sequence[Any]) -> str:
    """``'A' or 'B'``, ``'A', 'B' or 'C'``: pydantic's words for literals."""
    shown = [f"'{v}'" if isinstance(v, str) else repr(v) for v in values]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


# ------------------------------------------------------------------------------------
# Checks: one per rule the models state, each with its Python twin
# ------------------------------------------------------------------------------------

Pred = Callable[[Any], bool]


@dataclass(frozen=True)
class Value:
    """How one value is checked: ``cond`` (CEL over ``self``, true when valid), ``message``
    (CEL string over ``self`` and the CEL string ``path``), its Python twin ``holds``."""

    cond: str
    message: Callable[[str], str]  # path (a CEL string expression) -> CEL string expression
    holds: Pred
    text: str  # the message without the value, for the static fallback


@dataclass(frozen=True)
class Check:
    """One validation of the policy: a condition at one path of the parameters of the
    configs of some kinds of one API."""

    api: ConfigApi
    kinds: tuple[str, ...]
    path: tuple[str, ...]  # where the checked value is, from opaque.parameters
    value: Value
    name: str  # what it checks, for tests and failures
    #: True: checks the value at ``path`` when it is there; False: checks the object at
    #: ``path`` when it is a map (unknown keys, required fields, rules).
    present: bool = False
    dispatch: str = "model"  # "apiVersion", "kind" or "model"
    #: Installed under one of these names, the driver accepts other APIs (see ``checks``).
    not_drivers: tuple[str, ...] = ()

    def applies(self, opaque: Mapping[str, Any], driver: str) -> bool:
        """Python twin of the guard: does this check look at ``opaque`` (a config's
        ``opaque`` for ``driver``, the name the driver is installed under)?"""
        if opaque.get("driver") != driver or (self.api.driver not in (None, driver)):
            return False
        if driver in self.not_drivers:
            return False
        params = opaque["parameters"]
        if self.dispatch != "apiVersion":
            if params.get("apiVersion") != self.api.api_version:
                return False
            if self.dispatch == "model" and params.get("kind") not in self.kinds:
                return False
        node: Any = params
        for i, key in enumerate(self.path):
            if not isinstance(node, dict) or key not in node:
                return False
            node = node[key]
            if (i < len(self.path) - 1 or not self.present) and not isinstance(node, dict):
                return False
        return True

    def holds(self, opaque: Mapping[str, Any], driver: str) -> bool:
        """Python twin of the whole validation for one config."""
        if not self.applies(opaque, driver):
            return True
        node: Any = opaque["parameters"]
        for key in self.path:
            node = node[key]
        return self.value.holds(node)

    def guard(self, o: str) -> str:
        """CEL: this check applies to the opaque config ``o`` (known to be for the driver)."""
        parts = []
        if self.api.driver is not None:
            parts.append(f"variables.driver == {lit(self.api.driver)}")
        if self.not_drivers:
            parts.append(f"!(variables.driver in {lit(list(self.not_drivers))})")
        params = f"{o}.parameters"
        if self.dispatch != "apiVersion":
            parts.append(f"{params}.?apiVersion.orValue(null) == {lit(self.api.api_version)}")
            if self.dispatch == "model":
                parts.append(f"{params}.?kind.orValue(null) in {lit(list(self.kinds))}")
        node = params
        for i, key in enumerate(self.path):
            parts.append(f"{lit(key)} in {node}")
            node = at(node, key)
            if i < len(self.path) - 1 or not self.present:
                parts.append(f"type({node}) == map")
        return " && ".join(parts) if parts else "true"

    def accessor(self, o: str) -> str:
        node = f"{o}.parameters"
        for key in self.path:
            node = at(node, key)
        return node

    def expression(self) -> str:
        cond = bind_self(self.value.cond, self.accessor("o"))
        guard = self.guard("o")
        skip = "o == null" if guard == "true" else f"o == null || !({guard})"
        return f"variables.opaques.all(o, {skip} || {cond})"

    def message_expression(self) -> str:
        bad = bind_self(f"!({self.value.cond})", self.accessor("o"))
        where = (
            'variables.configPath + "[" + string(i) + "].opaque.parameters (config for " + '
            'variables.requests[i] + "): "'
        )
        guard = self.guard("o")
        pick = f"o != null && {bad}" if guard == "true" else f"o != null && {guard} && {bad}"
        message = bind_self(self.value.message(path_lit(self.path)), "e[1]")
        return (
            f"variables.opaques.transformList(i, o, {pick}, "
            f"[dyn({where}), dyn({self.accessor('o')})]).map(e, e[0] + ({message}))[0]"
        )

    def static_message(self) -> str:
        return f"an opaque config of this driver is invalid: {self.value.text}"


def _nullable(inner: Value, nullable: bool) -> Value:
    if not nullable:
        return inner
    return Value(
        cond=f"self == null || {inner.cond}",
        message=inner.message,
        holds=lambda v: v is None or inner.holds(v),
        text=inner.text,
    )


def _msg(text: str, show_value: bool = True) -> Callable[[str], str]:
    """A message ``field '<path>': <text>, got <value>``."""

    def make(path: str) -> str:
        tail = f' + ", got " + {show("self")}' if show_value else ""
        return f"{field_prefix(path)} + {lit(text)}{tail}"

    return make


class Walker:
    """Turns one model's JSON schema into checks."""

    def __init__(self, api: ConfigApi, kind: str, schema: Mapping[str, Any]) -> None:
        self.api = api
        self.kind = kind
        self.defs: Mapping[str, Any] = schema.get("$defs", {})
        self.schema = schema
        self.checks: list[Check] = []

    def resolve(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            return {**self.defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        return node

    def add(self, path: tuple[str, ...], value: Value, name: str, present: bool) -> None:
        self.checks.append(Check(self.api, (self.kind,), path, value, name, present))

    def walk(self) -> list[Check]:
        props = self.schema.get("properties", {})
        for key, want in (("apiVersion", self.api.api_version), ("kind", self.kind)):
            if props.get(key, {}).get("const") != want:
                raise Unsupported(f"{self.kind}: {key} must be the constant {want!r}")
        self.object(self.schema, (), skip=("apiVersion", "kind"))
        return self.checks

    def object(
        self, node: Mapping[str, Any], path: tuple[str, ...], skip: Sequence[str] = ()
    ) -> None:
        """Checks of a model at ``path`` (a map there: its own type check is the parent's)."""
        where = ".".join(path) or self.kind
        props: Mapping[str, Any] = node.get("properties", {})
        if node.get("additionalProperties") is not False:
            raise Unsupported(f"{where}: models must forbid unknown keys")
        allowed = list(props)
        self.add(
            path,
            Value(
                cond=f"self.all(k, k in {lit(allowed)})",
                message=lambda p, allowed=allowed: (
                    f"self.filter(k, !(k in {lit(allowed)}))"
                    f".map(k, {field_prefix(_join(p, 'k'))} + "
                    f'"unknown field (allowed: {", ".join(allowed)})")[0]'
                ),
                holds=lambda v, allowed=allowed: all(k in allowed for k in v),
                text=f"unknown field (allowed: {', '.join(allowed)})",
            ),
            f"{where}: unknown keys",
            present=False,
        )
        for key in node.get("required", []):
            if key in skip:
                continue
            self.add(
                path,
                Value(
                    cond=f"{lit(key)} in self",
                    message=lambda p, key=key: (
                        f'{field_prefix(_join(p, lit(key)))} + "Field required"'
                    ),
                    holds=lambda v, key=key: key in v,
                    text=f"field {'.'.join((*path, key))!r}: Field required",
                ),
                f"{'.'.join((*path, key))}: required",
                present=False,
            )
        for key, prop in props.items():
            if key in skip:
                continue
            self.property(prop, (*path, key))
        for rule in node.get(RULES_KEY, []):
            message = rule["message"]
            self.add(
                path,
                Value(
                    cond=rule["rule"],
                    message=lambda p, message=message: f"{field_prefix(p)} + {lit(message)}",
                    holds=_rule_twin(node, rule),
                    text=f"field {where!r}: {message}",
                ),
                f"{where}: rule {message!r}",
                present=False,
            )

    def property(self, prop: Mapping[str, Any], path: tuple[str, ...]) -> None:
        where = ".".join(path)
        quantity = prop.get(QUANTITY_KEY)
        nullable, node = self.split_null(prop, where)
        if node.get("type") == "object" and "properties" in node:
            inner = Value(
                cond="type(self) == map",
                message=_msg("Input should be an object"),
                holds=lambda v: isinstance(v, dict),
                text=f"field {where!r}: Input should be an object",
            )
            self.add(path, _nullable(inner, nullable), f"{where}: type", present=True)
            self.object(node, path)
            return
        if node.get("type") == "object":
            item_schema = node.get("additionalProperties")
            if not isinstance(item_schema, dict) or node.get("properties"):
                raise Unsupported(f"{where}: an object must be a model or a map of values")
            _, item_node = self.split_null(item_schema, where + ".*")
            item = self.scalar(item_node, quantity, where + ".<key>")
            self.add(path, _nullable(_container(item, "map"), nullable), f"{where}: map", True)
            return
        if node.get("type") == "array":
            _, item_node = self.split_null(node.get("items", {}), where + "[*]")
            item = self.scalar(item_node, quantity, where + "[*]")
            self.add(path, _nullable(_container(item, "list"), nullable), f"{where}: list", True)
            return
        value = self.scalar(node, quantity, where)
        self.add(path, _nullable(value, nullable), f"{where}: value", present=True)

    def split_null(self, prop: Mapping[str, Any], where: str) -> tuple[bool, Mapping[str, Any]]:
        """(whether null is allowed, the schema of the non-null value)."""
        if "anyOf" not in prop:
            return False, self.resolve(prop)
        branches = [self.resolve(b) for b in prop["anyOf"]]
        others = [b for b in branches if b.get("type") != "null"]
        if len(others) != 1:
            raise Unsupported(f"{where}: unions other than X | None are not supported")
        return len(others) < len(branches), others[0]

    def scalar(self, node: Mapping[str, Any], quantity: Any, where: str) -> Value:
        """A string, number, boolean or literal."""
        known = {"type", "title", "description", "default", "enum", "const", "examples"}
        kind = node.get("type")
        if "enum" in node or "const" in node:
            values = node["enum"] if "enum" in node else [node["const"]]
            words = _words(values)
            return Value(
                cond=f"self in {lit(values)}",
                message=_msg(f"Input should be {words}"),
                holds=lambda v, values=values: any(type(v) is type(x) and v == x for x in values),
                text=f"field {where!r}: Input should be {words}",
            )
        if kind == "string" and quantity is not None:
            return _quantity(quantity, where)
        if kind == "string":
            extra = set(node) - known - {"minLength", "maxLength", "pattern"}
            conds, twins, wants = ["type(self) == string"], [lambda v: type(v) is str], []
            if "minLength" in node:
                n = node["minLength"]
                conds.append(f"size(self) >= {n}")
                twins.append(lambda v, n=n: len(v) >= n)
                wants.append(f"at least {n} characters")
            if "maxLength" in node:
                n = node["maxLength"]
                conds.append(f"size(self) <= {n}")
                twins.append(lambda v, n=n: len(v) <= n)
                wants.append(f"at most {n} characters")
            if "pattern" in node:
                pattern = node["pattern"]
                conds.append(f"self.matches({lit(pattern)})")
                twins.append(lambda v, p=pattern: re.search(p, v) is not None)
                wants.append(f"matching {pattern}")
            text = "Input should be a string" + (" of " + ", ".join(wants) if wants else "")
        elif kind in ("integer", "number"):
            extra = (
                set(node) - known - {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
            )
            if kind == "integer":
                conds, twins = ["type(self) == int"], [lambda v: type(v) is int]
            else:
                conds = ["(type(self) == int || type(self) == double)"]
                twins = [lambda v: type(v) in (int, float)]
            wants = []
            for key, op in (
                ("minimum", ">="),
                ("exclusiveMinimum", ">"),
                ("maximum", "<="),
                ("exclusiveMaximum", "<"),
            ):
                if key in node:
                    bound = node[key]
                    conds.append(f"self {op} {lit(bound)}")
                    twins.append(_compare(op, bound))
                    wants.append(f"{op} {bound}")
            noun = "an integer" if kind == "integer" else "a number"
            if "minimum" in node and "maximum" in node and len(wants) == 2:
                text = f"Input should be {noun} from {node['minimum']} to {node['maximum']}"
            else:
                text = f"Input should be {noun}" + (" " + " and ".join(wants) if wants else "")
        elif kind == "boolean":
            extra = set(node) - known
            conds, twins, text = (
                ["type(self) == bool"],
                [lambda v: type(v) is bool],
                "Input should be a boolean",
            )
        else:
            raise Unsupported(f"{where}: type {kind!r} is not supported")
        if extra:
            raise Unsupported(f"{where}: schema keywords {sorted(extra)} are not supported")
        return Value(
            cond=" && ".join(conds),
            message=_msg(text),
            holds=lambda v, twins=tuple(twins): all(t(v) for t in twins),
            text=f"field {where!r}: {text}",
        )


def _join(path: str, key: str) -> str:
    """CEL string: ``path + "." + key`` (``path`` may be the empty string literal)."""
    return key if path == '""' else f'{path} + "." + {key}'


def _compare(op: str, bound: float) -> Pred:
    ops: dict[str, Pred] = {
        ">=": lambda v: v >= bound,
        ">": lambda v: v > bound,
        "<=": lambda v: v <= bound,
        "<": lambda v: v < bound,
    }
    return ops[op]


def _quantity(spec: Mapping[str, Any], where: str) -> Value:
    """A quantity whose value, rounded up to a whole unit as ``Quantity.Value()`` rounds it,
    lies within [minimum, maximum]: ceil(q) >= min is q > min - 1, and ceil(q) <= max is
    q <= max, for whole bounds. With ``numbers`` in ``spec``, a JSON number of bytes is one
    too (a ``resource.Quantity`` decodes either)."""
    low, high = int(spec["minimum"]), int(spec["maximum"])
    example, span = spec["example"], spec["range"]
    numbers = bool(spec.get("numbers"))
    cond = (
        "type(self) == string && isQuantity(self)"
        f' && quantity(self).isGreaterThan(quantity("{low - 1}"))'
        f' && !quantity(self).isGreaterThan(quantity("{high}"))'
    )
    wanted, untyped = "a string", "type(self) != string"
    if numbers:
        cond = (
            f"({cond})"
            f" || (type(self) == int && self >= {low} && self <= {high})"
            f" || (type(self) == double && self > {float(low - 1)!r} && self <= {float(high)!r})"
        )
        wanted = "a string or a number"
        untyped = "!(type(self) == string || type(self) == int || type(self) == double)"

    def message(path: str) -> str:
        return (
            f"{field_prefix(path)} + ("
            f"{untyped} ? "
            f'"Input should be {wanted}, got " + {show("self")} : '
            f'type(self) == string && !isQuantity(self) ? {show("self")} + " is not {example}" : '
            f'{show("self")} + " is outside the allowed range {span}")'
        )

    def holds(v: Any) -> bool:
        if type(v) is str:
            return is_quantity(v) and low <= parse_quantity(v).value() <= high
        if numbers and type(v) is int:
            return low <= v <= high
        if numbers and type(v) is float:
            return low - 1 < v <= high
        return False

    return Value(cond, message, holds, f"field {where!r}: {example} from {span}")


def _container(item: Value, kind: str) -> Value:
    """A map (string keys) or list whose every element is ``item``."""
    elem = "self[k]" if kind == "map" else "x"
    var = "k" if kind == "map" else "x"
    inner_cond = bind_self(item.cond, elem)
    noun = "an object" if kind == "map" else "a list"

    def message(path: str) -> str:
        if kind == "map":
            sub = _join(path, "k")
            each_message = bind_self(item.message(sub), "self[k]")
            each = f"self.filter(k, !({inner_cond})).map(k, {each_message})[0]"
        else:
            sub = f'{path} + "[*]"'
            each = f"self.filter(x, !({inner_cond})).map(x, {bind_self(item.message(sub), 'x')})[0]"
        return (
            f"type(self) != {kind} ? {field_prefix(path)} + "
            f'"Input should be {noun}, got " + {show("self")} : {each}'
        )

    def holds(v: Any) -> bool:
        if kind == "map":
            return isinstance(v, dict) and all(item.holds(x) for x in v.values())
        return isinstance(v, list) and all(item.holds(x) for x in v)

    return Value(
        f"type(self) == {kind} && self.all({var}, {inner_cond})", message, holds, item.text
    )


def _rule_twin(node: Mapping[str, Any], rule: Mapping[str, Any]) -> Pred:
    """The Python twin of a model's rule: the model class's own ``Rule.holds``."""
    model = _MODELS_BY_TITLE.get(node.get("title", ""))
    for r in getattr(model, "rules", ()):
        if r.cel == rule["rule"]:
            holds: Pred = r.holds
            return lambda v: holds(v)
    raise Unsupported(f"{node.get('title')}: rule {rule['rule']!r} has no Python twin")


def _models(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from ``model`` by its fields' annotations, by title."""
    import typing

    found: dict[str, type[BaseModel]] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp.__name__ in found:
                return
            found[tp.__name__] = tp
            for f in tp.model_fields.values():
                visit(f.annotation)
        for arg in typing.get_args(tp):
            visit(arg)

    visit(model)
    return found


_MODELS_BY_TITLE: dict[str, type[BaseModel]] = {}


# ------------------------------------------------------------------------------------
# The policy
# ------------------------------------------------------------------------------------


def checks(apis: Sequence[ConfigApi] = APIS) -> list[Check]:
    """Every check of the policy, in the order the policy lists them; identical checks of
    several kinds of one API are one check."""
    out: list[Check] = []
    anywhere = [a.api_version for a in apis if a.driver is None]
    fixed = list(dict.fromkeys(a.driver for a in apis if a.driver is not None))
    # apiVersion: what the driver accepts under any name, and under each fixed name.
    first = {None: next(a for a in apis if a.driver is None)}
    first.update({d: next(a for a in apis if a.driver == d) for d in fixed})
    for driver, api in first.items():
        allowed = anywhere + [a.api_version for a in apis if driver and a.driver == driver]
        words = ", ".join(f"'{v}'" for v in allowed)
        text = f"is not {words}" if len(allowed) == 1 else f"is not one of {words}"
        out.append(
            Check(
                api,
                (),
                (),
                Value(
                    cond=f"self.?apiVersion.orValue(null) in {lit(allowed)}",
                    message=lambda _p, text=text: (
                        f'"apiVersion " + {show("self.?apiVersion.orValue(null)")} + " {text}"'
                    ),
                    holds=lambda v, allowed=allowed: v.get("apiVersion") in allowed,
                    text=f"apiVersion {text}",
                ),
                f"apiVersion of {driver or 'the driver'}",
                dispatch="apiVersion",
                not_drivers=tuple(fixed) if driver is None else (),
            )
        )
    for api in apis:
        kinds = [_kind(m) for m in api.models]
        words = ", ".join(kinds)
        out.append(
            Check(
                api,
                tuple(kinds),
                (),
                Value(
                    cond=f"self.?kind.orValue(null) in {lit(kinds)}",
                    message=lambda _p, words=words: (
                        f'"kind " + {show("self.?kind.orValue(null)")} + " is not one of {words}"'
                    ),
                    holds=lambda v, kinds=kinds: v.get("kind") in kinds,
                    text=f"kind is not one of {words}",
                ),
                f"kind of {api.api_version}",
                dispatch="kind",
            )
        )
    for api in apis:
        merged: dict[tuple[Any, ...], Check] = {}
        for model in api.models:
            _MODELS_BY_TITLE.update(_models(model))
            schema = model.model_json_schema(by_alias=True, mode="validation")
            for check in Walker(api, _kind(model), schema).walk():
                key = (check.path, check.value.cond, check.value.text, check.dispatch)
                if key in merged:
                    old = merged[key]
                    merged[key] = Check(
                        api, (*old.kinds, *check.kinds), old.path, old.value, old.name, old.present
                    )
                else:
                    merged[key] = check
        out.extend(merged.values())
    return out


def _kind(model: type[BaseModel]) -> str:
    kind = model.model_json_schema(by_alias=True)["properties"]["kind"].get("const")
    if not isinstance(kind, str):
        raise Unsupported(f"{model.__name__}: kind must be a Literal of one name")
    return kind


DRIVER_PLACEHOLDER = "__DRIVER_NAME_EXPRESSION__"
NAME_PLACEHOLDER = "__POLICY_NAME__"


@dataclass
class Policy:
    """The policy and its binding as objects (the driver name is a placeholder)."""

    checks: list[Check] = field(default_factory=list)

    def objects(self, name: str, driver_expression: str) -> list[dict[str, Any]]:
        validations = [
            {
                "expression": c.expression(),
                "messageExpression": c.message_expression(),
                "message": c.static_message(),
                "reason": "Invalid",
            }
            for c in self.checks
        ]
        claim_or_template = 'request.resource.resource == "resourceclaimtemplates"'
        policy = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dra-driver"}},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "matchPolicy": "Equivalent",
                    "resourceRules": [
                        {
                            "apiGroups": ["resource.k8s.io"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["resourceclaims", "resourceclaimtemplates"],
                        }
                    ],
                },
                "matchConditions": [
                    {
                        "name": "spec-written",
                        "expression": (
                            'request.operation == "CREATE" || object.spec != oldObject.spec'
                        ),
                    },
                ],
                "variables": [
                    {"name": "driver", "expression": driver_expression},
                    {
                        "name": "configs",
                        "expression": (
                            f"{claim_or_template} ? object.spec.?spec.?devices.?config.orValue([])"
                            " : object.spec.?devices.?config.orValue([])"
                        ),
                    },
                    {
                        "name": "configPath",
                        "expression": (
                            f'{claim_or_template} ? "spec.spec.devices.config"'
                            ' : "spec.devices.config"'
                        ),
                    },
                    {
                        "name": "opaques",
                        "expression": (
                            "variables.configs.map(c, has(c.opaque) && has(c.opaque.driver) && "
                            "c.opaque.driver == variables.driver && has(c.opaque.parameters) && "
                            "type(c.opaque.parameters) == map ? c.opaque : null)"
                        ),
                    },
                    {
                        "name": "requests",
                        "expression": (
                            "variables.configs.map(c, size(c.?requests.orValue([])) == 0 ? "
                            '"all requests" : c.requests.join(", "))'
                        ),
                    },
                ],
                "validations": validations,
            },
        }
        binding = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dra-driver"}},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }
        return [policy, binding]


HEADER = """\
# Generated by hack/gen_admission_policy.py from the opaque config models of
# dra_driver/gpu/config.py; do not edit, run `.venv/bin/python hack/gen_admission_policy.py`.
#
# Refuses ResourceClaims and ResourceClaimTemplates with an opaque config for this driver
# (spec.devices.config[*].opaque, spec.spec.devices.config[*].opaque of a template) that the
# node agent would refuse when it prepares the claim: unknown apiVersion or kind, unknown or
# missing fields, wrong types, values outside their enum or bounds, malformed quantities, and
# the models' rules across fields. Configs for other drivers are not looked at. Updates that
# leave the spec alone (status, finalizers, labels) are not checked, so claims created before
# the policy can still be deleted.
"""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if len(value) > 80 and "\n" not in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=">")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


def _dump(objects: Sequence[Mapping[str, Any]]) -> str:
    return "---\n".join(
        yaml.dump(o, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
        for o in objects
    )


def render_kustomize(apis: Sequence[ConfigApi] = APIS) -> str:
    objects = Policy(checks(apis)).objects(f"dra-driver-{NAME_SUFFIX}", lit(DEFAULT_DRIVER))
    return HEADER + _dump(objects)


def render_chart(apis: Sequence[ConfigApi] = APIS) -> str:
    objects = Policy(checks(apis)).objects(NAME_PLACEHOLDER, DRIVER_PLACEHOLDER)
    text = _dump(objects)
    text = text.replace(
        f"name: {NAME_PLACEHOLDER}",
        f'name: {{{{ include "dra-driver.fullname" . }}}}-{NAME_SUFFIX}',
    )
    text = text.replace(
        f"policyName: {NAME_PLACEHOLDER}",
        f'policyName: {{{{ include "dra-driver.fullname" . }}}}-{NAME_SUFFIX}',
    )
    text = text.replace(
        "labels:\n    app.kubernetes.io/name: dra-driver",
        'labels:\n    {{- include "dra-driver.labels" . | nindent 4 }}',
    )
    # The driver's name as a CEL string literal, in a YAML single-quoted scalar.
    text = text.replace(
        f"expression: {DRIVER_PLACEHOLDER}",
        'expression: {{ include "dra-driver.driverName" . | quote | squote }}',
    )
    assert NAME_PLACEHOLDER not in text and DRIVER_PLACEHOLDER not in text
    gate = ".Values." + CHART_VALUE
    return (
        f"{{{{- if {gate} }}}}\n"
        + "\n".join(
            "#" + line[1:] if line.startswith("#") else line for line in HEADER.splitlines()
        )
        + "\n"
        + text
        + "{{- end }}\n"
    )


def outputs(apis: Sequence[ConfigApi] = APIS) -> dict[Path, str]:
    return {KUSTOMIZE_FILE: render_kustomize(apis), CHART_FILE: render_chart(apis)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the files are stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
    for path in stale:
        verb = "stale" if args.check else "wrote"
        print(f"{verb}: {path.relative_to(ROOT)}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
