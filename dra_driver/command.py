"""What a ``dra-driver`` subcommand is: its settings fields, extra arguments and entry point.

Kept free of heavy imports so that building the parser stays fast; a command imports what it
needs inside ``run``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.settings import Settings


@dataclass(frozen=True)
class Command:
    """One subcommand."""

    help: str
    #: Settings fields the command accepts (each a flag and a DRA_* variable).
    fields: tuple[str, ...]
    run: Callable[[Settings, argparse.Namespace], int]
    #: Per-command defaults for settings fields (e.g. ``output: yaml``).
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: Adds arguments that are not settings (positional files, command-specific flags).
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
