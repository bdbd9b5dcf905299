"""Picking the discovery backend the user asked for."""

from __future__ import annotations

from pathlib import Path

from dra_driver.gpu.discovery.base import Backend, Discovery, DiscoveryError


def make_discovery(
    backend: Backend, *, node_name: str, profile: str | None, driver_root: Path = Path("/")
) -> Discovery:
    """Construct the backend the user asked for.

    Each backend is imported only when chosen: the NVML bindings (pynvml, about 2.7 MiB) have
    no place in a simulated agent, nor the profile models and YAML in a real node's.
    """
    if backend == "simulated":
        if not profile:
            raise DiscoveryError("--backend simulated needs --profile NAME|FILE")
        from dra_driver.gpu.discovery.simulated import SimulatedDiscovery

        return SimulatedDiscovery(profile, node_name)
    from dra_driver.gpu.discovery.nvml import NvmlDiscovery

    return NvmlDiscovery(driver_root=driver_root)
