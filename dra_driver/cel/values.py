"""The CEL value model: plain Python values plus the few types Python conflates or lacks.

CEL type   Python
bool       bool
int        int (checked against the int64 range after arithmetic)
uint       :class:`Uint`
double     float
string     str
bytes      bytes
null       None
list       list / tuple
map        dict
quantity   :class:`dra_driver.quantity.Quantity`
semver     :class:`dra_driver.cel.semver.Semver`

Plain values keep evaluation fast; the helpers below add CEL's rules where Python's differ
(``true == 1`` is false in CEL, ``1 < "a"`` is an error, ints overflow at 64 bits).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.types import Duration, Timestamp, Uint, type_name

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


def string_arg(name: str, value: Any) -> str:
    """``value`` when it is a string, else the call's "no such overload"."""
    if type(value) is not str:
        raise NoSuchOverload(name, value)
    return value


def succeeds(parse: Any, text: str) -> bool:
    """Whether ``parse(text)`` returns rather than raising an :class:`EvalError`
    (``isIP``, ``isCIDR``, ``isURL``)."""
    try:
        parse(text)
    except EvalError:
        return False
    return True


def check_int(value: int) -> int:
    """``value`` if it fits int64, else the overflow error CEL reports."""
    if INT64_MIN <= value <= INT64_MAX:
        return value
    raise EvalError("integer overflow")


def check_uint(value: int) -> Uint:
    """``value`` as a uint if it fits uint64, else the overflow error."""
    if 0 <= value <= UINT64_MAX:
        return Uint(value)
    raise EvalError("unsigned integer overflow")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def cel_eq(a: Any, b: Any) -> bool:
    """CEL equality: numbers compare across int/uint/double, other types must match."""
    ta = type(a)
    if ta is type(b) and ta in (str, int, float, bool, bytes):
        return bool(a == b)
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if b is not None and type(a) is not type(b) and type_name(a) in _OPAQUE:
        # The left operand's type decides: a Quantity or Semver compared with another
        # kind is the scheduler's "no such overload" (null is always just unequal).
        raise NoSuchOverload("_==_", a, b)
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_not_unequal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if len(a) != len(b):
            return False
        for key, value in a.items():
            other = _map_get(b, key)
            if other is _MISSING or not _not_unequal(value, other):
                return False
        return True
    if type_name(a) != type_name(b):
        return False
    return bool(a == b)


_OPAQUE = frozenset(
    ("kubernetes.Quantity", "kubernetes.Semver", "net.IP", "net.CIDR", "kubernetes.URL")
)


_MISSING = object()


def _not_unequal(a: Any, b: Any) -> bool:
    # Lists and maps are unequal only where a pair of elements is definitely unequal: a pair
    # without an == overload (a Semver and a bool) does not make them differ, as in cel-go.
    try:
        return cel_eq(a, b)
    except NoSuchOverload:
        return True


def equal(a: Any, b: Any) -> bool:
    """Whether ``a == b`` is true, where no overload counts as false: how the scheduler's
    list functions and ``in`` look for an element (``a.Equal(b) == True``)."""
    try:
        return cel_eq(a, b)
    except NoSuchOverload:
        return False


def _map_get(mapping: Mapping[Any, Any], key: Any) -> Any:
    # Map keys compare like values: 1 and 1u are the same key, true and 1 are not.
    for candidate in mapping:
        if cel_eq(candidate, key):
            return mapping[candidate]
    return _MISSING


def map_lookup(mapping: Mapping[Any, Any], key: Any) -> Any:
    """``mapping[key]`` with CEL key equality; ``_MISSING`` sentinel when absent."""
    if type(key) is str:
        return mapping.get(key, _MISSING)
    return _map_get(mapping, key)


def is_missing(value: object) -> bool:
    """Whether :func:`map_lookup` found nothing."""
    return value is _MISSING


#: Types ordered with themselves only; durations and timestamps order by their instant.
_ORDERED: frozenset[type] = frozenset((str, int, bytes, bool, Uint, Duration, Timestamp))


def cel_compare(op: str, a: Any, b: Any) -> int:
    """-1, 0 or 1 for ordered types; numbers compare across int/uint/double."""
    ta = type(a)
    if ta is type(b) and ta in _ORDERED:
        return int(a > b) - int(a < b)
    if _is_number(a) and _is_number(b):
        if a != a or b != b:
            raise EvalError("NaN values cannot be ordered")
        return int(a > b) - int(a < b)
    raise NoSuchOverload(op, a, b)


def format_value(value: Any) -> str:
    """A value as CEL source-like text, for explanations (strings quoted, lists bracketed)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{format_value(k)}: {format_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    return str(value)
