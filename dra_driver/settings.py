"""One settings model for every subcommand: each field is a flag and an environment variable.

A DaemonSet configures the agent through environment variables; people use flags. Both land in
:class:`Settings`, which validates them once, so the rest of the code reads typed values.
The variable for ``--some-flag`` is ``DRA_SOME_FLAG``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dra_driver.bindsettings import (
    DEFAULT_CDI_ROOT,
    DEFAULT_DRIVER_NAME,
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    DRIVER_NAME_PATTERN,
    MAX_DRIVER_NAME,
    MAX_NODE_NAME,
    NVIDIA_DRIVER_NAME,
    LogFormat,
    LogLevel,
    compat_driver_name,
    env_name,
    flag_name,
)
from dra_driver.errors import StartError


class SettingsError(StartError):
    """A flag or environment variable has a bad value; the message names both."""


class Settings(BaseModel):
    """Everything the node agent and the tools can be told."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    driver_name: str = Field(
        DEFAULT_DRIVER_NAME,
        pattern=DRIVER_NAME_PATTERN,
        max_length=MAX_DRIVER_NAME,
        description="DRA driver name (a DNS subdomain); also the attribute domain",
    )
    compat: Literal["", "nvidia"] = Field(
        "",
        description="nvidia: a drop-in for the NVIDIA DRA driver: publish as gpu.nvidia.com "
        "and accept its opaque configs (resource.nvidia.com/v1beta1) besides this driver's",
    )
    node_name: str = Field(
        "",
        max_length=MAX_NODE_NAME,
        description="this node's name; the pool name (set from the downward API)",
    )
    backend: Literal["nvml", "simulated"] = Field(
        "nvml", description="GPU discovery: nvml (real GPUs) or simulated (a node profile)"
    )
    profile: str = Field(
        "",
        description="simulated node profile: dgx-a100, dgx-h100, gb200, l4x4, mixed or a YAML file",
    )
    output: Literal["table", "json", "yaml"] = Field("table", description="output format")
    kubeconfig: str = Field(
        "", description="kubeconfig file (default: in-cluster config, then $KUBECONFIG)"
    )
    context: str = Field("", description="kubeconfig context to use (default: the current context)")
    namespace: str = Field(
        "",
        max_length=63,
        description="namespace of a claim given by name alone (default: the kubeconfig "
        "context's, else default); the compute domain controller's own namespace, where it "
        "runs the IMEX daemons",
    )
    imex_binding_conditions: bool = Field(
        False,
        description="publish IMEX channels with binding conditions: a pod whose channel is "
        "allocated is bound only once its compute domain's IMEX daemon on the node is ready, "
        "and sent elsewhere when it cannot become ready (needs DRADeviceBindingConditions); "
        "off: prepare waits for the daemon, bounded, and fails with a message",
    )
    imex_image: str = Field(
        "",
        max_length=512,
        description="image of the IMEX daemon pods the compute domain controller starts "
        "(the driver's own image)",
    )
    imex_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="image pull policy of the IMEX daemon pods"
    )
    imex_pull_secrets: str = Field(
        "",
        max_length=2048,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?(,[a-z0-9]([-a-z0-9.]*[a-z0-9])?)*)?$",
        description="image pull secrets of the IMEX daemon pods, comma-separated names of "
        "Secrets in the controller's namespace (empty: none)",
    )
    log_format: LogFormat = Field(
        "console", description="log format: json (one event per line) or console"
    )
    log_level: LogLevel = Field("info", description="minimum log level")
    cdi_root: Path = Field(DEFAULT_CDI_ROOT, description="directory for the per-claim CDI specs")
    plugins_dir: Path = Field(
        DEFAULT_PLUGINS_DIR,
        description="kubelet plugins directory (DRA socket and checkpoint live below it)",
    )
    registry_dir: Path = Field(
        DEFAULT_REGISTRY_DIR,
        description="kubelet plugin registration directory",
    )
    pod_uid: str = Field(
        "", description="this pod's UID; enables rolling-update socket names (downward API)"
    )
    driver_root: Path = Field(
        Path("/"),
        description="where the host's NVIDIA driver root is mounted (libnvidia-ml, /dev)",
    )
    host_driver_root: Path = Field(
        Path("/"),
        description="the driver root's path on the host, which CDI specs mount files from "
        "(--driver-root is where the agent sees it)",
    )
    metrics_port: int = Field(
        8080, ge=0, le=65535, description="Prometheus /metrics port (0 turns it off)"
    )
    health_port: int = Field(
        51515,
        ge=0,
        le=65535,
        description="gRPC health port for the liveness probe (0 turns it off)",
    )
    dynamic_mig: bool = Field(
        False,
        description="create MIG devices on demand: publish every MIG placement with shared "
        "counters (needs the DRAPartitionableDevices feature)",
    )
    mig_binding_conditions: bool = Field(
        False,
        description="with --dynamic-mig, publish MIG placements with binding conditions: the "
        "agent creates a claim's MIG device before the scheduler binds the pod, and a failure "
        "sends the pod elsewhere instead of failing its start (needs "
        "DRADeviceBindingConditions; adds the scheduler's 5 s poll to each MIG pod's start)",
    )
    mig_failure_hold: float = Field(
        300.0,
        ge=0,
        le=86400,
        description="seconds a GPU on which creating a MIG device failed stays tainted "
        "(gpu.dra.dev/mig-failed) before a re-check may clear it",
    )
    node_overhead: str = Field(
        "",
        description="host resources each pod using a GPU costs the node, e.g. "
        "memory=512Mi,cpu=100m: declared on every device so the scheduler counts them "
        "(needs DRANodeAllocatableResources, alpha; empty: none)",
    )
    list_attributes: bool = Field(
        False,
        description="publish list-type attributes: the MIG profiles each GPU supports "
        '(migProfiles), for selectors like .migProfiles.includes("3g.40gb") (needs '
        "DRAListTypeAttributes, alpha)",
    )
    mig_layout: Literal["placements", "capacity"] = Field(
        "placements",
        description="with --dynamic-mig, how MIG is published: placements (every placement "
        "of every profile a device, with shared counters; claims select a profile) or capacity "
        "(each GPU one device that claims share by computeSlices and memorySlices, the "
        "placement chosen by the agent: far cheaper for the scheduler on large clusters; needs "
        "DRAConsumableCapacity)",
    )
    mig_profiles: str = Field(
        "",
        description="with --dynamic-mig, publish placements of these MIG profiles only, "
        "comma-separated (e.g. 1g.10gb,3g.40gb,7g.80gb): fewer devices for the scheduler to "
        "go through; empty: every profile",
    )
    shared_gpus: str = Field(
        "",
        description="GPUs shared among claims by memory (MPS limits): all; index:0,1; "
        "uuid:GPU-...; model:L4,H100 (terms joined by ';'; empty: none)",
    )
    ignored_xids: str = Field(
        "13,31,43,45,68,109",
        pattern=r"^(\d+(,\d+)*)?$",
        description="Xid errors caused by applications, which do not taint a GPU",
    )
    health_recheck_interval: float = Field(
        60.0,
        ge=0,
        le=86400,
        description="seconds between re-checks of unhealthy GPUs; one found healthy again "
        "is untainted, with an Event on the Node (0: never, taints stay until a restart)",
    )

    @field_validator("driver_root", "host_driver_root")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Relative, the agent would read the driver from wherever it was started, and CDI
        # specs would mount paths the runtime refuses.
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @field_validator("health_port")
    @classmethod
    def _not_the_metrics_port(cls, value: int, info: ValidationInfo) -> int:
        # One port for both binds the metrics, publishes, then fails to bind the health
        # service with an "address in use" that names neither setting.
        if value and value == info.data.get("metrics_port"):
            raise ValueError(
                f"{value} is also --metrics-port (DRA_METRICS_PORT): give them different "
                "ports, or 0 to turn one off"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _compat_driver_name(cls, values: Any) -> Any:
        """See :func:`compat_driver_name`."""
        if isinstance(values, dict) and "compat" in values:
            given = values.get("driver_name", DEFAULT_DRIVER_NAME)
            if isinstance(given, str):
                values = {**values, "driver_name": compat_driver_name(values["compat"], given)}
        return values

    @model_validator(mode="after")
    def _compat_keeps_its_name(self) -> Settings:
        if self.compat == "nvidia" and self.driver_name != NVIDIA_DRIVER_NAME:
            raise ValueError(
                f"--compat nvidia publishes as {NVIDIA_DRIVER_NAME}, the name the NVIDIA "
                f"driver's classes and configs use; drop --driver-name {self.driver_name}"
            )
        return self


#: Short forms, as kubectl spells them.
_SHORT = {"output": "-o", "namespace": "-n"}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def parse_bool(value: str, source: str) -> bool:
    """A boolean flag value or variable: true/false, yes/no, on/off, 1/0."""
    lowered = value.strip().lower()
    if lowered in _TRUE or lowered in _FALSE:
        return lowered in _TRUE
    raise SettingsError(f"{source}: expected true or false (got {value!r})")


def _help(description: str, field: str, default: Any) -> str:
    """The description, then the default when it says something, then the variable."""
    shown = "" if default in ("", None) or isinstance(default, bool) else f"default {default}; "
    return f"{description} ({shown}env {env_name(field)})"


def add_arguments(parser: argparse.ArgumentParser, fields: Iterable[str], **overrides: Any) -> None:
    """Add the named settings fields to ``parser``; ``overrides`` replace defaults per command."""
    for field in fields:
        info = Settings.model_fields[field]
        default = overrides.get(field, info.default)
        flags = [flag_name(field)] + ([_SHORT[field]] if field in _SHORT else [])
        choices = _choices(info.annotation)
        kwargs: dict[str, Any] = {"choices": choices, "metavar": None if choices else field.upper()}
        if info.annotation is bool:
            # A switch; "--flag=false" (or "--flag true") is still accepted.
            kwargs = {"nargs": "?", "const": "true", "metavar": "BOOL"}
        parser.add_argument(
            *flags,
            dest=field,
            default=None,
            help=_help(info.description or "", field, default),
            **kwargs,
        )
        parser.set_defaults(**{f"_default_{field}": default})


def _choices(annotation: Any) -> list[str] | None:
    args = getattr(annotation, "__args__", None)
    if getattr(annotation, "__origin__", None) is Literal and args:
        return [str(a) for a in args]
    return None


def from_namespace(
    ns: argparse.Namespace, fields: Iterable[str], environ: dict[str, str] | None = None
) -> Settings:
    """Resolve flags, then environment variables, then defaults, and validate them."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for field in fields:
        flag_value = getattr(ns, field, None)
        if flag_value is not None:
            values[field], origin[field] = flag_value, flag_name(field)
        elif env_name(field) in env:
            values[field], origin[field] = env[env_name(field)], env_name(field)
        else:
            values[field] = getattr(ns, f"_default_{field}")
        if Settings.model_fields[field].annotation is bool and isinstance(values[field], str):
            # One reading of a switch for every flag and variable (an empty variable is false).
            values[field] = parse_bool(values[field], origin[field])
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        # A rule across fields (--compat with --driver-name) has no location of its own.
        field = str(err["loc"][0]) if err["loc"] else "compat"
        source = origin.get(field, flag_name(field))
        # Our own validators' messages, without pydantic's "Value error, " before them.
        ctx = err.get("ctx") or {}
        msg = str(ctx["error"]) if err["type"] == "value_error" and "error" in ctx else err["msg"]
        described = Settings.model_fields[field].description if field in values else None
        if err["type"] == "string_pattern_mismatch" and described:
            # Not the regular expression: what the setting is.
            msg = f"not valid here; expected {described}"
        raise SettingsError(f"{source}: {msg} (got {values.get(field)!r})") from None
