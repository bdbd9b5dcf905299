"""The DRA selector environment: the ``device`` variable, compilation with a cache, evaluation.

``device.attributes[domain][name]`` and ``device.capacity[domain][name]``: names without a
domain belong to the device's driver. Looking up a domain the device lacks gives an empty map,
so only the key lookup inside it fails, as in the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from dra_driver.cel import cost, grammar
from dra_driver.cel.compiler import Ast, Compiler, Eval, Node
from dra_driver.cel.errors import CompileError, EvalError
from dra_driver.cel.limits import deep_recursion, nesting_error
from dra_driver.cel.semver import parse_semver
from dra_driver.cel.types import type_name
from dra_driver.quantity import QuantityError, parse_quantity

VARIABLES = {"device": "kubernetes.DRADevice"}
OBJECTS = {
    "kubernetes.DRADevice": {
        "driver": "string",
        "attributes": "map(string, map(string, dyn))",
        "capacity": "map(string, map(string, kubernetes.Quantity))",
        "allowMultipleAllocations": "bool",
    }
}
#: The API's limit on a selector's length: API validation (the API server refuses longer
#: selectors), not the scheduler's CEL, which compiles them; tools may warn about it.
API_MAX_EXPRESSION_LENGTH = 10 * 1024
#: The scheduler's CEL parser refuses expressions longer than this many code points.
MAX_CODE_POINTS = 100_000


class Verdict(StrEnum):
    """What a selector says about a device."""

    MATCH = "match"
    NO_MATCH = "no match"
    ERROR = "error"


@dataclass(frozen=True)
class Outcome:
    """A verdict, and for errors the message the scheduler would report."""

    verdict: Verdict
    error: str = ""


@dataclass(frozen=True)
class Program:
    """A compiled selector; evaluate it with :func:`device_variables` of a device."""

    expression: str
    tree: Ast
    fn: Eval
    #: Whether evaluation counts cost (the expression might reach the limit): see :mod:`cost`.
    costed: bool = False
    #: The cost known while compiling, charged when evaluation starts (when counted).
    cost: int = 0

    def evaluate(self, variables: dict[str, Any]) -> Any:
        """The expression's value; raises :class:`EvalError`."""
        return self.fn(variables)

    def compile_subtree(self, tree: Ast) -> Node:
        """Compile a part of this expression (used to explain non-matches)."""
        with deep_recursion():
            return Compiler(self.expression, VARIABLES, OBJECTS).compile(tree)


def exceeds_api_length(expression: str) -> bool:
    """Whether the API server would refuse ``expression`` for its length (the scheduler's CEL
    would still compile it: the limit is API validation)."""
    return len(expression) > API_MAX_EXPRESSION_LENGTH


def parse(expression: str) -> Ast:
    """The lark tree of ``expression``; :class:`CompileError` with the position on bad syntax."""
    if len(expression) > MAX_CODE_POINTS:
        # cel-go's parser, before parsing (a Python str is a sequence of code points).
        message = (
            "expression code point size exceeds limit: "
            f"size: {len(expression)}, limit {MAX_CODE_POINTS}"
        )
        raise CompileError(expression, message, -1, 0)
    try:
        tree: Ast = grammar.parser().parse(expression)
    except UnexpectedInput as exc:
        raise CompileError(expression, _syntax_message(exc), exc.line, exc.column) from None
    return tree


def _syntax_message(exc: UnexpectedInput) -> str:
    if isinstance(exc, UnexpectedToken):
        if exc.token.type == "$END":
            return "Syntax error: unexpected end of expression"
        return f"Syntax error: mismatched input '{exc.token}'"
    if isinstance(exc, UnexpectedCharacters):
        return f"Syntax error: token recognition error at: '{exc.char}'"
    return "Syntax error"  # pragma: no cover - lark raises only the two kinds above here


@lru_cache(maxsize=4096)
def _compile(expression: str) -> Program | CompileError:
    # Cached by text: the same class selector is evaluated against every device of a cluster.
    try:
        tree = parse(expression)
        too_deep = nesting_error(tree)
        if too_deep is not None:
            return CompileError(expression, too_deep, -1, 0)
        compiler = Compiler(
            expression, VARIABLES, OBJECTS, counting=cost.needs_counting(tree, expression)
        )
        with deep_recursion():
            node = compiler.compile(tree)
    except CompileError as exc:
        return exc
    if node.type not in ("bool", "dyn", "wrapper(bool)"):
        return CompileError(
            expression, f"must evaluate to bool or the unknown type, not {node.type}", 1, 1
        )
    return Program(expression, tree, node.fn, compiler.counting, node.cost)


