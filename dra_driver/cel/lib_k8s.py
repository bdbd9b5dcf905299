"""The Kubernetes CEL libraries DRA selectors use: quantity, semver and regex ``find``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.regex import find, find_all
from dra_driver.cel.semver import Semver, is_semver, parse_semver
from dra_driver.quantity import Quantity, QuantityError, int_quantity, is_quantity, parse_quantity

Function = Callable[..., Any]


def quantity(text: Any) -> Quantity:
    """``quantity("1Gi")``."""
    if type(text) is not str:
        raise NoSuchOverload("quantity", text)
    try:
        return parse_quantity(text)
    except QuantityError as exc:
        raise EvalError(exc.reason) from None  # the scheduler's words, without the text


def is_quantity_(text: Any) -> bool:
    """``isQuantity("1Gi")``."""
    if type(text) is not str:
        raise NoSuchOverload("isQuantity", text)
    return is_quantity(text)


def semver(text: Any, normalize: Any = False) -> Semver:
    """``semver("1.2.3")``, or ``semver("v1.2", true)`` to normalise first."""
    if type(text) is not str or type(normalize) is not bool:
        raise NoSuchOverload("semver", text, normalize)
    return parse_semver(text, normalize)


def is_semver_(text: Any, normalize: Any = False) -> bool:
    """``isSemver("1.2.3")`` / ``isSemver("v1.2", true)``."""
    if type(text) is not str or type(normalize) is not bool:
        raise NoSuchOverload("isSemver", text, normalize)
    return is_semver(text, normalize)


def _same(name: str, a: Any, b: Any) -> int:
    # compareTo, isGreaterThan and isLessThan exist for quantity and semver, each with itself.
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.compare(b)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    raise NoSuchOverload(name, a, b)


def compare_to(a: Any, b: Any) -> int:
    """-1, 0 or 1."""
    return _same("compareTo", a, b)


def is_greater_than(a: Any, b: Any) -> bool:
    """``a > b``."""
    return _same("isGreaterThan", a, b) > 0


def is_less_than(a: Any, b: Any) -> bool:
    """``a < b``."""
    return _same("isLessThan", a, b) < 0


def _quantity(name: str, value: Any, *args: Any) -> Quantity:
    if not isinstance(value, Quantity):
        raise NoSuchOverload(name, value, *args)
    return value


def _operand(name: str, q: Quantity, other: Any) -> Quantity:
    if isinstance(other, Quantity):
        return other
    if type(other) is int:
        return int_quantity(other)
    raise NoSuchOverload(name, q, other)


def add(q: Any, other: Any) -> Quantity:
    """``q.add(q2)`` or ``q.add(int)``."""
    a = _quantity("add", q, other)
    return a.plus(_operand("add", a, other))


def sub(q: Any, other: Any) -> Quantity:
    """``q.sub(q2)`` or ``q.sub(int)``."""
    a = _quantity("sub", q, other)
    return a.minus(_operand("sub", a, other))


def sign(q: Any) -> int:
    """-1, 0 or 1."""
    return _quantity("sign", q).sign()


def is_integer(q: Any) -> bool:
    """Whether ``asInteger()`` would succeed."""
    return _quantity("isInteger", q).is_integer()


def as_integer(q: Any) -> int:
    """The value as int, or an error."""
    try:
        return _quantity("asInteger", q).as_integer()
    except QuantityError as exc:
        raise EvalError(str(exc)) from None


def as_approximate_float(q: Any) -> float:
    """The nearest double."""
    return _quantity("asApproximateFloat", q).as_float()


def _semver(name: str, value: Any) -> Semver:
    if not isinstance(value, Semver):
        raise NoSuchOverload(name, value)
    return value


def _int64(component: int) -> int:
    # Version components are uint64 there, read as int64: values past 2^63 wrap negative.
    return (component + 2**63) % 2**64 - 2**63


def major(v: Any) -> int:
    """Major version."""
    return _int64(_semver("major", v).major)


def minor(v: Any) -> int:
    """Minor version."""
    return _int64(_semver("minor", v).minor)


def patch(v: Any) -> int:
    """Patch version."""
    return _int64(_semver("patch", v).patch)


GLOBAL: dict[str, Function] = {
    "quantity": quantity,
    "isQuantity": is_quantity_,
    "semver": semver,
    "isSemver": is_semver_,
    "sign": sign,
}

MEMBER: dict[str, Function] = {
    "compareTo": compare_to,
    "isGreaterThan": is_greater_than,
    "isLessThan": is_less_than,
    "add": add,
    "sub": sub,
    "isInteger": is_integer,
    "asInteger": as_integer,
    "asApproximateFloat": as_approximate_float,
    "major": major,
    "minor": minor,
    "patch": patch,
    "find": find,
    "findAll": find_all,
}
