"""CEL's standard functions: size, string predicates, type conversions and ``type``."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.regex import search
from dra_driver.cel.types import (
    DURATION,
    NANOS,
    TIMESTAMP,
    CelType,
    Duration,
    Printable,
    Timestamp,
    Uint,
    type_name,
)
from dra_driver.cel.values import INT64_MAX, INT64_MIN, check_uint

Function = Callable[..., Any]


def size(value: Any) -> int:
    """Length of a string (in code points), bytes, list or map."""
    if isinstance(value, str | bytes | list | tuple | Mapping):
        return len(value)
    raise NoSuchOverload("size", value)


def _strings(name: str, a: Any, b: Any) -> tuple[str, str]:
    if type(a) is not str or type(b) is not str:
        raise NoSuchOverload(name, a, b)
    return a, b


def contains(text: Any, part: Any) -> bool:
    """Substring test."""
    a, b = _strings("contains", text, part)
    return b in a


def starts_with(text: Any, prefix: Any) -> bool:
    """Prefix test."""
    a, b = _strings("startsWith", text, prefix)
    return a.startswith(b)


def ends_with(text: Any, suffix: Any) -> bool:
    """Suffix test."""
    a, b = _strings("endsWith", text, suffix)
    return a.endswith(b)


def matches(text: Any, pattern: Any) -> bool:
    """Whether the regular expression matches anywhere in ``text`` (RE2 ``MatchString``)."""
    a, b = _strings("matches", text, pattern)
    return search(b, a)


_INT_TEXT = re.compile(r"[+-]?[0-9]+")


_CONVERSION = "type conversion error from 'string' to '{}'"  # the scheduler's words


def to_int(value: Any) -> int:
    """``int(x)`` for int, uint, double (truncating), string and bool-free inputs."""
    if isinstance(value, bool):
        raise NoSuchOverload("int", value)
    if isinstance(value, int):
        result = int(value)
    elif isinstance(value, float):
        # cel-go refuses -2^63 itself too (v <= float64(math.MinInt64)).
        if math.isnan(value) or math.isinf(value) or not -(2.0**63) < value < 2.0**63:
            raise EvalError("integer overflow")
        result = int(value)
    elif isinstance(value, str):
        if not _INT_TEXT.fullmatch(value):
            raise EvalError(_CONVERSION.format("int"))
        result = int(value)
    elif isinstance(value, Duration):
        return value.nanos
    elif isinstance(value, Timestamp):
        return value.nanos // NANOS  # Unix seconds, rounded down as Go's Time.Unix
    else:
        raise NoSuchOverload("int", value)
    if not INT64_MIN <= result <= INT64_MAX:
        raise EvalError("integer overflow")
    return result


def to_uint(value: Any) -> Uint:
    """``uint(x)``."""
    if isinstance(value, bool):
        raise NoSuchOverload("uint", value)
    if isinstance(value, int):
        return check_uint(int(value))
    if isinstance(value, float):
        if math.isnan(value) or not 0 <= value < 2.0**64:
            raise EvalError("unsigned integer overflow")
        return Uint(int(value))
    if isinstance(value, str):
        if not re.fullmatch(r"[0-9]+", value):  # Go's ParseUint takes no sign
            raise EvalError(_CONVERSION.format("uint"))
        return check_uint(int(value))
    raise NoSuchOverload("uint", value)


def to_double(value: Any) -> float:
    """``double(x)``."""
    if isinstance(value, bool):
        raise NoSuchOverload("double", value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return _parse_float(value)
    raise NoSuchOverload("double", value)


# Go's ParseFloat syntax: decimal, hexadecimal with a binary exponent (underscores only between
# digits, or after the base prefix), "inf"/"infinity" with a sign, "nan" without one, any case.
_D = r"[0-9](?:_?[0-9])*"
_H = r"[0-9a-fA-F](?:_?[0-9a-fA-F])*"
_DECIMAL_FLOAT = re.compile(rf"[+-]?(?:{_D}\.?(?:{_D})?|\.{_D})(?:[eE][+-]?{_D})?")
_HEX_FLOAT = re.compile(rf"[+-]?0[xX](?:_?{_H}\.?(?:{_H})?|\.{_H})[pP][+-]?{_D}")
_INFINITY = re.compile(r"[+-]?(?:inf|infinity)", re.IGNORECASE)


def _parse_float(text: str) -> float:
    """``double(string)`` as Go's ``strconv.ParseFloat``: out of range is an error."""
    try:
        if _DECIMAL_FLOAT.fullmatch(text):
            result = float(text)
        elif _HEX_FLOAT.fullmatch(text):
            result = float.fromhex(text.replace("_", ""))
        elif _INFINITY.fullmatch(text):
            return -math.inf if text.startswith("-") else math.inf
        elif text.lower() == "nan":
            return math.nan
        else:
            raise ValueError(text)
    except (ValueError, OverflowError):
        raise EvalError(_CONVERSION.format("double")) from None
    if math.isinf(result):
        raise EvalError(_CONVERSION.format("double"))  # ErrRange
    return result