def compile_selector(expression: str) -> Program:
    """Compile (or fetch from the cache) a selector; raises :class:`CompileError`."""
    result = _compile(expression)
    if isinstance(result, CompileError):
        raise result
    return result


class DomainMap(dict[str, dict[str, Any]]):
    """attributes/capacity: a domain the device lacks reads as an empty map."""

    def get(self, key: Any, default: Any = None) -> Any:
        """The domain's map, or an empty map."""
        return super().get(key, _EMPTY)


_EMPTY: dict[str, Any] = {}


def split_name(name: str, driver: str) -> tuple[str, str]:
    """``domain/name`` -> (domain, name); an unqualified name belongs to ``driver``."""
    domain, sep, rest = name.partition("/")
    return (domain, rest) if sep else (driver, name)


#: The value fields of an attribute in the order the scheduler reads them: lists first.
_KINDS = ("ints", "bools", "strings", "versions", "int", "bool", "string", "version")


def attribute_value(name: str, attribute: Mapping[str, Any]) -> Any:
    """A DRA attribute (``{"int": 1}``, ``{"version": "1.2.3"}``, ``{"strings": [...]}``, ...)
    as a CEL value; list-type attributes (DRAListTypeAttributes) become lists."""
    # The API lets an attribute have one field; with more, the first in _KINDS counts.
    for kind in attribute if len(attribute) == 1 else (k for k in _KINDS if k in attribute):
        value = attribute[kind]
        if kind in ("int", "bool", "string"):
            return value
        if kind == "version":
            return _semver(name, value)
        if kind == "versions":
            return [_semver(name, v) for v in value]
        if kind in ("ints", "bools", "strings"):
            return list(value)
    raise EvalError(f"attribute {name}: unsupported attribute value {dict(attribute)!r}")


def _semver(name: str, text: Any) -> Any:
    try:
        return parse_semver(str(text))
    except EvalError as exc:
        raise EvalError(f"attribute {name}: parse semantic version: {exc}") from None


def device_variables(device: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """The activation for one device (a ResourceSlice ``devices[]`` entry) of ``driver``.

    Build it once per device and reuse it for every selector; it raises :class:`EvalError`
    when an attribute cannot be represented (the scheduler then fails every selector on it).
    """
    attributes = DomainMap()
    for name, attribute in _entries(device, "attributes"):
        if not isinstance(attribute, Mapping):
            raise EvalError(f"attribute {name}: unsupported attribute value {attribute!r}")
        domain, key = split_name(name, driver)
        attributes.setdefault(domain, {})[key] = attribute_value(name, attribute)
    capacity = DomainMap()
    for name, entry in _entries(device, "capacity"):
        if not isinstance(entry, Mapping) or "value" not in entry:
            raise EvalError(f"capacity {name}: {entry!r} is not {{value: QUANTITY}}")
        domain, key = split_name(name, driver)
        try:
            capacity.setdefault(domain, {})[key] = parse_quantity(str(entry["value"]))
        except QuantityError as exc:
            raise EvalError(str(exc)) from None
    return {
        "device": {
            "driver": driver,
            "attributes": attributes,
            "capacity": capacity,
            "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
        }
    }


def _entries(device: Mapping[str, Any], field: str) -> list[tuple[str, Any]]:
    entries = device.get(field) or {}
    if not isinstance(entries, Mapping):
        raise EvalError(f"{field}: {entries!r} is not a map")
    return [(str(name), value) for name, value in entries.items()]


def evaluate(program: Program, variables: dict[str, Any]) -> Outcome:
    """Match, no match, or the error (a runtime error or a non-bool result)."""
    if program.costed:
        variables = {**variables, cost.KEY: [program.cost]}
    try:
        value = program.fn(variables)
    except EvalError as exc:
        return Outcome(Verdict.ERROR, str(exc))
    except RecursionError:
        # Long &&/|| chains nest deeper than Python's default allows; the scheduler's
        # evaluator has no such limit. Retried rather than raising the limit for every call.
        try:
            with deep_recursion():
                value = program.fn(variables)
        except EvalError as exc:
            return Outcome(Verdict.ERROR, str(exc))
    if value is True:
        return Outcome(Verdict.MATCH)
    if value is False:
        return Outcome(Verdict.NO_MATCH)
    return Outcome(
        Verdict.ERROR, f"CEL result of type {type_name(value)} could not be converted to bool"
    )


def evaluate_expression(expression: str, variables: dict[str, Any]) -> Outcome:
    """Compile (cached) and evaluate; a compile error is an error outcome."""
    try:
        program = compile_selector(expression)
    except CompileError as exc:
        return Outcome(Verdict.ERROR, str(exc))
    return evaluate(program, variables)
