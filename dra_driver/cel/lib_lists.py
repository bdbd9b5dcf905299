"""List functions (Kubernetes lists library and the CEL lists extension) and the sets extension."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.types import type_name
from dra_driver.cel.values import cel_compare, cel_eq, check_int, equal

Function = Callable[..., Any]


def _list(name: str, value: Any, *args: Any) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise NoSuchOverload(name, value, *args)
    return value


def is_sorted(items: Any) -> bool:
    """Whether the list is in ascending order."""
    values = _list("isSorted", items)
    return all(cel_compare("isSorted", a, b) <= 0 for a, b in pairwise(values))


def sum_(items: Any) -> Any:
    """Sum of a list of numbers of one type; 0 for an empty list."""
    values = _list("sum", items)
    if not values:
        return 0
    kinds = {type_name(v) for v in values}
    if len(kinds) != 1 or kinds.pop() not in ("int", "uint", "double"):
        raise NoSuchOverload("sum", items)
    total = sum(values)
    return check_int(total) if type_name(values[0]) == "int" else type(values[0])(total)


def _extreme(name: str, items: Any, sign: int) -> Any:
    values = _list(name, items)
    if not values:
        raise EvalError(f"{name}(list) called on an empty list")
    best = values[0]
    for value in values[1:]:
        if cel_compare(name, value, best) * sign > 0:
            best = value
    return best


def min_(items: Any) -> Any:
    """The smallest element; an error for an empty list."""
    return _extreme("min", items, -1)


def max_(items: Any) -> Any:
    """The largest element; an error for an empty list."""
    return _extreme("max", items, 1)


def index_of(items: Any, item: Any) -> int:
    """First index of ``item``, or -1."""
    values = _list("indexOf", items, item)
    return next((i for i, v in enumerate(values) if equal(v, item)), -1)


def last_index_of(items: Any, item: Any) -> int:
    """Last index of ``item``, or -1."""
    values = _list("lastIndexOf", items, item)
    return next((i for i in range(len(values) - 1, -1, -1) if equal(values[i], item)), -1)


def slice_(items: Any, start: Any, end: Any) -> list[Any]:
    """Elements ``[start, end)``."""
    values = _list("slice", items, start, end)
    if type(start) is not int or type(end) is not int:
        raise NoSuchOverload("slice", items, start, end)
    if start < 0 or end < 0 or start > end or end > len(values):
        raise EvalError(f"cannot slice({start}, {end}) a list of size {len(values)}")
    return list(values[start:end])


def flatten(items: Any, depth: Any = 1) -> list[Any]:
    """Nested lists flattened ``depth`` levels."""
    values = _list("flatten", items)
    if type(depth) is not int or depth < 0:
        raise EvalError("flatten: depth must be a non-negative int")
    out: list[Any] = []
    for value in values:
        if depth > 0 and isinstance(value, list | tuple):
            out.extend(flatten(value, depth - 1))
        else:
            out.append(value)
    return out


def distinct(items: Any) -> list[Any]:
    """The list without repeated elements, first occurrences kept."""
    out: list[Any] = []
    for value in _list("distinct", items):
        if not any(cel_eq(value, seen) for seen in out):
            out.append(value)
    return out


def reverse(items: Any) -> list[Any]:
    """The list reversed."""
    return list(reversed(_list("reverse", items)))


def sort(items: Any) -> list[Any]:
    """The list sorted ascending (elements must be of one comparable type)."""
    from functools import cmp_to_key

    values = _list("sort", items)
    return sorted(values, key=cmp_to_key(lambda a, b: cel_compare("sort", a, b)))


def sort_by_keys(items: Any, keys: list[Any]) -> list[Any]:
    """``list.sortBy(x, key)``: the list ordered by the keys (a stable sort)."""
    from functools import cmp_to_key

    values = _list("sortBy", items)

    def by_key(a: tuple[Any, Any], b: tuple[Any, Any]) -> int:
        return cel_compare("sortBy", a[0], b[0])

    pairs = sorted(zip(keys, values, strict=True), key=cmp_to_key(by_key))
    return [value for _, value in pairs]


def includes(items: Any, item: Any) -> bool:
    """``list.includes(x)``: membership where incomparable values are simply not equal; on a
    scalar (an attribute that may be a list on other devices) equality with it."""
    return any(equal(v, item) for v in (items if isinstance(items, list | tuple) else (items,)))


def lists_range(count: Any) -> list[int]:
    """``lists.range(n)``: ``[0, 1, ..., n-1]``."""
    if type(count) is not int:
        raise NoSuchOverload("lists.range", count)
    if count < 0:
        raise EvalError(f"lists.range: size must be non-negative, got {count}")
    return list(range(count))


def _contains_all(haystack: Any, needles: Any) -> bool:
    return all(any(cel_eq(n, h) for h in haystack) for n in needles)


def sets_contains(a: Any, b: Any) -> bool:
    """Whether every element of ``b`` is in ``a``."""
    return _contains_all(_list("sets.contains", a, b), _list("sets.contains", b, a))


def sets_equivalent(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` hold the same elements (ignoring order and repeats)."""
    x, y = _list("sets.equivalent", a, b), _list("sets.equivalent", b, a)
    return _contains_all(x, y) and _contains_all(y, x)


def sets_intersects(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` share an element."""
    x, y = _list("sets.intersects", a, b), _list("sets.intersects", b, a)
    return any(any(cel_eq(p, q) for q in y) for p in x)


MEMBER: dict[str, Function] = {
    "isSorted": is_sorted,
    "sum": sum_,
    "min": min_,
    "max": max_,
    "indexOf": index_of,
    "lastIndexOf": last_index_of,
    "slice": slice_,
    "flatten": flatten,
    "distinct": distinct,
    "reverse": reverse,
    "sort": sort,
    "includes": includes,
}

GLOBAL: dict[str, Function] = {
    "lists.range": lists_range,
    "sets.contains": sets_contains,
    "sets.equivalent": sets_equivalent,
    "sets.intersects": sets_intersects,
}
