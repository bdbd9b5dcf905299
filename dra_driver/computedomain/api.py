"""The ComputeDomain API: where its objects live, what the driver names after them, and the
spec read from a user's object.

Two API groups serve the same shape: the driver's own (``gpu.dra.dev/v1alpha1``) and, in
compatibility mode, the NVIDIA driver's (``resource.nvidia.com/v1beta1``), so that its users'
ComputeDomains apply unchanged. Everything that differs between the two is one
:class:`ApiNames` value; nothing else branches on the mode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from dra_driver.errors import DriverError
from dra_driver.resourceapi import DNS_SUBDOMAIN

JSON = dict[str, Any]

KIND = "ComputeDomain"
PLURAL = "computedomains"
#: The opaque config kinds the controller writes into the claim templates it makes. Always
#: in the driver's own config API, which the agent accepts in both modes.
CONFIG_API_VERSION = "gpu.dra.dev/v1alpha1"
CHANNEL_CONFIG_KIND = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND = "ComputeDomainDaemonConfig"
#: The node label of its NVLink clique: the compute domain plugin sets it (the label GPU
#: feature discovery sets), the controller reads it into a domain's status.
CLIQUE_LABEL = "nvidia.com/gpu.clique"
#: The kernel's limit of IMEX channels on a node (``nvidia-caps-imex-channels`` minors).
MAX_CHANNELS = 2048
#: An object name the API server accepts for a ResourceClaimTemplate; the CRD's schema
#: states the same pattern.
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN)
#: The channel annotation as the controller writes it: ASCII digits only (``str.isdigit``
#: also takes superscripts, which ``int`` refuses), short enough to be cheap to read.
_CHANNEL = re.compile(r"[0-9]{1,4}")

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ApiNames:
    """The names of one mode: the domain's API group and version, the DRA driver name of
    the node's IMEX devices (the agent's second driver, beside the GPUs') and the
    DeviceClasses of its two device kinds."""

    group: str
    version: str
    driver: str
    channel_class: str
    daemon_class: str

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` of a ComputeDomain."""
        return f"{self.group}/{self.version}"

    @property
    def domain_label(self) -> str:
        """The label naming a domain's UID: on its nodes, templates, daemons and their pods."""
        return f"{self.group}/computeDomain"

    @property
    def finalizer(self) -> str:
        """Held on a domain until everything made for it is gone."""
        return f"{self.group}/computeDomain"

    @property
    def channel_annotation(self) -> str:
        """The IMEX channel the controller gave a domain (on the domain)."""
        return f"{self.group}/imexChannel"

    def path(self, namespace: str = "", name: str = "", subresource: str = "") -> str:
        """The REST path of the domains (of a namespace, or all), or of one domain."""
        parts = ["/apis", self.group, self.version]
        if namespace:
            parts += ["namespaces", quote(namespace, safe="")]
        parts.append(PLURAL)
        if name:
            parts.append(quote(name, safe=""))
            if subresource:
                parts.append(subresource)
        return "/".join(parts)


OWN = ApiNames(
    group="gpu.dra.dev",
    version="v1alpha1",
    driver="compute-domain.gpu.dra.dev",
    channel_class="imex-channel.gpu.dra.dev",
    daemon_class="imex-daemon.gpu.dra.dev",
)
NVIDIA = ApiNames(
    group="resource.nvidia.com",
    version="v1beta1",
    driver="compute-domain.nvidia.com",
    channel_class="compute-domain-default-channel.nvidia.com",
    daemon_class="compute-domain-daemon.nvidia.com",
)


def names_for(compat: str) -> ApiNames:
    """The names of a ``--compat`` mode (``""`` or ``"nvidia"``)."""
    return NVIDIA if compat == "nvidia" else OWN


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TemplateRef(_Spec):
    name: str = Field(min_length=1, max_length=253)

    @field_validator("name")
    @classmethod
    def _object_name(cls, name: str) -> str:
        # The controller makes a template of this name: a name the API server refuses would
        # fail every apply, with nothing on the domain saying why.
        if _DNS_SUBDOMAIN.fullmatch(name) is None:
            raise PydanticCustomError(
                "dns_subdomain",
                "not a valid object name: lowercase letters, digits, '-' and '.', starting "
                "and ending with a letter or digit (an RFC 1123 subdomain)",
            )
        return name


class ChannelSpec(_Spec):
    resource_claim_template: TemplateRef = Field(alias="resourceClaimTemplate")
    allocation_mode: Literal["Single", "All"] = Field(default="Single", alias="allocationMode")


class DomainSpec(_Spec):
    """``spec`` of a ComputeDomain (the same in both API groups)."""

    num_nodes: int = Field(default=0, ge=0, alias="numNodes")
    channel: ChannelSpec


class SpecError(DriverError, ValueError):
    """A domain whose spec cannot be used; the message says what to fix."""


def parse_spec(spec: Any) -> DomainSpec:
    """Read a domain's ``spec``; :class:`SpecError` names the first field that is wrong."""
    try:
        return DomainSpec.model_validate(spec if isinstance(spec, dict) else {})
    except ValidationError as exc:
        err = exc.errors(include_input=False, include_url=False)[0]
        field = ".".join(str(p) for p in err["loc"]) or "spec"
        detail = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise SpecError(f"spec.{field}: {detail}") from None


@dataclass(frozen=True)
class Domain:
    """One ComputeDomain as the controller reads it."""

    namespace: str
    name: str
    uid: str
    spec: DomainSpec | None  # None: the spec is invalid (``spec_error`` says why)
    spec_error: str
    deleting: bool
    finalizers: tuple[str, ...]
    channel: int | None  # the IMEX channel given to it, from its annotation
    status: JSON
    #: The version read; a write that replaces a list (the finalizers) is made on it only.
    resource_version: str = ""
    #: ``metadata.creationTimestamp``: of two domains holding one channel, the older keeps it.
    created: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def read_domain(obj: JSON, names: ApiNames) -> Domain:
    """A domain object from the API as a :class:`Domain`."""
    meta = obj.get("metadata") or {}
    try:
        spec: DomainSpec | None = parse_spec(obj.get("spec"))
        error = ""
    except SpecError as exc:
        spec, error = None, str(exc)
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    status = obj.get("status")
    return Domain(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        spec=spec,
        spec_error=error,
        deleting=bool(meta.get("deletionTimestamp")),
        finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
        channel=_channel(
            (meta.get("annotations") or {}).get(names.channel_annotation), f"{namespace}/{name}"
        ),
        status=status if isinstance(status, dict) else {},
        resource_version=str(meta.get("resourceVersion") or ""),
        created=str(meta.get("creationTimestamp") or ""),
    )


def _channel(raw: object, key: str) -> int | None:
    """The channel of a domain's annotation; None when it has none or one not written by the
    controller (anyone who may edit the domain may write anything there: the controller then
    gives the domain a channel again)."""
    if raw is None:
        return None
    if isinstance(raw, str) and _CHANNEL.fullmatch(raw) and int(raw) < MAX_CHANNELS:
        return int(raw)
    log.warning("ignoring the domain's channel annotation", domain=key, value=repr(raw)[:80])
    return None
