"""The opaque configuration API ``gpu.dra.dev/v1alpha1`` and how configs resolve per request.

Configs arrive in a claim's allocation (``status.allocation.devices.config``), from the
DeviceClass (``FromClass``) or the claim itself (``FromClaim``). Parsing is strict: a typo in a
field name fails the claim with a message naming the claim, the request and the field, instead
of silently running a pod without the sharing it asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dra_driver.errors import PrepareError
from dra_driver.quantity import QuantityError, parse_quantity

API_GROUP_VERSION = "gpu.dra.dev/v1alpha1"

# MPS takes limits in whole MiB; no GPU has anywhere near 4 TiB, so more is a typo.
MIN_LIMIT = 2**20
MAX_LIMIT = 4 * 2**40
#: The pinned-memory limits as the admission policy reads them (the JSON schema's
#: ``x-dra-quantity`` of every limit field, see :data:`QUANTITY_KEY`): the bounds in bytes, and
#: the words of the messages, the same as :func:`memory_limit`'s.
MEMORY_LIMIT: dict[str, Any] = {
    "minimum": MIN_LIMIT,
    "maximum": MAX_LIMIT,
    "range": "1Mi to 4Ti",
    "example": "a memory quantity such as 10Gi or 512Mi",
}
# The API server caps opaque parameters at 10 KiB of JSON; a config this driver understands is
# four levels deep. Checked before parsing, so a hostile object cannot exhaust the stack.
MAX_DEPTH = 16
MAX_NODES = 2048
# Values quoted in error messages (and so in logs and Events) are cut to this length.
QUOTE_LIMIT = 64


def quote(value: object) -> str:
    """``repr`` of a user's value, cut short: a huge field must not flood logs and Events."""
    text = repr(value)
    return text if len(text) <= QUOTE_LIMIT else f"{text[:QUOTE_LIMIT]}...({len(text)} chars)"


def memory_bytes(text: str) -> int:
    """A memory quantity (``10Gi``, ``512M``, ``1.5Gi``) in bytes, read as Kubernetes reads a
    ``resource.Quantity`` field: any quantity, rounded up to a whole byte (``Value()``)."""
    try:
        return parse_quantity(text).value()
    except QuantityError as exc:
        raise ValueError(f"{quote(text)} is not {MEMORY_LIMIT['example']}: {exc.reason}") from None


def memory_limit(text: str, bounds: Mapping[str, Any] = MEMORY_LIMIT) -> str:
    """Check a pinned-memory limit: a quantity within ``bounds`` (by default 1Mi to 4Ti)."""
    value = memory_bytes(text)
    if not bounds["minimum"] <= value <= bounds["maximum"]:
        raise ValueError(f"{quote(text)} is outside the allowed range {bounds['range']}")
    return text


#: JSON schema keys the admission policy's generator (hack/gen_admission_policy.py) reads
#: besides the standard ones: a string field (or the strings of a map field) that must be a
#: quantity within bounds, and a model's :class:`Rule` list.
QUANTITY_KEY = "x-dra-quantity"
RULES_KEY = "x-dra-rules"


@dataclass(frozen=True)
class Rule:
    """A rule across a model's fields, stated once for both checkers.

    ``cel`` is a CEL condition over ``self``, the object as the user wrote it (a map with the
    JSON field names, whose fields may be missing, null or of any type), true when the object
    is valid; ``holds`` is the same condition in Python over the same map; ``message`` is the
    error of both. The agent's validator calls ``holds`` (on ``model_dump(by_alias=True)``),
    the admission policy generated from the models evaluates ``cel``, and
    tests/unit/test_admission_policy.py checks on a table that the two agree.
    """

    cel: str
    message: str
    holds: Callable[[Mapping[str, Any]], bool]


def _rules_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    rules: tuple[Rule, ...] = getattr(model, "rules", ())
    if rules:
        schema[RULES_KEY] = [{"rule": r.cel, "message": r.message} for r in rules]


class _Strict(BaseModel):
    # strict: no coercion, so `true` is not 1 and "50" is not 50.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        strict=True,
        json_schema_extra=_rules_schema,
    )
    #: Rules across fields, checked once every field is valid.
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> _Strict:
        if self.rules:
            data = self.model_dump(by_alias=True)
            for rule in self.rules:
                if not rule.holds(data):
                    raise ValueError(rule.message)
        return self


class TimeSlicingConfig(_Strict):
    """How long each process may run before the GPU switches to the next."""

    interval: Literal["Default", "Short", "Medium", "Long"] = "Default"


