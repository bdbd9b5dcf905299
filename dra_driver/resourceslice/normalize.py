"""Canonical forms of ResourceSlice specs, so that what we send compares equal to what is stored.

The API server re-serialises quantities (``1024Mi`` comes back as ``1Gi``), omits empty, false
and empty-string optional fields, and stamps ``timeAdded`` on device taints. Comparing raw JSON
would see a difference on every reconcile and rewrite slices forever; comparing normalised specs
does not.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any

from dra_driver import quantity

JSON = dict[str, Any]

#: Maps keyed by user-chosen names; a path pattern writes one of their keys as ``*``.
NAMED_MAPS = frozenset({"attributes", "capacity", "counters"})

#: Subtrees whose string leaves are resource quantities (``nodeAllocatableResources``: its
#: overhead and multipliers; its one string, ``capacityKey``, is a name and never parses as one).
_QUANTITY_SUBTREES = frozenset({"capacity", "counters", "nodeAllocatableResources"})


@lru_cache(maxsize=4096)
def parse_quantity(text: str) -> int | Fraction | None:
    """The exact value of a Kubernetes quantity string (rounded as the API server rounds it,
    see :mod:`dra_driver.quantity`), or None if it is not one: an int when it is whole (most
    are, and ints compare in C, a Fraction in Python), else a Fraction; both compare by value.
    Cached: a pool repeats the same few quantities on every device."""
    try:
        nanos = quantity.parse_quantity(text).nanos
    except quantity.QuantityError:
        return None
    whole, rest = divmod(nanos, quantity.NANOS)
    return whole if not rest else Fraction(nanos, quantity.NANOS)


def _is_empty(value: Any, *, keep_false: bool) -> bool:
    if value is None:
        return True
    if value is False or value == "":
        # The server omits false and empty optional fields (a taint's ``value``); in attributes
        # (keep_false) a false or empty value is the attribute's value and stays.
        return not keep_false
    return isinstance(value, (dict, list)) and not value


#: Leaf types as JSON decodes them: checked by exact type first, because a large pool has
#: hundreds of thousands of leaves and an ``isinstance`` against ``Mapping`` is an ABC check.
_SCALARS = (str, int, float, bool, type(None))


def _normalize(value: Any, key: str, in_quantities: bool, in_attributes: bool) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        if in_quantities and kind is str:
            parsed = parse_quantity(value)
            if parsed is not None:
                return parsed
        return value
    if kind is dict or isinstance(value, Mapping):
        out: JSON = {}
        skip_time = key == "taints"
        for k, v in value.items():
            if skip_time and k == "timeAdded":
                # The server stamps the time a taint was added; it is not ours to compare.
                continue
            child = _normalize(
                v,
                k,
                # An attribute's name is the user's: one called "capacity" holds a string.
                in_quantities or (k in _QUANTITY_SUBTREES and key != "attributes"),
                in_attributes or k == "attributes",
            )
            if not _is_empty(child, keep_false=in_attributes):
                out[k] = child
        return out
    if kind is list or isinstance(value, list):
        return [_normalize(v, key, in_quantities, in_attributes) for v in value]
    if in_quantities and isinstance(value, str):
        parsed = parse_quantity(value)
        if parsed is not None:
            return parsed
    return value


def normalize_spec(spec: Mapping[str, Any]) -> JSON:
    """Return a canonical copy of a ResourceSlice spec for equality comparison.

    Quantities become exact numbers (ints, or Fractions for fractional ones, rounded as the
    API server rounds), empty and false optional fields disappear (except boolean attribute
    values, which carry meaning), and taint timestamps are ignored.
    """
    result = _normalize(spec, "", False, False)
    assert isinstance(result, dict)
    return result


def _strip(value: Any, tokens: list[str]) -> None:
    if not tokens or not isinstance(value, dict):
        return
    head, rest = tokens[0], tokens[1:]
    each = head.endswith("[]")
    name = head[:-2] if each else head
    targets: Iterable[Any]
    if name == "*":
        targets = list(value.values())
        if not rest:
            value.clear()
            return
    elif name not in value:
        return
    elif not rest and not each:
        del value[name]
        return
    else:
        targets = [value[name]]
    for target in targets:
        items = target if each and isinstance(target, list) else [target]
        for item in items:
            _strip(item, rest)


def strip_paths(spec: Mapping[str, Any], paths: Iterable[str]) -> JSON:
    """Return a deep-enough copy of ``spec`` without the fields named by ``paths``.

    A path is dot-separated; ``name[]`` descends into every element of a list and ``*`` into
    every value of a map, e.g. ``devices[].capacity.*.requestPolicy``.
    """
    paths = list(paths)
    if not paths:
        return dict(spec)  # nothing to strip: a copy of the top level is deep enough
    out = copy.deepcopy(dict(spec))
    for path in paths:
        _strip(out, path.split("."))
    return out
