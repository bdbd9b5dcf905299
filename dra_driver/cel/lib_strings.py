"""The CEL strings extension (version 2): indices count code points, not bytes."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from dra_driver.cel import checker
from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.types import DURATION, TIMESTAMP, type_name

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


#: Go's unicode.IsSpace, which trim() uses: Python's str.strip() also strips U+001C-U+001F.
GO_SPACES = (
    "\t\n\v\f\r \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def trim(text: Any) -> str:
    """Leading and trailing white space removed, as Go's unicode.IsSpace defines it."""
    return _text("trim", text).strip(GO_SPACES)


def join(items: Any, sep: Any = "") -> str:
    """The strings of a list joined by ``sep``."""
    d = _text("join", sep)
    if not isinstance(items, list | tuple):
        raise NoSuchOverload("join", items, sep)
    try:
        # str.join refuses any element that is not a string (CEL strings are plain str).
        return d.join(items)
    except TypeError:
        raise NoSuchOverload("join", items, sep) from None


def quote(text: Any) -> str:
    """``strings.quote``: the string as a double-quoted CEL literal (the extension escapes
    ``\\a \\b \\f \\n \\r \\t \\v``, the backslash and the double quote; everything else stays)."""
    return '"' + _text("strings.quote", text).translate(_QUOTE_ESCAPES) + '"'


_QUOTE_ESCAPES = str.maketrans(
    {c: "\\" + e for c, e in zip('\a\b\f\n\r\t\v\\"', 'abfnrtv\\"', strict=True)}
)


def _clauses(text: str) -> list[tuple[str, str | None] | str]:
    """The literal pieces and ``(verb, precision)`` clauses of a format string."""
    out: list[tuple[str, str | None] | str] = []
    i = 0
    while i < len(text):
        c = text[i]
        i += 1
        if c != "%":
            out.append(c)
            continue
        if i >= len(text):
            raise EvalError("unexpected end of string")
        match = _CLAUSE.match(text, i)
        if match is None:
            raise EvalError(
                f'could not parse formatting clause: unrecognized formatting clause "{text[i]}"'
            )
        i = match.end()
        out.append("%" if match.group(2) == "%" else (match.group(2), match.group(1)))
    return out


def _check_count(used: int, given: int) -> None:
    if used > given:
        raise EvalError(f"index {given} out of range")
    if used < given:
        raise EvalError(
            f"too many arguments supplied to string.format (expected {used}, got {given})"
        )


def format_string(text: Any, args: Any) -> str:
    """``"...".format([args])`` with the clauses %s %d %f %e %b %o %x %X and %%, and the
    strings extension's rules for which types each clause takes."""
    s = _text("format", text)
    if not isinstance(args, list | tuple):
        raise NoSuchOverload("format", text, args)
    out: list[str] = []
    used = 0
    for piece in _clauses(s):
        if isinstance(piece, str):
            out.append(piece)
            continue
        if used >= len(args):
            raise EvalError(f"index {used} out of range")
        verb, precision = piece
        out.append(_format_one(verb, precision, args[used]))
        used += 1
    _check_count(used, len(args))
    return "".join(out)


def format_static_error(text: str, kinds: list[str]) -> str | None:
    """What the scheduler reports while compiling ``text.format([...])`` whose elements have
    the static types ``kinds``: a bad clause, a wrong count, a clause given a type it never
    takes (``dyn`` takes anything). None when only evaluation can tell."""
    try:
        clauses = [p for p in _clauses(text) if not isinstance(p, str)]
        _check_count(len(clauses), len(kinds))
    except EvalError as exc:
        return str(exc)
    for (verb, _), kind in zip(clauses, kinds, strict=True):
        refused = _refused(verb, kind)
        if refused is not None:
            return _type_error(verb, refused)
    return None


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
    "null",  # the static type of the null literal
    DURATION,
    TIMESTAMP,
)
#: The types each clause takes; %f and %e take the strings "NaN", "Infinity", "-Infinity".
_TAKES: dict[str, tuple[str, ...]] = {
    "s": _TEXT_KINDS,
    "d": ("int", "uint"),
    "f": ("double", "string"),
    "e": ("double", "string"),
    "b": ("int", "uint", "bool"),
    "o": ("int", "uint"),
    "x": ("int", "uint", "string", "bytes"),
    "X": ("int", "uint", "string", "bytes"),
}
_WHAT = {
    "s": "string clause can only be used on strings, bools, bytes, ints, doubles, maps, "
    "lists, types, durations, and timestamps",
    "d": "decimal clause can only be used on integers",
    "f": "fixed-point clause can only be used on doubles",
    "e": "scientific clause can only be used on doubles",
    "b": "only integers and bools can be formatted as binary",
    "o": "octal clause can only be used on integers",
    "x": "only integers, byte buffers, and strings can be formatted as hex",
    "X": "only integers, byte buffers, and strings can be formatted as hex",
}
_SPECIAL_DOUBLES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _takes(verb: str, kind: str) -> bool:
    return _refused(verb, kind) is None


