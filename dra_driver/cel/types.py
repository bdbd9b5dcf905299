"""The CEL types Python conflates or lacks, and the CEL name of any value.

Kept apart from :mod:`dra_driver.cel.values` so that the errors, which name the types of their
arguments, need nothing that raises them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import total_ordering

NANOS = 1_000_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TIMESTAMP = "google.protobuf.Timestamp"
DURATION = "google.protobuf.Duration"


class Uint(int):
    """A CEL ``uint``: an int that remembers it is unsigned."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


class Printable:
    """A value ``string()`` converts with ``str()``: durations, timestamps, IPs and CIDRs."""

    __slots__ = ()


@total_ordering
@dataclass(frozen=True, eq=False)
class Duration(Printable):
    """A CEL ``google.protobuf.Duration``: nanoseconds within int64."""

    nanos: int
    cel_type_name = DURATION

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and other.nanos == self.nanos

    def __lt__(self, other: Duration) -> bool:
        return self.nanos < other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __str__(self) -> str:
        # Go: strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s".
        whole, rest = divmod(abs(self.nanos), NANOS)
        seconds = (whole + rest / 1e9) * (-1 if self.nanos < 0 else 1)
        text = format(Decimal(repr(seconds)), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return ("0" if text in ("-0", "") else text) + "s"


@total_ordering
@dataclass(frozen=True, eq=False)
class Timestamp(Printable):
    """A CEL ``google.protobuf.Timestamp``: Unix nanoseconds and the offset it was written in."""

    nanos: int
    offset: int = 0  # seconds east of UTC, for printing only
    cel_type_name = TIMESTAMP

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timestamp) and other.nanos == self.nanos

    def __lt__(self, other: Timestamp) -> bool:
        return self.nanos < other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __str__(self) -> str:
        # Go's RFC3339Nano: trailing zeros of the fraction dropped, "Z" for a zero offset.
        seconds, fraction = divmod(self.nanos, NANOS)
        local = EPOCH + timedelta(seconds=seconds + self.offset)
        text = (
            f"{local.year:04d}-{local.month:02d}-{local.day:02d}"
            f"T{local.hour:02d}:{local.minute:02d}:{local.second:02d}"
        )
        if fraction:
            text += "." + f"{fraction:09d}".rstrip("0")
        if self.offset == 0:
            return text + "Z"
        sign = "-" if self.offset < 0 else "+"
        hours, minutes = divmod(abs(self.offset) // 60, 60)
        return f"{text}{sign}{hours:02d}:{minutes:02d}"


#: Go's names (package ``cel`` of Kubernetes) of the Kubernetes CEL types, as the scheduler's
#: conversion and qualifier errors print them.
GO_TYPE_NAMES = {
    "kubernetes.Semver": "Semver",
    "kubernetes.Quantity": "Quantity",
    "net.IP": "IP",
    "net.CIDR": "CIDR",
    "kubernetes.URL": "URL",
    "kubernetes.NamedFormat": "Format",
}


class CelType:
    """A CEL type value, as returned by ``type(x)`` and named by ``int``, ``string``, ..."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name


def type_name(value: object) -> str:
    """The CEL type name of a value."""
    if value is None:
        return "null_type"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Uint):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, CelType):
        return "type"
    name = getattr(type(value), "cel_type_name", None)
    return name if isinstance(name, str) else type(value).__name__
