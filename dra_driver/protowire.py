"""Protobuf's wire format, read without the message's schema: just enough to pick fields."""

from __future__ import annotations

from collections.abc import Iterator

#: Sizes of the fixed-width wire types: 1 (64-bit) and 5 (32-bit).
_FIXED = {1: 8, 5: 4}


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return value, i


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Each field of one message in order: its number, wire type and value (an int for a
    varint, the bytes otherwise). Raises ``ValueError`` on a truncated message or a wire
    type other than varint, 64-bit, length-delimited and 32-bit (groups are not read)."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2 or wire in _FIXED:
            if wire == 2:
                size, i = _varint(data, i)
            else:
                size = _FIXED[wire]
            value, i = data[i : i + size], i + size
            if len(value) != size:
                raise ValueError("truncated field")
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value
