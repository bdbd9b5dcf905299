"""What a claim for an IMEX device asks for: its opaque config, strictly parsed (pure).

The controller writes the config into the claim templates it makes: a channel claim names
its domain, the domain's channel and the allocation mode; a daemon claim names its domain.
A claim without one (made by hand) fails with a message saying what it lacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.computedomain.api import (
    CHANNEL_CONFIG_KIND,
    CONFIG_API_VERSION,
    DAEMON_CONFIG_KIND,
    MAX_CHANNELS,
)
from dra_driver.computedomain.nodedevices import CHANNEL_DEVICE, DAEMON_DEVICE
from dra_driver.errors import PrepareError
from dra_driver.kubeletplugin.interfaces import ClaimToPrepare


class ImexClaimError(PrepareError):
    """A claim for IMEX devices cannot be prepared; the message says what to fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: Literal["gpu.dra.dev/v1alpha1"] = Field(alias="apiVersion")
    domain_id: str = Field(alias="domainID", min_length=1, max_length=64)


class ChannelConfig(_Strict):
    kind: Literal["ComputeDomainChannelConfig"]
    allocation_mode: Literal["Single", "All"] = Field(default="Single", alias="allocationMode")
    channel: int = Field(ge=0, lt=MAX_CHANNELS)


class DaemonConfig(_Strict):
    kind: Literal["ComputeDomainDaemonConfig"]


@dataclass(frozen=True)
class ImexClaim:
    """One claim's IMEX devices: which kind, for which domain, and the channel to give."""

    kind: Literal["channel", "daemon"]
    domain: str
    devices: tuple[str, ...]
    requests: tuple[str, ...]
    channel: int = 0
    all_channels: bool = False


def _parse(parameters: Any, where: str) -> ChannelConfig | DaemonConfig:
    kind = parameters.get("kind") if isinstance(parameters, dict) else None
    try:
        if kind == CHANNEL_CONFIG_KIND:
            return ChannelConfig.model_validate(parameters)
        if kind == DAEMON_CONFIG_KIND:
            return DaemonConfig.model_validate(parameters)
    except ValidationError as exc:
        err = exc.errors(include_input=False, include_url=False)[0]
        field = ".".join(str(p) for p in err["loc"])
        detail = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise ImexClaimError(f"{where}: field {field!r}: {detail}") from None
    raise ImexClaimError(
        f"{where}: config kind {kind!r} is not {CHANNEL_CONFIG_KIND} or "
        f"{DAEMON_CONFIG_KIND} ({CONFIG_API_VERSION})"
    )


def _configs(config: Sequence[dict[str, Any]], driver: str) -> list[tuple[set[str], Any]]:
    """(requests it applies to, empty: all; parameters) of the entries for ``driver``."""
    out = []
    for entry in config:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") == driver:
            out.append((set(entry.get("requests") or ()), opaque.get("parameters")))
    return out


def read_claim(claim: ClaimToPrepare, driver: str) -> ImexClaim:
    """The IMEX devices a claim was allocated and what its config asks for them."""
    where = f"claim {claim.ref}"
    devices = tuple(str(r.get("device")) for r in claim.results)
    requests = tuple(str(r.get("request")) for r in claim.results)
    unknown = sorted(set(devices) - {CHANNEL_DEVICE, DAEMON_DEVICE})
    if unknown:
        raise ImexClaimError(
            f"{where}: device {unknown[0]!r} is not published by this node "
            f"({CHANNEL_DEVICE}, {DAEMON_DEVICE}); delete the pod so the claim is allocated again"
        )
    if len(set(devices)) != 1:
        raise ImexClaimError(
            f"{where}: a claim gets either the node's IMEX channel or its daemon, once"
        )
    # The last entry naming one of the requests wins (claim entries come after class ones).
    parameters = None
    for applies, params in _configs(claim.config, driver):
        if not applies or applies & set(requests):
            parameters = params
    if parameters is None:
        raise ImexClaimError(
            f"{where}: no {CHANNEL_CONFIG_KIND} or {DAEMON_CONFIG_KIND} config for driver "
            f"{driver}: claim IMEX channels through a ComputeDomain's ResourceClaimTemplate"
        )
    config = _parse(parameters, where)
    wanted = CHANNEL_DEVICE if isinstance(config, ChannelConfig) else DAEMON_DEVICE
    if devices[0] != wanted:
        raise ImexClaimError(f"{where}: a {config.kind} applies to {wanted}, not {devices[0]}")
    if isinstance(config, ChannelConfig):
        return ImexClaim(
            "channel",
            config.domain_id,
            devices,
            requests,
            channel=config.channel,
            all_channels=config.allocation_mode == "All",
        )
    return ImexClaim("daemon", config.domain_id, devices, requests)
