"""CEL optional values: ``a.?b``, ``m[?k]``, ``optional.of/none``, ``.orValue()`` and friends.

The scheduler's "no such key" error recommends ``.?`` followed by ``orValue()``, so the
optional library is part of the environment selectors are written for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.types import Duration, Timestamp
from dra_driver.cel.values import cel_eq


class Optional:
    """An optional value; :data:`NONE` is the empty one."""

    __slots__ = ("value",)
    cel_type_name: Final = "optional_type"

    def __init__(self, value: Any) -> None:
        self.value = value

    def has_value(self) -> bool:
        """Whether a value is present."""
        return self.value is not _ABSENT

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Optional):
            return False
        if not (self.has_value() and other.has_value()):
            return self.has_value() == other.has_value()
        return cel_eq(self.value, other.value)

    def __hash__(self) -> int:
        return 0  # optionals are not map keys; equality above is what matters

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.has_value() else "optional.none()"


_ABSENT = object()
NONE = Optional(_ABSENT)


def of(value: Any) -> Optional:
    """``optional.of(x)``."""
    return Optional(value)


def none() -> Optional:
    """``optional.none()``."""
    return NONE


def of_non_zero_value(value: Any) -> Optional:
    """``optional.ofNonZeroValue(x)``: empty for the type's zero value (0, "", [], {}, false)."""
    if value is None or value is False or (not isinstance(value, bool) and value in (0, "", b"")):
        return NONE
    if isinstance(value, list | tuple | Mapping) and not value:
        return NONE
    if isinstance(value, Duration | Timestamp) and value.nanos == _ZERO_TIME.get(type(value)):
        return NONE  # 0s, and Go's zero time (0001-01-01T00:00:00Z)
    return Optional(value)


_ZERO_TIME: dict[type, int] = {Duration: 0, Timestamp: -62135596800 * 10**9}


def _optional(name: str, value: Any, *args: Any) -> Optional:
    if not isinstance(value, Optional):
        raise NoSuchOverload(name, value, *args)
    return value


def has_value(opt: Any) -> bool:
    """``opt.hasValue()``."""
    return _optional("hasValue", opt).has_value()


def value(opt: Any) -> Any:
    """``opt.value()``: the value, or an error for an empty optional."""
    found = _optional("value", opt)
    if not found.has_value():
        raise EvalError("optional.none() dereference")
    return found.value


def or_value(opt: Any, default: Any) -> Any:
    """``opt.orValue(default)``."""
    found = _optional("orValue", opt, default)
    return found.value if found.has_value() else default


def or_(opt: Any, other: Any) -> Optional:
    """``opt.or(other)``: ``opt`` when it has a value, else ``other``."""
    found = _optional("or", opt, other)
    return found if found.has_value() else _optional("or", other)


def first(items: Any) -> Optional:
    """``list.first()``."""
    if not isinstance(items, list | tuple):
        raise NoSuchOverload("first", items)
    return Optional(items[0]) if items else NONE


def last(items: Any) -> Optional:
    """``list.last()``."""
    if not isinstance(items, list | tuple):
        raise NoSuchOverload("last", items)
    return Optional(items[-1]) if items else NONE


GLOBAL: dict[str, Callable[..., Any]] = {
    "optional.of": of,
    "optional.none": none,
    "optional.ofNonZeroValue": of_non_zero_value,
}

MEMBER: dict[str, Callable[..., Any]] = {
    "hasValue": has_value,
    "value": value,
    "orValue": or_value,
    "or": or_,
    "first": first,
    "last": last,
}