def _double_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    # Go's strconv.FormatFloat(v, 'g', -1, 64): the shortest digits that round-trip (Python's
    # repr finds the same ones), in exponent form when the exponent is < -4 or >= 6.
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)  # finite here
    text = "".join(map(str, digits)).rstrip("0") or "0"
    point = len(digits) + exponent  # digits before the decimal point
    prefix = "-" if sign else ""
    if text == "0":
        return prefix + "0"
    if point - 1 < -4 or point - 1 >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}e{point - 1:+03d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{text}"
    whole, fraction = text[:point].ljust(point, "0"), text[point:]
    return f"{prefix}{whole}.{fraction}" if fraction else f"{prefix}{whole}"


def to_string(value: Any) -> str:
    """``string(x)`` for scalars; a Quantity or Semver has no such overload, as in the scheduler."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return _double_text(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise EvalError("invalid UTF-8 in bytes, cannot convert to string") from None
    if isinstance(value, Printable):
        return str(value)
    raise NoSuchOverload("string", value)


def to_bool(value: Any) -> bool:
    """``bool(x)`` for bools and the strings Go's ``strconv.ParseBool`` accepts."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in ("1", "t", "T", "true", "TRUE", "True"):
            return True
        if value in ("0", "f", "F", "false", "FALSE", "False"):
            return False
        raise EvalError(_CONVERSION.format("bool"))
    raise NoSuchOverload("bool", value)


def to_bytes(value: Any) -> bytes:
    """``bytes(x)``."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise NoSuchOverload("bytes", value)


def dyn(value: Any) -> Any:
    """``dyn(x)``: only a type-checker hint, the identity at runtime."""
    return value


def type_of(value: Any) -> CelType:
    """``type(x)``."""
    return CelType(type_name(value))


#: The names that denote types when used as plain identifiers (``type(x) == string``).
TYPE_NAMES = (
    "bool", "int", "uint", "double", "string", "bytes", "list", "map", "null_type", "type",
)  # fmt: skip

#: Type names with a namespace; ``type(d) == google.protobuf.Duration``.
QUALIFIED_TYPE_NAMES = frozenset((DURATION, TIMESTAMP, "net.IP", "net.CIDR"))

GLOBAL: dict[str, Function] = {
    "size": size,
    "matches": matches,
    "int": to_int,
    "uint": to_uint,
    "double": to_double,
    "string": to_string,
    "bool": to_bool,
    "bytes": to_bytes,
    "dyn": dyn,
    "type": type_of,
}

MEMBER: dict[str, Function] = {
    "size": size,
    "contains": contains,
    "startsWith": starts_with,
    "endsWith": ends_with,
    "matches": matches,
}
