"""Protobuf message construction: the well-known types the scheduler's CEL knows.

``google.protobuf.Int64Value{value: 1}`` is the int 1 (wrappers unwrap to their value, the
default when unset); ``google.protobuf.Duration{seconds: 10}`` and ``Timestamp{...}`` are a
duration and a timestamp; ``Struct``, ``ListValue`` and ``Value`` are JSON maps, lists and
values, whose numbers are doubles. ``google.protobuf.Any`` unpacks to the value it holds
when that is a wrapper, a Duration or a Timestamp (or an empty Struct, ListValue or Value).
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver import protowire
from dra_driver.cel.errors import EvalError
from dra_driver.cel.optional import Optional
from dra_driver.cel.types import (
    GO_TYPE_NAMES,
    NANOS,
    CelType,
    Duration,
    Timestamp,
    Uint,
    type_name,
)
from dra_driver.cel.values import INT64_MAX, INT64_MIN

Fields = dict[str, Any]


@dataclass(frozen=True)
class Message:
    """A message type: its fields' static types, the value's static type, its builder."""

    fields: Mapping[str, str]
    result: str
    build: Callable[[Fields], Any]


def _wrapper(kind: str, zero: Any, check: Callable[[Any], Any] | None = None) -> Message:
    def build(fields: Fields) -> Any:
        value = fields.get("value", zero)
        return value if check is None else check(value)

    # Typed wrapper(T): usable as a T, and comparable with null.
    return Message({"value": kind}, f"wrapper({kind})", build)


def _ranged(name: str, low: int, high: int, error: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not low <= value <= high:
            raise EvalError(
                f"field type conversion error for google.protobuf.{name}.value value type: {error}"
            )
        return value

    return check


def _float32(value: Any) -> float:
    # A FloatValue holds a 32-bit float: the double is rounded (1.1 is then not 1.1).
    try:
        return float(struct.unpack("f", struct.pack("f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


#: How Go words a map key that JSON cannot have, by the key's type (its own words per type).
_KEY_ERRORS = {
    "int": "unsupported type conversion from 'int' to string",
    "uint": "unsupported type conversion from 'uint' to string",
    "bool": "type conversion error from bool to 'string'",
    "double": "type conversion error from Double to 'string'",
    "null_type": "type conversion error from 'null_type' to 'string'",
}


class _NoJson(EvalError):
    """A value without a JSON form; :func:`_json` words it as the scheduler does."""


def _json(value: Any, where: str) -> Any:
    """A CEL value as the ``google.protobuf.Value`` field ``where`` holds it (proto3 JSON:
    numbers are doubles, bytes base64, durations and timestamps their text), or the
    scheduler's "field type conversion error"."""
    try:
        return _to_json(value)
    except _NoJson as exc:
        raise EvalError(f"field type conversion error for {where} value type: {exc}") from None


def _to_json(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Duration | Timestamp):
        return str(value)
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _NoJson(
                    _KEY_ERRORS.get(
                        type_name(key), f"type conversion error from {type_name(key)} to 'string'"
                    )
                )
            out[key] = _to_json(item)
        return out
    if isinstance(value, Optional):
        if not value.has_value():
            raise _NoJson("optional.none() dereference")
        return _to_json(value.value)
    if isinstance(value, CelType):
        raise _NoJson("type conversion not supported for 'type'")
    name = GO_TYPE_NAMES.get(type_name(value), type_name(value))
    raise _NoJson(f"type conversion error from {name!r} to '*structpb.Value'")


def _nanos(name: str, fields: Fields) -> int:
    # The nanos field is an int32.
    nanos: int = fields.get("nanos", 0)
    if not _INT32[0] <= nanos <= _INT32[1]:
        raise EvalError(
            f"field type conversion error for google.protobuf.{name}.nanos value type: "
            "integer overflow"
        )
    return nanos


def _duration(fields: Fields) -> Duration:
    # Saturates at the int64 nanosecond range, as Go's durationpb.AsDuration does.
    nanos = fields.get("seconds", 0) * NANOS + _nanos("Duration", fields)
    return Duration(min(max(nanos, INT64_MIN), INT64_MAX))


def _timestamp(fields: Fields) -> Timestamp:
    return Timestamp(fields.get("seconds", 0) * NANOS + _nanos("Timestamp", fields))


def _value(fields: Fields) -> Any:
    # A oneof: the field set last wins; none set is null.
    value: Any = None
    for name, given in fields.items():
        value = None if name == "null_value" else _json(given, f"google.protobuf.Value.{name}")
    return value


_INT32 = (-(2**31), 2**31 - 1)


_TEXT_OBJECTS = frozenset(
    ("kubernetes.Semver", "kubernetes.Quantity", "net.IP", "net.CIDR", "kubernetes.URL")
)


def field_value(message: str, field: str, expected: str, value: Any) -> Any:
    """``value`` when it fits the field's type (checked at runtime for dyn values), else the
    scheduler's "field type conversion error"."""
    want = expected.split("(", 1)[0]
    kind = type_name(value)
    if want == "dyn" or kind == want:
        return value
    # Go converts these natively: Kubernetes' object types to their text, an empty list to
    # empty bytes (a list of ints is refused: they are not uint8 there).
    if want == "string" and kind in _TEXT_OBJECTS:
        return value.text if kind == "kubernetes.URL" else str(value)
    if want == "bytes" and kind == "list" and not value:
        return b""
    raise EvalError(
        f"field type conversion error for {message}.{field} value type: "
        f"unsupported conversion from {type_name(value)!r} to {want!r}"
    )


