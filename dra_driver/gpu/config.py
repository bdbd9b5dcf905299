"""The opaque configuration API ``gpu.dra.dev/v1alpha1`` and how configs resolve per request.

Configs arrive in a claim's allocation (``status.allocation.devices.config``), from the
DeviceClass (``FromClass``) or the claim itself (``FromClaim``). Parsing is strict: a typo in a
field name fails the claim with a message naming the claim, the request and the field, instead
of silently running a pod without the sharing it asked for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dra_driver.errors import PrepareError

API_GROUP_VERSION = "gpu.dra.dev/v1alpha1"

# A memory quantity as Kubernetes writes it; kept as text and converted to MPS's own units.
_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS: dict[str | None, int] = {
    **{None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12},
    **{"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40},
}


def memory_bytes(text: str) -> int:
    """Parse a whole-number memory quantity such as ``10Gi`` or ``512M`` into bytes."""
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a memory quantity such as 10Gi or 512Mi")
    return int(match.group(1)) * _FACTORS[match.group(2)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TimeSlicingConfig(_Strict):
    """How long each process may run before the GPU switches to the next."""

    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


class MpsConfig(_Strict):
    """MPS limits for every client of the shared device(s)."""

    default_active_thread_percentage: Annotated[int, Field(ge=1, le=100)] | None = Field(
        default=None, alias="defaultActiveThreadPercentage"
    )
    default_pinned_device_memory_limit: str | None = Field(
        default=None, alias="defaultPinnedDeviceMemoryLimit"
    )
    # Keyed by device index within the claim's allocation or by UUID.
    default_per_device_pinned_memory_limit: dict[str, str] = Field(
        default_factory=dict, alias="defaultPerDevicePinnedMemoryLimit"
    )

    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _check_limit(cls, value: str | None) -> str | None:
        if value is not None:
            memory_bytes(value)
        return value

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _check_limits(cls, value: dict[str, str]) -> dict[str, str]:
        for limit in value.values():
            memory_bytes(limit)
        return value


class GpuSharing(_Strict):
    """Sharing of a whole GPU between the claim's containers and pods."""

    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing_config: TimeSlicingConfig | None = Field(default=None, alias="timeSlicingConfig")
    mps_config: MpsConfig | None = Field(default=None, alias="mpsConfig")


class MigSharing(_Strict):
    """Sharing of a MIG device; MIG has no time-slice interval to set."""

    strategy: Literal["TimeSlicing", "MPS"]
    mps_config: MpsConfig | None = Field(default=None, alias="mpsConfig")


class GpuConfig(_Strict):
    """Configuration for whole GPUs (``kind: GpuConfig``)."""

    api_version: Literal["gpu.dra.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None


class MigDeviceConfig(_Strict):
    """Configuration for MIG devices (``kind: MigDeviceConfig``)."""

    api_version: Literal["gpu.dra.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["MigDeviceConfig"]
    sharing: MigSharing | None = None


DeviceConfig = GpuConfig | MigDeviceConfig
_KINDS: dict[str, type[GpuConfig] | type[MigDeviceConfig]] = {
    "GpuConfig": GpuConfig,
    "MigDeviceConfig": MigDeviceConfig,
}
#: Which config kind applies to which device type.
KIND_FOR_TYPE = {"gpu": "GpuConfig", "mig": "MigDeviceConfig"}


class ConfigError(PrepareError, ValueError):
    """A claim's configuration cannot be used; the message says what to fix."""


def parse_config(parameters: Any, *, where: str) -> DeviceConfig:
    """Parse one opaque parameters object strictly; ``where`` names the claim and request."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{where}: opaque parameters must be an object")
    api_version = parameters.get("apiVersion")
    if api_version != API_GROUP_VERSION:
        raise ConfigError(f"{where}: apiVersion {api_version!r} is not {API_GROUP_VERSION!r}")
    model = _KINDS.get(str(parameters.get("kind")))
    if model is None:
        raise ConfigError(
            f"{where}: kind {parameters.get('kind')!r} is not one of {', '.join(_KINDS)}"
        )
    try:
        return model.model_validate(parameters)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        detail = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise ConfigError(f"{where}: field {field!r}: {detail}") from None


@dataclass(frozen=True)
class ConfigEntry:
    """One allocation config entry of this driver, parsed."""

    source: str  # FromClass or FromClaim
    requests: tuple[str, ...]  # empty: every request of the claim
    config: DeviceConfig

    def applies_to(self, request: str) -> bool:
        """Whether this entry names ``request`` (``req/sub`` also matches a config for ``req``)."""
        if not self.requests:
            return True
        parent = request.split("/", 1)[0]
        return request in self.requests or parent in self.requests


def parse_allocation_config(
    entries: Iterable[Mapping[str, Any]], *, driver: str, claim: str
) -> list[ConfigEntry]:
    """Parse this driver's opaque configs; configs for other drivers are ignored."""
    parsed = []
    for entry in entries:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        requests = tuple(entry.get("requests") or ())
        named = ", ".join(requests) if requests else "all requests"
        where = f"claim {claim}, config for {named} ({entry.get('source', 'FromClaim')})"
        parsed.append(
            ConfigEntry(
                source=str(entry.get("source", "FromClaim")),
                requests=requests,
                config=parse_config(opaque.get("parameters"), where=where),
            )
        )
    return parsed


def resolve_config(
    entries: Sequence[ConfigEntry], request: str, device_type: str, *, claim: str
) -> DeviceConfig | None:
    """The config that applies to one allocated device, or None for the defaults.

    Claim configs win over class configs, later entries over earlier ones. A config of the
    wrong kind named for this request (a GpuConfig for a MIG device) is an error; one that
    names no request applies only to devices of its own kind.
    """
    ordered = [e for e in entries if e.source == "FromClass"] + [
        e for e in entries if e.source != "FromClass"
    ]
    wanted = KIND_FOR_TYPE[device_type]
    chosen = None
    for entry in ordered:
        if not entry.applies_to(request):
            continue
        if entry.config.kind == wanted:
            chosen = entry.config
        elif entry.requests:
            # Named for this request but of the wrong kind: the user meant it for this device.
            raise ConfigError(
                f"claim {claim}, request {request}: {entry.config.kind} cannot configure a "
                f"{device_type} device; use {wanted}"
            )
    return chosen
