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


_TWO_63: float = 2.0**63  # float64(math.MaxInt64), as cel-go's comparisons round it
_TWO_64: float = 2.0**64  # float64(math.MaxUint64)


def _number_cmp(a: Any, b: Any) -> int:
    """-1, 0 or 1 for two numbers (neither NaN) as cel-go compares them: an int or uint
    against a double is converted to a double (``9007199254740993 == 9007199254740992.0``),
    int against uint exactly."""
    if type(a) is float and type(b) is not float:
        return -_number_cmp(b, a)
    if type(b) is float and type(a) is not float:
        if isinstance(a, Uint):
            if b < 0:
                return 1
            if b > _TWO_64:
                return -1
        else:
            if b < -_TWO_63:
                return 1
            if b > _TWO_63:
                return -1
        x = float(a)
        return int(x > b) - int(x < b)
    return int(a > b) - int(a < b)


def cel_eq(a: Any, b: Any) -> bool:
    """CEL equality: numbers compare across int/uint/double, other types must match."""
    ta = type(a)
    if ta is type(b) and ta in (str, int, float, bool, bytes):
        return bool(a == b)
    if _is_number(a) and _is_number(b):
        return a == a and b == b and _number_cmp(a, b) == 0
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


def _same_key(a: Any, b: Any) -> bool:
    # A Go map's key equality: the same type and value (1, 1u, 1.0 and true are four keys).
    return type_name(a) == type_name(b) and bool(a == b)


def _exact_get(mapping: Mapping[Any, Any], key: Any) -> Any:
    exact = getattr(mapping, "exact", None)
    if exact is not None:
        return exact(key, _MISSING)
    for candidate in mapping:
        if _same_key(candidate, key):
            return mapping[candidate]
    return _MISSING


def _map_get(mapping: Mapping[Any, Any], key: Any) -> Any:
    # cel-go's map lookup: the key itself, else a double that is a whole number as an int
    # or a uint, an int as a uint, a uint as an int. Never an int as a double, nor a bool.
    found = _exact_get(mapping, key)
    if found is not _MISSING:
        return found
    kind = type(key)
    if kind is float:
        if key.is_integer() and -_TWO_63 < key < _TWO_63:
            found = _exact_get(mapping, int(key))
            if found is not _MISSING:
                return found
        if key.is_integer() and 0 <= key < _TWO_64:
            return _exact_get(mapping, Uint(int(key)))
    elif kind is int and key >= 0:
        return _exact_get(mapping, Uint(key))
    elif kind is Uint and key <= INT64_MAX:
        return _exact_get(mapping, int(key))
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
        return _number_cmp(a, b)
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
