"""The kubelet's health stream: every open stream gets the full device list on each change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from dra_driver.kubeletplugin.interfaces import DeviceHealth


class HealthBroadcaster:
    """A ``HealthSource`` for the kubelet plugin: every stream gets the full list on change."""

    def __init__(self, initial: Sequence[DeviceHealth]) -> None:
        self._current = list(initial)
        self._version = 0
        self._changed = asyncio.Condition()

    async def publish(self, devices: Sequence[DeviceHealth]) -> None:
        """Replace the list and wake every stream."""
        async with self._changed:
            self._current = list(devices)
            self._version += 1
            self._changed.notify_all()

    async def watch(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        """One kubelet stream: the current list now, then each new one."""
        async with self._changed:
            seen, devices = self._version, self._current
        yield devices
        while True:
            async with self._changed:
                while self._version == seen:
                    await self._changed.wait()
                seen, devices = self._version, self._current
            yield devices
