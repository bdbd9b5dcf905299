"""The CEL strings extension (version 2): indices count code points, not bytes."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.types import type_name
from dra_driver.cel.values import format_value

Function = Callable[..., Any]


def _text(name: str, value: Any, *args: Any) -> str:
    if type(value) is not str:
        raise NoSuchOverload(name, value, *args)
    return value


def _int(name: str, value: Any, *args: Any) -> int:
    if type(value) is not int:
        raise NoSuchOverload(name, *args, value)
    return value


def char_at(text: Any, index: Any) -> str:
    """The character at ``index``; ``""`` at the end of the string."""
    s = _text("charAt", text, index)
    i = _int("charAt", index, text)
    if not 0 <= i <= len(s):
        raise EvalError(f"index out of range: {i}")
    return s[i : i + 1]


def index_of(text: Any, part: Any, offset: Any = 0) -> int:
    """First index of ``part`` at or after ``offset``, or -1."""
    s = _text("indexOf", text, part)
    p = _text("indexOf", part, text)
    start = _int("indexOf", offset, text, part)
    # The strings extension's rules: a negative offset is an error; the empty string is found
    # at the offset clamped to the end; an offset at or past the end finds nothing.
    if start < 0:
        raise EvalError(f"index out of range: {start}")
    if not p:
        return min(start, len(s))
    return -1 if start >= len(s) else s.find(p, start)


def last_index_of(text: Any, part: Any, offset: Any = None) -> int:
    """Last index of ``part`` starting at or before ``offset`` (default: the end), or -1."""
    s = _text("lastIndexOf", text, part)
    p = _text("lastIndexOf", part, text)
    if offset is None:
        if not p:
            return len(s)
        if len(s.encode()) < len(p.encode()):
            return -1
        offset = len(s) - 1
    end = _int("lastIndexOf", offset, text, part)
    if end < 0:
        raise EvalError(f"index out of range: {end}")
    if not p:
        return min(end, len(s))
    if end >= len(s):
        return -1
    return s.rfind(p, 0, min(end, len(s) - len(p)) + len(p))


def lower_ascii(text: Any) -> str:
    """ASCII letters lowered; other characters untouched."""
    s = _text("lowerAscii", text)
    return s.translate(_LOWER)


def upper_ascii(text: Any) -> str:
    """ASCII letters raised; other characters untouched."""
    s = _text("upperAscii", text)
    return s.translate(_UPPER)


_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_UPPER = {c: c - 32 for c in range(ord("a"), ord("z") + 1)}


def replace(text: Any, old: Any, new: Any, count: Any = -1) -> str:
    """Replace ``old`` with ``new``, at most ``count`` times when it is not negative."""
    s = _text("replace", text)
    o, n = _text("replace", old), _text("replace", new)
    limit = _int("replace", count)
    return s.replace(o, n, limit if limit >= 0 else -1)


def split(text: Any, sep: Any, count: Any = -1) -> list[str]:
    """Split like Go's ``strings.SplitN``: 0 parts -> [], negative -> all parts."""
    s, d = _text("split", text), _text("split", sep)
    n = _int("split", count)
    if n == 0:
        return []
    if d == "":
        chars = list(s)
        if 0 < n < len(chars):
            return [*chars[: n - 1], "".join(chars[n - 1 :])]
        return chars
    return s.split(d, n - 1 if n > 0 else -1)


def substring(text: Any, start: Any, end: Any = None) -> str:
    """Code points ``[start, end)``; an error when the range is outside the string."""
    s = _text("substring", text)
    a = _int("substring", start)
    b = len(s) if end is None else _int("substring", end)
    if not 0 <= a <= len(s):
        raise EvalError(f"index out of range: {a}")
    if not 0 <= b <= len(s):
        raise EvalError(f"index out of range: {b}")
    if a > b:
        raise EvalError(f"invalid substring range. start: {a}, end: {b}")
    return s[a:b]