class MpsConfig(_Strict):
    """MPS limits for every client of the shared device(s)."""

    default_active_thread_percentage: Annotated[int, Field(ge=1, le=100)] | None = Field(
        default=None, alias="defaultActiveThreadPercentage"
    )
    default_pinned_device_memory_limit: str | None = Field(
        default=None,
        alias="defaultPinnedDeviceMemoryLimit",
        json_schema_extra={QUANTITY_KEY: MEMORY_LIMIT},
    )
    # Keyed by device index within the claim's allocation or by UUID.
    default_per_device_pinned_memory_limit: dict[str, str] = Field(
        default_factory=dict,
        alias="defaultPerDevicePinnedMemoryLimit",
        json_schema_extra={QUANTITY_KEY: MEMORY_LIMIT},
    )
    #: The bounds the limits are checked against (another config API may widen them).
    limit_bounds: ClassVar[Mapping[str, Any]] = MEMORY_LIMIT

    rules = (
        Rule(
            cel="!(type(self.?defaultPerDevicePinnedMemoryLimit.orValue(null)) == map && "
            '"" in self.defaultPerDevicePinnedMemoryLimit)',
            message="defaultPerDevicePinnedMemoryLimit: a device key must be a device index "
            "or UUID, not empty",
            holds=lambda s: (
                not (
                    isinstance(s.get("defaultPerDevicePinnedMemoryLimit"), Mapping)
                    and "" in s["defaultPerDevicePinnedMemoryLimit"]
                )
            ),
        ),
    )

    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _check_limit(cls, value: str | None) -> str | None:
        return None if value is None else memory_limit(value, cls.limit_bounds)

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _check_limits(cls, value: dict[str, str]) -> dict[str, str]:
        for limit in value.values():
            memory_limit(limit, cls.limit_bounds)
        return value

    def device_keys(self) -> frozenset[str]:
        """The device indexes and UUIDs the per-device limits name."""
        return frozenset(self.default_per_device_pinned_memory_limit)

    def pinned_limit(self, ordinal: int, uuid: str) -> int | None:
        """The pinned-memory limit in bytes of the claim's device number ``ordinal`` (whose
        UUID is ``uuid``): its own limit, by index or else by UUID, else the default; None
        when there is none."""
        per_device = self.default_per_device_pinned_memory_limit
        limit = (
            per_device.get(str(ordinal), per_device.get(uuid))
            or self.default_pinned_device_memory_limit
        )
        return None if limit is None else memory_bytes(limit)


# A strategy's settings under another strategy are a mistake, never silently dropped.
_NO_TIME_SLICING_UNDER_MPS = Rule(
    cel='!(self.?strategy.orValue(null) == "MPS" && self.?timeSlicingConfig.orValue(null) != null)',
    message="timeSlicingConfig is set but the strategy is MPS; remove one",
    holds=lambda s: not (s.get("strategy") == "MPS" and s.get("timeSlicingConfig") is not None),
)
_NO_MPS_UNDER_TIME_SLICING = Rule(
    cel='!(self.?strategy.orValue(null) == "TimeSlicing" && self.?mpsConfig.orValue(null) != null)',
    message="mpsConfig is set but the strategy is TimeSlicing; remove one",
    holds=lambda s: not (s.get("strategy") == "TimeSlicing" and s.get("mpsConfig") is not None),
)


class GpuSharing(_Strict):
    """Sharing of a whole GPU between the claim's containers and pods."""

    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing_config: TimeSlicingConfig | None = Field(default=None, alias="timeSlicingConfig")
    mps_config: MpsConfig | None = Field(default=None, alias="mpsConfig")

    rules = (_NO_TIME_SLICING_UNDER_MPS, _NO_MPS_UNDER_TIME_SLICING)


class MigSharing(_Strict):
    """Sharing of a MIG device; MIG has no time-slice interval to set."""

    strategy: Literal["TimeSlicing", "MPS"]
    mps_config: MpsConfig | None = Field(default=None, alias="mpsConfig")

    rules = (_NO_MPS_UNDER_TIME_SLICING,)


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
#: Config APIs by apiVersion, each its models by kind.
ConfigKinds = Mapping[str, Mapping[str, type[GpuConfig] | type[MigDeviceConfig]]]
#: This driver's own config API.
OWN_API: ConfigKinds = {
    API_GROUP_VERSION: {"GpuConfig": GpuConfig, "MigDeviceConfig": MigDeviceConfig}
}
#: Which config kind applies to which device type.
KIND_FOR_TYPE = {"gpu": "GpuConfig", "mig": "MigDeviceConfig"}


class ConfigError(PrepareError, ValueError):
    """A claim's configuration cannot be used; the message says what to fix."""


