"""The parts that serve the kubelet's calls, attached after the sockets are bound.

A driver binds its sockets first, so the kubelet registers it at once, and loads its state
after: discovery, the checkpoint and the API server's answers take longer than the kubelet
should wait. Until the parts are attached, prepares, unprepares, claim reads and health
streams wait here; none of them is answered from a state that is not loaded yet. When the
state is never loaded (loading failed, or the agent stops first), :meth:`LateParts.fail`
answers them with the reason at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

from dra_driver.errors import PrepareError
from dra_driver.kubeletplugin.claims import ClaimFetcher
from dra_driver.kubeletplugin.interfaces import (
    JSON,
    ClaimRef,
    ClaimToPrepare,
    DeviceHealth,
    Driver,
    HealthSource,
    PrepareResult,
    UnprepareResult,
)


@dataclass(frozen=True)
class Parts:
    """What serves the kubelet: the driver, its claim reader, its health source (if any),
    and what to do after each registration."""

    driver: Driver
    fetcher: ClaimFetcher
    health: HealthSource | None = None
    on_registered: Callable[[], None] | None = None


class LateParts:
    """A ``Driver``, ``ClaimFetcher`` and ``HealthSource`` whose calls wait for :meth:`attach`.

    As a ``Readiness`` it lets the plugin hold prepares and unprepares before they take the
    node lock, which loading the state needs.

    Pass it to ``Plugin`` in all three roles and as ``on_registered=parts.registered``.
    """

    def __init__(self) -> None:
        self._parts: Parts | None = None
        self._failure = ""
        self._attached = asyncio.Event()

    def attach(self, parts: Parts) -> None:
        """Serve the held and all later calls with ``parts`` (once)."""
        if self._parts is not None:
            raise RuntimeError("parts already attached")
        self._parts = parts
        self._attached.set()

    def fail(self, reason: str) -> None:
        """The parts will never be attached: the held and all later calls fail with
        ``reason`` (a prepare or unprepare per claim) instead of waiting."""
        if self._parts is None:
            self._failure = reason
            self._attached.set()

    @property
    def ready(self) -> bool:
        """Whether calls are being served (no longer held); see ``Readiness``."""
        return self._parts is not None

    async def wait_ready(self) -> None:
        """Return once the parts are attached (or will never be: see :meth:`fail`); see
        ``Readiness``."""
        await self._attached.wait()

    async def _attached_parts(self) -> Parts:
        if self._parts is None:  # every call of a running agent skips the event
            await self._attached.wait()
            if self._parts is None:
                raise PrepareError(self._failure)
        return self._parts

    def registered(self) -> None:
        """Forward a registration to the attached parts. One that comes before them needs
        nothing more: whoever attaches the parts starts from the registration state."""
        if self._parts is not None and self._parts.on_registered is not None:
            self._parts.on_registered()

    async def prepare(self, claims: Sequence[ClaimToPrepare]) -> Mapping[str, PrepareResult]:
        """``Driver.prepare`` of the attached driver."""
        return await (await self._attached_parts()).driver.prepare(claims)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        """``Driver.unprepare`` of the attached driver."""
        return await (await self._attached_parts()).driver.unprepare(claims)

    async def get_claim(self, namespace: str, name: str) -> JSON | None:
        """``ClaimFetcher.get_claim`` of the attached fetcher."""
        return await (await self._attached_parts()).fetcher.get_claim(namespace, name)

    async def watch(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        """The attached health source's stream (nothing, if it has none)."""
        health = (await self._attached_parts()).health
        if health is None:
            return
        stream = health.watch()
        # Closed with this generator, so a kubelet that hangs up releases the source's stream.
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            async for devices in stream:
                yield devices
