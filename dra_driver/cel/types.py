"""The CEL types Python conflates or lacks, and the CEL name of any value.

Kept apart from :mod:`dra_driver.cel.values` so that the errors, which name the types of their
arguments, need nothing that raises them.
"""

from __future__ import annotations

from collections.abc import Mapping


class Uint(int):
    """A CEL ``uint``: an int that remembers it is unsigned."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


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
