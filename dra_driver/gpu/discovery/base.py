"""The one interface both discovery backends implement."""

from __future__ import annotations

import asyncio
from typing import Literal, Protocol

from dra_driver.errors import StartError
from dra_driver.gpu.inventory import Inventory

Backend = Literal["nvml", "simulated"]


class DiscoveryError(StartError):
    """Discovery cannot produce an inventory; the message is one line meant for a human."""


class Discovery(Protocol):
    """Something that can list the node's GPUs. ``discover`` may block (NVML calls)."""

    def discover(self) -> Inventory:
        """Return the current inventory."""
        ...


async def discover_async(discovery: Discovery) -> Inventory:
    """Run a (blocking) discovery in a worker thread, never on the event loop."""
    return await asyncio.to_thread(discovery.discover)
