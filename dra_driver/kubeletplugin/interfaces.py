"""What a DRA driver implements to be served by this package, and the values it exchanges.

Everything here is independent of gRPC and of the Kubernetes client: claims arrive as plain
``resource.k8s.io/v1`` JSON dicts, prepared devices leave as small frozen dataclasses.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

JSON = dict[str, Any]


@dataclass(frozen=True)
class ClaimRef:
    """Identifies one ResourceClaim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PreparedDevice:
    """One device made usable for a claim, as reported back to the kubelet.

    ``request_names`` empty means the device serves every request of the claim.
    ``share_id`` is dropped when the kubelet speaks v1beta1, which has no such field.
    """

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class ClaimToPrepare:
    """A claim fetched from the API server and checked, ready for the driver.

    ``claim`` is the whole ResourceClaim; ``results`` are the allocation results of
    ``status.allocation.devices.results`` that belong to this driver and this node's pool;
    ``config`` are the entries of ``status.allocation.devices.config`` whose opaque
    parameters are addressed to this driver, in API order (class entries before claim
    entries, so later entries take precedence).
    """

    ref: ClaimRef
    claim: JSON
    results: tuple[JSON, ...]
    config: tuple[JSON, ...]

    @property
    def pods(self) -> tuple[str, ...]:
        """``namespace/name`` of the pods the claim is reserved for (for log lines)."""
        reserved = (self.claim.get("status") or {}).get("reservedFor") or ()
        return tuple(
            f"{self.ref.namespace}/{r.get('name')}"
            for r in reserved
            if isinstance(r, dict) and r.get("resource") == "pods"
        )


#: Outcome of preparing one claim: its devices, or why it failed.
PrepareResult = Sequence[PreparedDevice] | Exception
#: Outcome of unpreparing one claim: ``None`` on success.
UnprepareResult = Exception | None


class Driver(Protocol):
    """The node-side half of a DRA driver.

    Both methods receive a batch of claims and return one entry per claim UID. They must be
    idempotent: the kubelet repeats calls after timeouts and restarts, and may unprepare a
    claim this process never prepared. The plugin serialises calls (one at a time per node,
    across processes), so an implementation need not lock against itself. A claim missing
    from the returned mapping is reported to the kubelet as failed.
    """

    async def prepare(self, claims: Sequence[ClaimToPrepare]) -> Mapping[str, PrepareResult]:
        """Make the allocated devices of each claim usable; keyed by claim UID."""
        ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        """Undo ``prepare`` for each claim; keyed by claim UID."""
        ...


@runtime_checkable
class Readiness(Protocol):
    """What a ``Driver`` may also implement if it cannot serve calls from the start.

    A driver bound before its state is loaded (``late.LateParts``) holds the kubelet's calls
    until then. The plugin waits for ``wait_ready`` before it takes the node lock for a call,
    not inside it: loading the state takes the same lock, so a call held under the lock would
    block the very start-up it waits for. A driver without these methods is ready at once.
    """

    @property
    def ready(self) -> bool:
        """Whether calls are served now (once true, it stays true)."""
        ...

    async def wait_ready(self) -> None:
        """Return once calls are served."""
        ...


class HealthStatus(enum.IntEnum):
    """Device health, with the wire values of the DRAResourceHealth API."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True)
class DeviceHealth:
    """Health of one device.

    ``last_updated`` is a Unix time in seconds (0 = now, when sent); ``timeout_seconds`` is
    how long the kubelet may trust the status (0 = the kubelet's default).
    """

    pool_name: str
    device_name: str
    status: HealthStatus
    message: str = ""
    last_updated: int = 0
    timeout_seconds: int = 0


class HealthSource(Protocol):
    """Produces the health of all devices, each item being the complete device list."""

    def watch(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        """Start a new stream for one kubelet connection; it ends when the caller stops."""
        ...
