"""Picking the discovery backend the user asked for."""

from __future__ import annotations

from pathlib import Path

from dra_driver.gpu.discovery.base import Backend, Discovery, DiscoveryError
from dra_driver.gpu.discovery.nvml import NvmlDiscovery
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery


def make_discovery(
    backend: Backend, *, node_name: str, profile: str | None, driver_root: Path = Path("/")
) -> Discovery:
    """Construct the backend the user asked for."""
    if backend == "simulated":
        if not profile:
            raise DiscoveryError("--backend simulated needs --profile NAME|FILE")
        return SimulatedDiscovery(profile, node_name)
    return NvmlDiscovery(driver_root=driver_root)