def _refused(verb: str, kind: str) -> str | None:
    """The type within ``kind`` that the clause cannot format (for %s, a list's or map's
    elements too), as the scheduler names it; None when it can."""
    if kind in (checker.DYN, checker.FREE):
        return None
    name, params = checker.split(kind)
    if name == "wrapper" and params:
        return _refused(verb, params[0])
    if name not in _TAKES[verb]:
        return name
    if verb == "s" and name in ("list", "map"):
        for param in params:
            inner = _refused(verb, param)
            if inner is not None:
                return inner
    return None


def _type_error(verb: str, kind: str) -> str:
    return f"error during formatting: {_WHAT[verb]}, was given {kind}"


def _format_one(verb: str, precision: str | None, value: Any) -> str:
    from dra_driver.cel.lib_core import to_string

    kind = type_name(value)
    special = kind == "string" and verb in "fe"
    if not _takes(verb, kind) or (special and value not in _SPECIAL_DOUBLES):
        raise EvalError(_type_error(verb, kind))
    if verb == "s":
        if kind in ("list", "map"):
            return _nested(value)
        if kind == "null_type":
            return "null"
        return str(value) if kind == "type" else to_string(value)
    if verb == "d":
        return str(int(value))
    if verb in "fe":
        number = _SPECIAL_DOUBLES[value] if kind == "string" else value
        if verb == "e":
            return _scientific(number)
        if math.isnan(number) or math.isinf(number):
            return "NaN" if math.isnan(number) else ("\u221e" if number > 0 else "-\u221e")
        digits = 6 if precision is None else int(precision)
        number = number or 0.0  # the scheduler's number printer drops the sign of -0.0
        return f"{number:,.{digits}f}"  # grouped in thousands, as the scheduler prints
    if kind == "bool":
        return "1" if value else "0"
    if kind in ("int", "uint"):
        return format(int(value), verb)
    data = value.encode() if isinstance(value, str) else value
    hexed = data.hex()
    return hexed.upper() if verb == "X" else hexed


def _nested(value: Any) -> str:
    """A list or map element as %s shows it: strings quoted, doubles in fixed point, map keys
    sorted by their text, durations and timestamps as the call that makes them."""
    from dra_driver.cel.lib_core import to_string

    kind = type_name(value)
    if kind == "list":
        return "[" + ", ".join(_nested(v) for v in value) + "]"
    if kind == "map":
        for key in value:
            if type_name(key) not in ("string", "bool", "int", "uint"):
                raise EvalError(
                    "error during formatting: no formatting function for map key of type "
                    + type_name(key)
                )
        entries = sorted((_nested(k), _nested(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}:{v}" for k, v in entries) + "}"
    if kind == "string":
        return go_quote(value)
    if kind == "bytes":
        try:
            return "b" + go_quote(value.decode("utf-8"))
        except UnicodeDecodeError:
            raise EvalError(
                'error during formatting: could not convert argument "invalid UTF-8 in bytes, '
                'cannot convert to string" to string'
            ) from None
    if kind == "double":
        if math.isnan(value) or math.isinf(value):
            return '"NaN"' if math.isnan(value) else ('"+Inf"' if value > 0 else '"-Inf"')
        return f"{value:.6f}"
    if kind in (DURATION, TIMESTAMP):
        call = "duration" if kind == DURATION else "timestamp"
        return f'{call}("{value}")'
    if kind == "null_type":
        return "null"
    if kind == "type":
        return str(value)
    if kind in ("bool", "int", "uint"):
        return to_string(value)
    raise EvalError(f"error during formatting: no formatting function for {kind}")


_QUOTED = {c: "\\" + e for c, e in zip("\a\b\f\n\r\t\v", "abfnrtv", strict=True)}


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote``: a double-quoted string with Go's escapes."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _QUOTED:
            out.append(_QUOTED[ch])
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def _scientific(value: float) -> str:
    # The scheduler's %e prints through a localising number printer: six decimals whatever
    # the precision asked, "\u00d7 10" and a superscript exponent of at least two digits; NaN and
    # the infinities right-aligned in six columns.
    if math.isnan(value) or math.isinf(value):
        text = "NaN" if math.isnan(value) else ("\u221e" if value > 0 else "-\u221e")
        return text.rjust(6)
    mantissa, _, exponent = f"{abs(value) if value == 0 else value:.6e}".partition("e")
    power = int(exponent)
    shown = f"{'-' if power < 0 else ''}{abs(power):02d}".translate(_SUPERSCRIPT)
    return f"{mantissa}\u00d710{shown}"


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
