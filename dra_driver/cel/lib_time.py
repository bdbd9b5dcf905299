"""CEL's standard ``duration`` and ``timestamp`` types, as the scheduler's cel-go has them.

A duration is a signed count of nanoseconds that fits int64 (Go's ``time.Duration``); a
timestamp is an instant between the years 1 and 9999 that also remembers the UTC offset it
was written with, because ``string()`` prints it back in that offset. Getters read the
timestamp in UTC unless given a time zone: an IANA name or an offset such as ``+05:30``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from dra_driver.cel.errors import EvalError, NoSuchOverload
from dra_driver.cel.types import EPOCH as _EPOCH
from dra_driver.cel.types import NANOS as _NANOS
from dra_driver.cel.types import Duration, Timestamp
from dra_driver.cel.values import INT64_MAX, INT64_MIN

Function = Callable[..., Any]

#: 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z in Unix seconds.
_MIN_SECONDS = -62_135_596_800
_MAX_SECONDS = 253_402_300_799


def _duration(nanos: int) -> Duration:
    if not INT64_MIN <= nanos <= INT64_MAX:
        raise EvalError("integer overflow")
    return Duration(nanos)


def _timestamp(nanos: int, offset: int = 0) -> Timestamp:
    if not _MIN_SECONDS * _NANOS <= nanos < (_MAX_SECONDS + 1) * _NANOS:
        raise EvalError("timestamp overflow")
    return Timestamp(nanos, offset)


# -- parsing ---------------------------------------------------------------------------------

_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": _NANOS,
    "m": 60 * _NANOS,
    "h": 3600 * _NANOS,
}
_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")


def parse_duration(text: str) -> int:
    """Nanoseconds of a Go duration such as ``1h30m`` or ``-1.5s``; ValueError if invalid."""
    rest, negative = text, False
    if rest[:1] in ("+", "-"):
        negative, rest = rest[0] == "-", rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    while rest:
        match = _DURATION_PART.match(rest)
        assert match is not None  # every group may be empty
        whole, fraction, unit = match.groups()
        if (not whole and not fraction) or unit not in _UNITS:
            raise ValueError(f"invalid duration {text!r}")
        scale = _UNITS[unit]
        total += int(whole or "0") * scale
        if fraction:
            total += int(int(fraction) * scale / 10 ** len(fraction))
        if total > 2**63:
            raise ValueError(f"invalid duration {text!r}")
        rest = rest[match.end() :]
    if negative:
        return -total
    if total > INT64_MAX:
        raise ValueError(f"invalid duration {text!r}")
    return total


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?(?:Z|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)


def parse_timestamp(text: str) -> Timestamp:
    """An RFC 3339 time as Go's ``time.Parse(time.RFC3339, ...)`` reads it; ValueError if not."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValueError(f"invalid timestamp {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"invalid timestamp {text!r}")
    offset = 0
    if m.group(8):
        oh, om = int(m.group(9)), int(m.group(10))
        if oh > 24 or om > 60:
            raise ValueError(f"invalid timestamp {text!r}")
        offset = (oh * 3600 + om * 60) * (-1 if m.group(8) == "-" else 1)
    try:
        local = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        raise ValueError(f"invalid timestamp {text!r}") from None
    fraction = int((m.group(7) or "0")[:9].ljust(9, "0"))
    seconds = int((local - _EPOCH).total_seconds()) - offset
    if not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
        raise ValueError(f"invalid timestamp {text!r}")
    return Timestamp(seconds * _NANOS + fraction, offset)


_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)


