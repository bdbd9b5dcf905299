"""Regular expressions: ``matches``, and the Kubernetes ``find`` / ``findAll`` functions.

The scheduler uses Go's RE2 syntax and semantics, so patterns run on RE2 itself (the
``google-re2`` bindings), not Python's ``re``: ``$`` does not match before a trailing newline,
``\\w`` and ``\\d`` are ASCII, POSIX classes, ``\\pL``, ``\\Q...\\E`` and ``\\z`` work, and
backtracking-only syntax (backreferences, lookaround, possessive ``a++``) is rejected.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]  # the bindings ship no type information

from dra_driver.cel.errors import EvalError, NoSuchOverload

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # errors are reported as values, not on stderr


@lru_cache(maxsize=512)
def compiled(pattern: str) -> Any:
    """The compiled pattern, or an :class:`EvalError` naming the bad pattern."""
    if "\\C" in pattern.replace("\\\\", ""):
        # RE2 (C++) takes \C, any byte; Go's regexp refuses it.
        raise EvalError(f"error parsing regexp: invalid escape sequence: `\\C`: `{pattern}`")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise EvalError(f"error parsing regexp: {reason}: `{pattern}`") from None


#: Longer texts are matched without caching: a device's strings are at most 64 characters,
#: and a selector that builds long ones (cel.bind, literals past the API's length) would
#: keep megabytes in the cache.
_CACHED_TEXT = 1024


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text``; cached for short texts because
    devices of one product share their strings and RE2's bindings cost microseconds a call."""
    if len(text) > _CACHED_TEXT:
        return compiled(pattern).search(text) is not None
    return _cached_search(pattern, text)


@lru_cache(maxsize=65536)
def _cached_search(pattern: str, text: str) -> bool:
    return compiled(pattern).search(text) is not None


def find(text: Any, pattern: Any) -> str:
    """The first match of ``pattern`` in ``text``, or ``""``."""
    if type(text) is not str or type(pattern) is not str:
        raise NoSuchOverload("find", text, pattern)
    match = compiled(pattern).search(text)
    return str(match.group(0)) if match else ""


def find_all(text: Any, pattern: Any, limit: Any = -1) -> list[str]:
    """All non-overlapping matches, at most ``limit`` of them when it is not negative."""
    if type(text) is not str or type(pattern) is not str or type(limit) is not int:
        raise NoSuchOverload("findAll", text, pattern, limit)
    regex = compiled(pattern)
    # Go's FindAllString: an empty match right after the previous match is skipped (Python's
    # finditer keeps it: "aaa" with "a*" is ["aaa"] there, ["aaa", ""] here).
    found: list[str] = []
    pos, previous_end = 0, -1
    while (limit < 0 or len(found) < limit) and pos <= len(text):
        match = regex.search(text, pos)
        if match is None:
            break
        start, end = match.span()
        accept = True
        if end == pos:
            accept = start != previous_end
            pos += 1
        else:
            pos = end
        previous_end = end
        if accept:
            found.append(str(match.group(0)))
    return found
