"""Which GPUs a node shares by memory: the ``--shared-gpus`` (``DRA_SHARED_GPUS``) value.

Empty (the default) shares none. The value is one or more terms separated by ``;``, and a GPU
is shared if any term matches it:

- ``all``: every GPU
- ``index:0,1``: GPUs by NVML index
- ``uuid:GPU-1234...,GPU-5678...``: GPUs by UUID
- ``model:L4,H100``: GPUs whose product name contains one of the texts (case-insensitive)

Kept apart from the sharing logic so that start-up checks the value without loading it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dra_driver.errors import StartError

if TYPE_CHECKING:
    from dra_driver.gpu.inventory import Gpu


class SelectionError(StartError, ValueError):
    """A ``--shared-gpus`` value that does not parse; the message shows the syntax."""


@dataclass(frozen=True)
class Selection:
    """A parsed ``--shared-gpus`` value."""

    all: bool = False
    indices: frozenset[int] = frozenset()
    uuids: frozenset[str] = frozenset()
    models: tuple[str, ...] = ()

    def matches(self, gpu: Gpu) -> bool:
        """Whether ``gpu`` is selected."""
        name = gpu.product_name.lower()
        return (
            self.all
            or gpu.index in self.indices
            or gpu.uuid in self.uuids
            or any(m in name for m in self.models)
        )

    @property
    def empty(self) -> bool:
        """Whether nothing is shared."""
        return self == Selection()


SYNTAX = "all | index:<i>[,<i>...] | uuid:<uuid>[,...] | model:<text>[,...], terms separated by ';'"


def parse_selection(text: str) -> Selection:
    """Parse a ``--shared-gpus`` value (see the module docstring)."""
    selection = Selection()
    for term in filter(None, (t.strip() for t in text.split(";"))):
        if term == "all":
            selection = dataclasses.replace(selection, all=True)
            continue
        kind, sep, values = term.partition(":")
        items = [v.strip() for v in values.split(",") if v.strip()] if sep else []
        if not items:
            raise SelectionError(f"--shared-gpus: {term!r} is not a term of: {SYNTAX}")
        if kind == "index":
            if not all(i.isdigit() for i in items):
                raise SelectionError(f"--shared-gpus: {term!r}: indices are whole numbers")
            selection = dataclasses.replace(
                selection, indices=selection.indices | {int(i) for i in items}
            )
        elif kind == "uuid":
            selection = dataclasses.replace(selection, uuids=selection.uuids | set(items))
        elif kind == "model":
            # A list, as index: and uuid: take: "L4,H100" is in no product name.
            selection = dataclasses.replace(
                selection, models=(*selection.models, *(m.lower() for m in items))
            )
        else:
            raise SelectionError(f"--shared-gpus: unknown term {kind!r}; use {SYNTAX}")
    return selection