def parse_date(text: str) -> bool:
    """Whether ``text`` is a date as Go's ``time.Parse("2006-01-02", ...)`` reads it."""
    m = _DATE.fullmatch(text)
    if m is None:
        return False
    try:
        datetime(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return False
    return True


# -- functions -------------------------------------------------------------------------------


def duration(value: Any) -> Duration:
    """``duration("1h30m")`` or ``duration(d)``."""
    if isinstance(value, Duration):
        return value
    if type(value) is not str:
        raise NoSuchOverload("duration", value)
    try:
        return Duration(parse_duration(value))
    except ValueError:
        raise EvalError(
            "type conversion error from 'string' to 'google.protobuf.Duration'"
        ) from None


def timestamp(value: Any) -> Timestamp:
    """``timestamp("2024-01-01T00:00:00Z")``, ``timestamp(unix_seconds)`` or ``timestamp(t)``."""
    if isinstance(value, Timestamp):
        return value
    if type(value) is str:
        try:
            return parse_timestamp(value)
        except ValueError:
            raise EvalError(
                "type conversion error from 'string' to 'google.protobuf.Timestamp'"
            ) from None
    if type(value) is int:
        if not _MIN_SECONDS <= value <= _MAX_SECONDS:
            raise EvalError("timestamp overflow")
        return Timestamp(value * _NANOS)
    raise NoSuchOverload("timestamp", value)


def literal_error(name: str, value: Any) -> str | None:
    """Why a literal argument of ``duration``/``timestamp`` is invalid, or None.

    The scheduler checks these literals while compiling ("invalid duration argument").
    """
    try:
        (duration if name == "duration" else timestamp)(value)
    except EvalError:
        return f"invalid {name} argument"
    return None


def to_int(value: Duration | Timestamp) -> int:
    """``int(d)`` in nanoseconds, ``int(t)`` in Unix seconds."""
    if isinstance(value, Duration):
        return value.nanos
    return value.nanos // _NANOS


def add(a: Any, b: Any) -> Duration | Timestamp:
    """``_+_`` of durations and timestamps; NoSuchOverload for other pairs."""
    if isinstance(a, Duration) and isinstance(b, Duration):
        return _duration(a.nanos + b.nanos)
    if isinstance(a, Timestamp) and isinstance(b, Duration):
        return _timestamp(a.nanos + b.nanos, a.offset)
    if isinstance(a, Duration) and isinstance(b, Timestamp):
        return _timestamp(a.nanos + b.nanos, b.offset)
    raise NoSuchOverload("_+_", a, b)


def subtract(a: Any, b: Any) -> Duration | Timestamp:
    """``_-_`` of durations and timestamps; NoSuchOverload for other pairs."""
    if isinstance(a, Duration) and isinstance(b, Duration):
        return _duration(a.nanos - b.nanos)
    if isinstance(a, Timestamp) and isinstance(b, Duration):
        return _timestamp(a.nanos - b.nanos, a.offset)
    if isinstance(a, Timestamp) and isinstance(b, Timestamp):
        return _duration(a.nanos - b.nanos)
    raise NoSuchOverload("_-_", a, b)


def _zone(name: Any) -> tzinfo:
    if type(name) is not str:
        raise NoSuchOverload("timezone", name)
    hours, colon, minutes = name.partition(":")
    if not colon:
        if name in ("", "UTC"):
            return UTC
        try:
            return ZoneInfo(name)
        except (ValueError, KeyError, OSError):  # ZoneInfoNotFoundError is a KeyError
            raise EvalError(f"unknown time zone {name}") from None
    # An offset: the hours and minutes as Go's strconv.Atoi reads them; a leading "-" makes
    # the whole offset negative.
    h, m = _atoi(hours), _atoi(minutes)
    offset = h * 60 - m if name.startswith("-") else h * 60 + m
    return timezone(timedelta(minutes=offset))


_ATOI = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _atoi(text: str) -> int:
    if not _ATOI.fullmatch(text) or not INT64_MIN <= int(text) <= INT64_MAX:
        raise EvalError(f'strconv.Atoi: parsing "{text}": invalid syntax')
    return int(text)


@dataclass(frozen=True)
class Civil:
    """A timestamp read on a wall clock: the fields the getters return."""

    year: int
    month: int  # 1-12
    day: int  # 1-31
    day_of_year: int  # 0-365
    day_of_week: int  # 0 = Sunday
    hour: int
    minute: int
    second: int
    millisecond: int


def _days_from_civil(year: int, month: int, day: int) -> int:
    # Days since 1970-01-01 in the proleptic Gregorian calendar, for any year (Go reads
    # timestamps near the range's ends in years 0 and 10000 too, which datetime cannot).
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def civil(nanos: int, offset: int) -> Civil:
    """The wall-clock fields of Unix ``nanos`` at ``offset`` seconds east of UTC."""
    seconds, fraction = divmod(nanos, _NANOS)
    days, rest = divmod(seconds + offset, 86400)
    shifted = days + 719468
    era = shifted // 146097
    day_of_era = shifted - era * 146097
    year_of_era = (
        day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + 3 if shifted_month < 10 else shifted_month - 9
    year = year_of_era + era * 400 + (month <= 2)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return Civil(
        year=year,
        month=month,
        day=day,
        day_of_year=days - _days_from_civil(year, 1, 1),
        day_of_week=(days + 4) % 7,  # 1970-01-01 was a Thursday
        hour=hour,
        minute=minute,
        second=second,
        millisecond=fraction // 1_000_000,
    )


_OFFSET_RANGE = (datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC))


def _local(value: Any, name: str, zone: Any) -> Civil:
    if not isinstance(value, Timestamp):
        raise NoSuchOverload(name, value)
    if zone is None:
        return civil(value.nanos, 0)
    tz = _zone(zone)
    # The zone's offset at that instant (looked up within datetime's range).
    instant = _EPOCH + timedelta(microseconds=value.nanos // 1000)
    instant = min(max(instant, _OFFSET_RANGE[0]), _OFFSET_RANGE[1])
    shift = instant.astimezone(tz).utcoffset() or timedelta()
    return civil(value.nanos, int(shift.total_seconds()))


def _getter(name: str, field: str, unit: int | None) -> Function:
    """A getter for timestamps (with an optional zone) and, with ``unit``, for durations."""

    def get(value: Any, zone: Any = None) -> int:
        if isinstance(value, Duration) and unit is not None and zone is None:
            whole = abs(value.nanos) // unit  # truncated toward zero, as Go's conversions
            return -whole if value.nanos < 0 else whole
        local = _local(value, name, zone)
        result: int = getattr(local, field)
        return result - 1 if name in ("getMonth", "getDayOfMonth") else result

    get.__doc__ = f"``{name}()``"
    return get


MEMBER: dict[str, Function] = {
    "getFullYear": _getter("getFullYear", "year", None),
    "getMonth": _getter("getMonth", "month", None),  # 0-11
    "getDate": _getter("getDate", "day", None),  # 1-31
    "getDayOfMonth": _getter("getDayOfMonth", "day", None),  # 0-30
    "getDayOfWeek": _getter("getDayOfWeek", "day_of_week", None),
    "getDayOfYear": _getter("getDayOfYear", "day_of_year", None),
    "getHours": _getter("getHours", "hour", 3600 * _NANOS),
    "getMinutes": _getter("getMinutes", "minute", 60 * _NANOS),
    "getSeconds": _getter("getSeconds", "second", _NANOS),
    "getMilliseconds": _getter("getMilliseconds", "millisecond", 1_000_000),
}

GLOBAL: dict[str, Function] = {
    "duration": duration,
    "timestamp": timestamp,
}
