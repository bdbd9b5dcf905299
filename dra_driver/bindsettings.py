"""The few settings ``dra-driver run`` binds the kubelet's sockets with, read before the rest.

The kubelet registers a plugin as soon as its registration socket appears, and the full
settings model (pydantic) and the kubeconfig cost about half of the agent's start before
that. So ``run`` first reads only what the sockets and the log need: the driver and node
names, the kubelet's directories, the pod UID and the log format. They are checked as the
full settings check them; the agent binds, and then reads and checks everything else (and
that both readings agree). Whenever this reading is unsure (a bad value, a missing
kubeconfig, ``--help``) it answers None and ``run`` takes the full path, which reports the
problem before anything on the node changes.

This module imports only the standard library (and the error base class), on purpose.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, Protocol, cast, get_args

from dra_driver.errors import DriverError
from dra_driver.resourceapi import DNS_SUBDOMAIN

ENV_PREFIX = "DRA_"
DEFAULT_DRIVER_NAME = "gpu.dra.dev"
#: The NVIDIA DRA driver's name, which ``--compat nvidia`` publishes as.
NVIDIA_DRIVER_NAME = "gpu.nvidia.com"
#: A DNS subdomain of at most :data:`MAX_DRIVER_NAME` characters.
DRIVER_NAME_PATTERN = DNS_SUBDOMAIN
MAX_DRIVER_NAME = 63
MAX_NODE_NAME = 253
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_CDI_ROOT = Path("/var/run/cdi")
LogFormat = Literal["json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]


def env_name(field: str) -> str:
    """The environment variable behind a settings field."""
    return ENV_PREFIX + field.upper()


def flag_name(field: str) -> str:
    """The command-line flag behind a settings field."""
    return "--" + field.replace("_", "-")


#: The settings fields ``run`` takes, each a flag and a DRA_* variable.
RUN_FIELDS = (
    "backend",
    "profile",
    "node_name",
    "compat",
    "driver_name",
    "kubeconfig",
    "cdi_root",
    "plugins_dir",
    "registry_dir",
    "pod_uid",
    "driver_root",
    "host_driver_root",
    "metrics_port",
    "health_port",
    "ignored_xids",
    "health_recheck_interval",
    "dynamic_mig",
    "mig_binding_conditions",
    "mig_failure_hold",
    "mig_layout",
    "node_overhead",
    "list_attributes",
    "mig_profiles",
    "shared_gpus",
    "log_format",
    "log_level",
)

_DRIVER_NAME = re.compile(DRIVER_NAME_PATTERN)
_RUN_FLAGS = frozenset(flag_name(field) for field in RUN_FIELDS)


def compat_driver_name(compat: str, driver_name: str) -> str:
    """``--compat nvidia`` names the driver as the NVIDIA driver does, unless told otherwise
    (the default name counts as not told)."""
    if compat == "nvidia" and driver_name == DEFAULT_DRIVER_NAME:
        return NVIDIA_DRIVER_NAME
    return driver_name


def directory_problem(path: Path, flag: str) -> str | None:
    """What keeps ``path`` from being a directory the agent can use or create (read only),
    or None: it must be absolute and its nearest existing ancestor a writable directory."""
    if not path.is_absolute():
        return f"{flag}: {path} is not an absolute path"
    existing = path
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():
            return f"{flag}: {existing} is a dangling symlink"
        existing = existing.parent
    if not existing.is_dir():
        return f"{flag}: {existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag}: {existing} is not writable"
    return None


class _HasSocketSettings(Protocol):
    @property
    def driver_name(self) -> str: ...
    @property
    def node_name(self) -> str: ...
    @property
    def registry_dir(self) -> Path: ...
    @property
    def plugins_dir(self) -> Path: ...
    @property
    def pod_uid(self) -> str: ...
    @property
    def log_format(self) -> LogFormat: ...
    @property
    def log_level(self) -> LogLevel: ...


@dataclass(frozen=True)
class SocketSettings:
    """What the kubelet plugin's sockets and the log are set up with."""

    driver_name: str
    node_name: str
    registry_dir: Path
    plugins_dir: Path
    pod_uid: str
    log_format: LogFormat
    log_level: LogLevel

    @classmethod
    def of(cls, settings: _HasSocketSettings) -> SocketSettings:
        """The same fields of the full settings."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


class _Unsure(DriverError):
    """The command line needs the full parser to be understood."""


class _QuietParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Unsure(message)


_FIELDS = (
    "driver_name",
    "compat",
    "node_name",
    "registry_dir",
    "plugins_dir",
    "cdi_root",
    "pod_uid",
    "kubeconfig",
    "log_format",
    "log_level",
)
_DEFAULTS: Mapping[str, str] = {
    "driver_name": DEFAULT_DRIVER_NAME,
    "registry_dir": str(DEFAULT_REGISTRY_DIR),
    "plugins_dir": str(DEFAULT_PLUGINS_DIR),
    "cdi_root": str(DEFAULT_CDI_ROOT),
    "log_format": "console",
    "log_level": "info",
}


def _known(arg: str) -> bool:
    """Not a flag, or a flag of ``run`` (a misspelt one is the full parser's to report)."""
    return not arg.startswith("-") or arg.split("=", 1)[0] in _RUN_FLAGS


def _values(args: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Each field from its flag, else its variable, else its default (as the full parser)."""
    parser = _QuietParser(add_help=False, allow_abbrev=False)
    for field in _FIELDS:
        parser.add_argument(flag_name(field), dest=field)
    ns, _ = parser.parse_known_args(args)
    values = {}
    for field in _FIELDS:
        given = getattr(ns, field)
        if given is None:
            given = environ.get(env_name(field), _DEFAULTS.get(field, ""))
        values[field] = given
    return values


def read_socket_settings(argv: Sequence[str], environ: Mapping[str, str]) -> SocketSettings | None:
    """The socket settings of a ``run`` command line, or None when the command is not a plain
    ``run`` (``--help``, a flag it does not take) or any of them (or the kubeconfig it names)
    would not pass the full check."""
    if not argv or argv[0] != "run" or not all(_known(a) for a in argv[1:]):
        return None
    try:
        values = _values(argv[1:], environ)
    except _Unsure:
        return None
    compat = values["compat"]
    driver = compat_driver_name(compat, values["driver_name"])
    node = values["node_name"]
    kubeconfig = values["kubeconfig"]
    if (
        compat not in ("", "nvidia")
        or (compat == "nvidia" and driver != NVIDIA_DRIVER_NAME)
        or len(driver) > MAX_DRIVER_NAME
        or not _DRIVER_NAME.fullmatch(driver)
        or not node
        or len(node) > MAX_NODE_NAME
        or values["log_format"] not in get_args(LogFormat)
        or values["log_level"] not in get_args(LogLevel)
        or (kubeconfig and not os.path.isfile(kubeconfig))
    ):
        return None
    directories = {
        field: Path(values[field]) for field in ("cdi_root", "plugins_dir", "registry_dir")
    }
    if any(directory_problem(path, flag_name(f)) for f, path in directories.items()):
        return None
    return SocketSettings(
        driver_name=driver,
        node_name=node,
        registry_dir=directories["registry_dir"],
        plugins_dir=directories["plugins_dir"],
        pod_uid=values["pod_uid"],
        log_format=cast(LogFormat, values["log_format"]),
        log_level=cast(LogLevel, values["log_level"]),
    )
