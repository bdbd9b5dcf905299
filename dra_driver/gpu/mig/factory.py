"""Picking the MIG backend that matches the discovery backend."""

from __future__ import annotations

from pathlib import Path

from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.mig.backend import MigBackend


def make_mig_backend(
    backend: str, *, state_dir: Path, inventory: Inventory, driver_root: Path = Path("/")
) -> MigBackend:
    """The MIG backend matching the discovery backend (imported only when chosen, as in
    :func:`~dra_driver.gpu.discovery.factory.make_discovery`)."""
    if backend == "simulated":
        from dra_driver.gpu.mig.simulated import SIMULATED_STATE_FILE, SimulatedMig

        return SimulatedMig(state_dir / SIMULATED_STATE_FILE, inventory)
    from dra_driver.gpu.mig.nvml import NvmlMig

    return NvmlMig(driver_root=driver_root)
