"""The ``dra-driver`` command: the node agent and the tools around it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from dra_driver import logs
from dra_driver.gpu.discovery import DiscoveryError, make_discovery
from dra_driver.settings import Settings, SettingsError, add_arguments, from_namespace

Command = Callable[[Settings], int]

_DISCOVERY = ("backend", "profile", "node_name")
_LOGGING = ("log_format", "log_level")


def _print(obj: Any, output: str) -> None:
    if output == "json":
        print(json.dumps(obj, indent=2))
    else:
        print(yaml.safe_dump_all(obj if isinstance(obj, list) else [obj], sort_keys=False), end="")


def _discover(settings: Settings) -> int:
    from dra_driver.gpu.table import inventory_table

    inventory = make_discovery(
        settings.backend, node_name=settings.node_name or "node", profile=settings.profile
    ).discover()
    if settings.output == "table":
        print(inventory_table(inventory))
    else:
        _print(inventory.model_dump(mode="json"), settings.output)
    return 0


def _slices(settings: Settings) -> int:
    from dra_driver.gpu.devices import desired_pool
    from dra_driver.resourceslice.pool import render_pool

    if not settings.node_name:
        raise SettingsError("--node-name (DRA_NODE_NAME) is required")
    inventory = make_discovery(
        settings.backend, node_name=settings.node_name, profile=settings.profile
    ).discover()
    slices = render_pool(desired_pool(inventory, settings.node_name, settings.driver_name))
    _print(slices, settings.output)
    return 0


# name -> (help, settings fields, per-command defaults, implementation)
COMMANDS: dict[str, tuple[str, tuple[str, ...], dict[str, Any], Command]] = {
    "discover": (
        "print the node's GPU inventory",
        (*_DISCOVERY, "output", *_LOGGING),
        {},
        _discover,
    ),
    "slices": (
        "print the ResourceSlices the driver would publish for this node",
        (*_DISCOVERY, "driver_name", "output", *_LOGGING),
        {"output": "yaml"},
        _slices,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog="dra-driver",
        description="Kubernetes DRA driver for NVIDIA GPUs. "
        "Every flag can also be set as an environment variable DRA_<FLAG_NAME>.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, fields, overrides, _) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(command_parser, fields, **overrides)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dra-driver`` console script."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    _, fields, _, command = COMMANDS[ns.command]
    try:
        settings = from_namespace(ns, fields)
        logs.configure(settings.log_format, settings.log_level)
        return command(settings)
    except (SettingsError, DiscoveryError) as exc:
        print(f"dra-driver {ns.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
