"""The argument parser's behaviour: no abbreviations, suggestions for typos, DRA_* variables.

argparse accepts any unambiguous prefix of a flag (``--prof`` for ``--profile``), so a
later flag can change what an old command line means; here flags must be spelt out, and a
misspelt one gets the closest real flag suggested. Every flag of a subcommand, not only the
settings fields, can be given as ``DRA_<FLAG_NAME>``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

from dra_driver.bindsettings import ENV_PREFIX
from dra_driver.exitcodes import USAGE
from dra_driver.settings import Settings, SettingsError, parse_bool

_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser without abbreviations that suggests the flag that was meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print usage and the error (with a suggestion for a misspelt flag), exit 2."""
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"{self.prog}: error: {message}{self._suggestion(message)}\n")

    def _suggestion(self, message: str) -> str:
        found = _UNRECOGNIZED.search(message)
        if not found:
            return ""
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        for word in found.group(1).split():
            if word.startswith("--"):
                close = difflib.get_close_matches(word.split("=")[0], flags, n=1, cutoff=0.6)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""


def env_for_flag(flag: str) -> str:
    """``--claim`` -> ``DRA_CLAIM``."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def apply_environment(
    parser: argparse.ArgumentParser,
    ns: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Fill flags that were not given on the command line from their DRA_* variables.

    Settings fields are resolved later (with their validation); this covers the other flags
    of a subcommand, such as ``match --class`` (``DRA_CLASS``).
    """
    env = os.environ if environ is None else environ
    # A variable must not add a second choice to flags that exclude each other.
    exclusive = {id(a) for group in parser._mutually_exclusive_groups for a in group._group_actions}
    for action in parser._actions:
        if id(action) in exclusive:
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.dest in ("help", "version") or action.dest.startswith("_"):
            continue
        if action.dest in Settings.model_fields:
            continue  # resolved with validation by settings.from_namespace
        name = env_for_flag(longs[0])
        if name not in env or getattr(ns, action.dest, None) not in (None, False):
            continue
        raw = env[name]
        value: Any = raw
        if isinstance(action, argparse._StoreTrueAction):
            value = parse_bool(raw, name)
        elif callable(action.type):
            try:
                value = action.type(raw)
            except ValueError:
                raise SettingsError(f"{name}: not a valid value (got {raw!r})") from None
        setattr(ns, action.dest, value)
