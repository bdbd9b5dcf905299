"""Regular expressions: ``matches``, and the Kubernetes ``find`` / ``findAll`` functions.

Patterns are compiled once and cached. Python's ``re`` stands in for RE2; the two agree on the
syntax selectors use (classes, anchors, repetition, groups); RE2-only rejections such as
backreferences are reported as errors here too.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from dra_driver.cel.errors import EvalError, NoSuchOverload


@lru_cache(maxsize=512)
def compiled(pattern: str) -> re.Pattern[str]:
    """The compiled pattern, or an :class:`EvalError` naming the bad pattern."""
    if re.search(r"\\[1-9]|\(\?[=!<]|\(\?P=", pattern):
        raise EvalError(
            f"invalid regular expression (RE2 has no lookaround/backreferences): {pattern!r}"
        )
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise EvalError(f"invalid regular expression {pattern!r}: {exc}") from None


def find(text: Any, pattern: Any) -> str:
    """The first match of ``pattern`` in ``text``, or ``""``."""
    if type(text) is not str or type(pattern) is not str:
        raise NoSuchOverload("find", text, pattern)
    match = compiled(pattern).search(text)
    return match.group(0) if match else ""


def find_all(text: Any, pattern: Any, limit: Any = -1) -> list[str]:
    """All non-overlapping matches, at most ``limit`` of them when it is not negative."""
    if type(text) is not str or type(pattern) is not str or type(limit) is not int:
        raise NoSuchOverload("findAll", text, pattern, limit)
    if limit == 0:
        return []
    found = [m.group(0) for m in compiled(pattern).finditer(text)]
    return found if limit < 0 else found[:limit]
