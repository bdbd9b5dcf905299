"""The one interface both discovery backends implement, and how to pick one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal, Protocol

from dra_driver.gpu.inventory import Inventory

Backend = Literal["nvml", "simulated"]


class DiscoveryError(Exception):
    """Discovery cannot produce an inventory; the message is one line meant for a human."""


class Discovery(Protocol):
    """Something that can list the node's GPUs. ``discover`` may block (NVML calls)."""

    def discover(self) -> Inventory:
        """Return the current inventory."""
        ...


def make_discovery(
    backend: Backend, *, node_name: str, profile: str | None, driver_root: Path = Path("/")
) -> Discovery:
    """Construct the backend the user asked for."""
    if backend == "simulated":
        from dra_driver.gpu.simulated import SimulatedDiscovery

        if not profile:
            raise DiscoveryError("--backend simulated needs --profile NAME|FILE")
        return SimulatedDiscovery(profile, node_name)
    from dra_driver.gpu.nvml import NvmlDiscovery

    return NvmlDiscovery(driver_root=driver_root)


async def discover_async(discovery: Discovery) -> Inventory:
    """Run a (blocking) discovery in a worker thread, never on the event loop."""
    return await asyncio.to_thread(discovery.discover)