# -- google.protobuf.Any: the packed message in protobuf's wire format -------------------------

#: Field number 1 of each wrapper, as decoded from the wire: the wire type and the conversion.
_WRAPPED: dict[str, tuple[int, Callable[[Any], Any]]] = {
    "BoolValue": (0, lambda v: v != 0),
    "BytesValue": (2, bytes),
    "DoubleValue": (1, lambda v: struct.unpack("<d", v)[0]),
    "FloatValue": (5, lambda v: struct.unpack("<f", v)[0]),
    "Int32Value": (0, lambda v: (v + 2**31) % 2**32 - 2**31),
    "Int64Value": (0, lambda v: (v + 2**63) % 2**64 - 2**63),
    "StringValue": (2, lambda v: v.decode("utf-8")),
    "UInt32Value": (0, lambda v: Uint(v % 2**32)),
    "UInt64Value": (0, lambda v: Uint(v % 2**64)),
}


def _wire_fields(data: bytes) -> dict[int, tuple[int, Any]]:
    """Field number -> (wire type, raw value); the last occurrence wins, as in proto3."""
    return {number: (wire, value) for number, wire, value in protowire.fields(data)}


def _unpack(fields: Fields) -> Any:
    url, packed = fields.get("type_url", ""), fields.get("value", b"")
    name = url.rpartition("/")[2].removeprefix("google.protobuf.")
    try:
        wire = _wire_fields(packed)
        if name in _WRAPPED:
            kind, convert = _WRAPPED[name]
            found = wire.get(1)
            message = MESSAGES[f"google.protobuf.{name}"]
            if found is None:
                return message.build({})
            if found[0] != kind:
                raise ValueError("wire type")
            return message.build({"value": convert(found[1])})
        if name in ("Duration", "Timestamp"):
            numbers = {"seconds": 1, "nanos": 2}
            given = {f: wire[n][1] for f, n in numbers.items() if n in wire and wire[n][0] == 0}
            seconds = (given.get("seconds", 0) + 2**63) % 2**64 - 2**63
            nanos = (given.get("nanos", 0) + 2**31) % 2**32 - 2**31
            build = _duration if name == "Duration" else _timestamp
            return build({"seconds": seconds, "nanos": nanos})
        if name in ("Struct", "ListValue", "Value") and not wire:
            return MESSAGES[f"google.protobuf.{name}"].build({})
    except (ValueError, struct.error, UnicodeDecodeError):
        pass
    raise EvalError(f"unsupported conversion to ref.Val: google.protobuf.Any with type_url {url!r}")


MESSAGES: dict[str, Message] = {
    "google.protobuf.BoolValue": _wrapper("bool", False),
    "google.protobuf.BytesValue": _wrapper("bytes", b""),
    "google.protobuf.DoubleValue": _wrapper("double", 0.0),
    "google.protobuf.FloatValue": _wrapper("double", 0.0, _float32),
    "google.protobuf.Int32Value": _wrapper(
        "int", 0, _ranged("Int32Value", *_INT32, "integer overflow")
    ),
    "google.protobuf.Int64Value": _wrapper("int", 0),
    "google.protobuf.StringValue": _wrapper("string", ""),
    "google.protobuf.UInt32Value": _wrapper(
        "uint", Uint(0), _ranged("UInt32Value", 0, 2**32 - 1, "unsigned integer overflow")
    ),
    "google.protobuf.UInt64Value": _wrapper("uint", Uint(0)),
    "google.protobuf.Duration": Message(
        {"seconds": "int", "nanos": "int"}, "google.protobuf.Duration", _duration
    ),
    "google.protobuf.Timestamp": Message(
        {"seconds": "int", "nanos": "int"}, "google.protobuf.Timestamp", _timestamp
    ),
    "google.protobuf.Struct": Message(
        {"fields": "map(string, dyn)"},
        "map(string, dyn)",
        lambda f: _json(f.get("fields", {}), "google.protobuf.Struct.fields"),
    ),
    "google.protobuf.ListValue": Message(
        {"values": "list(dyn)"},
        "list(dyn)",
        lambda f: _json(f.get("values", []), "google.protobuf.ListValue.values"),
    ),
    "google.protobuf.Value": Message(
        {
            "null_value": "int",
            "number_value": "double",
            "string_value": "string",
            "bool_value": "bool",
            "struct_value": "map(string, dyn)",
            "list_value": "list(dyn)",
        },
        "dyn",
        _value,
    ),
}

MESSAGES["google.protobuf.Any"] = Message(
    {"type_url": "string", "value": "bytes"}, "google.protobuf.Any", _unpack
)

#: Enum constants, which are ints: ``google.protobuf.NullValue.NULL_VALUE``.
CONSTANTS: dict[str, int] = {"google.protobuf.NullValue.NULL_VALUE": 0}
