"""The function tables of the DRA environment: global calls, member calls and return types.

A member call ``x.f(a)`` looks up ``f`` in :data:`MEMBER` and calls it with the receiver first,
``f(x, a)``; namespaced globals such as ``sets.contains`` are keyed by their dotted name. Names
two libraries share (``indexOf`` for strings and lists) dispatch on the receiver's type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_driver.cel import (
    lib_core,
    lib_format,
    lib_k8s,
    lib_lists,
    lib_net,
    lib_strings,
    lib_time,
    lib_url,
    optional,
)

Function = Callable[..., Any]


def _string_or_list(string_fn: Function, list_fn: Function) -> Function:
    def dispatch(receiver: Any, *args: Any) -> Any:
        return (string_fn if type(receiver) is str else list_fn)(receiver, *args)

    dispatch.__doc__ = string_fn.__doc__
    return dispatch


GLOBAL: dict[str, Function] = {
    **lib_core.GLOBAL,
    **lib_strings.GLOBAL,
    **lib_lists.GLOBAL,
    **lib_k8s.GLOBAL,
    **lib_time.GLOBAL,
    **lib_net.GLOBAL,
    **lib_url.GLOBAL,
    **lib_format.GLOBAL,
    **optional.GLOBAL,
}

MEMBER: dict[str, Function] = {
    **lib_core.MEMBER,
    **lib_strings.MEMBER,
    **lib_lists.MEMBER,
    **lib_k8s.MEMBER,
    **lib_time.MEMBER,
    **lib_net.MEMBER,
    **lib_url.MEMBER,
    **lib_format.MEMBER,
    **optional.MEMBER,
    "indexOf": _string_or_list(lib_strings.index_of, lib_lists.index_of),
    "lastIndexOf": _string_or_list(lib_strings.last_index_of, lib_lists.last_index_of),
}


#: Namespaces of dotted global functions (``sets.contains``), and the ``cel.bind`` macro.
NAMESPACES = frozenset(name.split(".", 1)[0] for name in GLOBAL if "." in name) | {"cel"}