def parse_config(parameters: Any, *, where: str, apis: ConfigKinds = OWN_API) -> DeviceConfig:
    """Parse one opaque parameters object strictly; ``where`` names the claim and request,
    ``apis`` the config APIs accepted."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{where}: opaque parameters must be an object")
    _check_shape(parameters, where)
    api_version = parameters.get("apiVersion")
    kinds = apis.get(api_version) if isinstance(api_version, str) else None
    if kinds is None:
        accepted = " or ".join(repr(a) for a in apis)
        raise ConfigError(f"{where}: apiVersion {quote(api_version)} is not {accepted}")
    model = kinds.get(str(parameters.get("kind")))
    if model is None:
        raise ConfigError(
            f"{where}: kind {quote(parameters.get('kind'))} is not one of {', '.join(kinds)}"
        )
    try:
        # JSON names only, as the NVIDIA driver's strict decoding and the admission policy:
        # a Python attribute name (``mps_config``) is an unknown field, not an alias.
        return model.model_validate(parameters, by_alias=True, by_name=False)
    except ValidationError as exc:
        err = exc.errors(include_input=False, include_url=False)[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{where}: field {field!r}: {_detail(err)}") from None


#: pydantic error types of an object field given something else; its message names the
#: Python model ("instance of GpuSharing"), which the user never wrote.
_NOT_AN_OBJECT = frozenset({"model_type", "model_attributes_type", "dict_type"})


def _detail(err: Mapping[str, Any]) -> str:
    """What is wrong with one field, in the user's words: no Python class names, no
    pydantic prefix ("Value error, ") before our own messages."""
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] in _NOT_AN_OBJECT:
        return "must be an object"
    if err["type"] == "value_error" and "error" in err.get("ctx", {}):
        return str(err["ctx"]["error"])
    return str(err["msg"])


def _check_shape(parameters: Mapping[str, Any], where: str) -> None:
    """Refuse objects nested deeper or larger than any valid config, without recursion."""
    stack: list[tuple[Any, int]] = [(parameters, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: opaque parameters are nested deeper than {MAX_DEPTH}")
        if nodes > MAX_NODES:
            raise ConfigError(f"{where}: opaque parameters have more than {MAX_NODES} values")
        if isinstance(value, Mapping):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def mps_config(config: DeviceConfig | None) -> MpsConfig | None:
    """The MPS settings of a device's config, if it has any."""
    sharing = config.sharing if config else None
    return sharing.mps_config if sharing else None


def check_device_keys(
    config: DeviceConfig | None, *, devices: int, uuids: Iterable[str], where: str
) -> None:
    """Every per-device limit must name one of the claim's devices: its index among the
    claim's ``devices`` or its UUID. A key naming nothing is a typo that would silently
    leave a device unlimited."""
    mps = mps_config(config)
    if mps is None:
        return
    known = set(uuids) | {str(i) for i in range(devices)}
    unknown = sorted(mps.device_keys() - known)
    if unknown:
        raise ConfigError(
            f"{where}: defaultPerDevicePinnedMemoryLimit names no device of the claim: "
            f"{', '.join(quote(k) for k in unknown)} (use an index 0..{devices - 1} or a UUID)"
        )


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
    entries: Iterable[Mapping[str, Any]], *, driver: str, claim: str, apis: ConfigKinds = OWN_API
) -> list[ConfigEntry]:
    """Parse this driver's opaque configs (of the ``apis`` accepted); configs for other
    drivers are ignored."""
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
                config=parse_config(opaque.get("parameters"), where=where, apis=apis),
            )
        )
    return parsed


def resolve_config(
    entries: Sequence[ConfigEntry], request: str, device_type: str, *, claim: str
) -> DeviceConfig | None:
    """The config that applies to one allocated device, or None for the defaults.

    As the NVIDIA DRA driver: the configs are searched from the highest precedence down
    (claim configs over class configs, later entries over earlier ones) and the first that
    applies decides. A config of the wrong kind (a GpuConfig for a MIG device) that names
    this request is an error; one that names no request, or only the main request of this
    subrequest (``req`` for ``req/sub``, which may be a whole GPU or a MIG device), applies
    only to devices of its own kind and is passed over for the others.
    """
    ordered = [e for e in entries if e.source == "FromClass"] + [
        e for e in entries if e.source != "FromClass"
    ]
    wanted = KIND_FOR_TYPE[device_type]
    for entry in reversed(ordered):
        if request in entry.requests:
            if entry.config.kind != wanted:
                # Named for this request but of the wrong kind: the user meant it for this device.
                raise ConfigError(
                    f"claim {claim}, request {request}: {entry.config.kind} cannot configure a "
                    f"{device_type} device; use {wanted}"
                )
            return entry.config
        if entry.applies_to(request) and entry.config.kind == wanted:
            return entry.config
    return None