def trim(text: Any) -> str:
    """Leading and trailing Unicode white space removed."""
    return _text("trim", text).strip()


def join(items: Any, sep: Any = "") -> str:
    """The strings of a list joined by ``sep``."""
    d = _text("join", sep)
    if not isinstance(items, list | tuple) or any(type(x) is not str for x in items):
        raise NoSuchOverload("join", items, sep)
    return d.join(items)


def quote(text: Any) -> str:
    """``strings.quote``: the string as a double-quoted CEL literal."""
    return format_value(_text("strings.quote", text))


def format_string(text: Any, args: Any) -> str:
    """``"...".format([args])`` with the clauses %s %d %f %e %b %o %x %X and %%, and the
    strings extension's rules for which types each clause takes."""
    s = _text("format", text)
    if not isinstance(args, list | tuple):
        raise NoSuchOverload("format", text, args)
    out: list[str] = []
    used = 0
    i = 0
    while i < len(s):
        c = s[i]
        i += 1
        if c != "%":
            out.append(c)
            continue
        match = _CLAUSE.match(s, i)
        if i >= len(s):
            raise EvalError("unexpected end of string")
        if match is None:
            raise EvalError(
                f'could not parse formatting clause: unrecognized formatting clause "{s[i]}"'
            )
        i = match.end()
        precision, verb = match.group(1), match.group(2)
        if verb == "%":
            out.append("%")
            continue
        if used >= len(args):
            raise EvalError(f"index {used} out of range")
        out.append(_format_one(verb, precision, args[used]))
        used += 1
    if used < len(args):
        raise EvalError(
            f"too many arguments supplied to string.format (expected {used}, got {len(args)})"
        )
    return "".join(out)


_CLAUSE = re.compile(r"(?:\.(\d+))?([sdfeboxX%])")
_TEXT_KINDS = (
    "string",
    "bool",
    "bytes",
    "int",
    "uint",
    "double",
    "list",
    "map",
    "type",
    "null_type",
)


def _format_one(verb: str, precision: str | None, value: Any) -> str:
    from dra_driver.cel.lib_core import to_string

    kind = type_name(value)
    if verb == "s":
        if kind not in _TEXT_KINDS:
            raise EvalError(
                "error during formatting: string clause can only be used on strings, bools, "
                "bytes, ints, doubles, maps, lists, types, durations, and timestamps, "
                f"was given {kind}"
            )
        if kind in ("list", "map"):
            return format_value(value)
        if kind == "null_type":
            return "null"
        return str(value) if kind == "type" else to_string(value)
    if verb == "d":
        if kind not in ("int", "uint"):
            raise EvalError(
                "error during formatting: decimal clause can only be used on integers, "
                f"was given {kind}"
            )
        return str(int(value))
    if verb in "fe":
        if kind != "double":
            clause = "fixed-point" if verb == "f" else "scientific"
            raise EvalError(
                f"error during formatting: {clause} clause can only be used on doubles, "
                f"was given {kind}"
            )
        digits = 6 if precision is None else int(precision)
        if math.isnan(value) or math.isinf(value):
            return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
        return f"{value:.{digits}{verb}}"
    if verb in "bo" and kind == "bool":
        return "1" if value else "0"
    if verb in "boxX" and kind in ("int", "uint"):
        return format(int(value), verb)
    if verb in "xX" and kind in ("string", "bytes"):
        data = value.encode() if isinstance(value, str) else value
        hexed = data.hex()
        return hexed.upper() if verb == "X" else hexed
    raise EvalError(f"error during formatting: clause %{verb} cannot format a {kind}")


MEMBER: dict[str, Function] = {
    "charAt": char_at,
    "indexOf": index_of,
    "lastIndexOf": last_index_of,
    "lowerAscii": lower_ascii,
    "upperAscii": upper_ascii,
    "replace": replace,
    "split": split,
    "substring": substring,
    "trim": trim,
    "join": join,
    "format": format_string,
}

GLOBAL: dict[str, Function] = {"strings.quote": quote}
