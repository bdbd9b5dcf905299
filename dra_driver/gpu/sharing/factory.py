"""Picking the sharing backend that matches the discovery backend."""

from __future__ import annotations

from pathlib import Path

from dra_driver.gpu.sharing.backend import SharingBackend


def make_sharing_backend(
    backend: str,
    *,
    state_dir: Path,
    driver_root: Path = Path("/"),
    host_driver_root: Path | None = None,
) -> SharingBackend:
    """The sharing backend matching the discovery backend; ``host_driver_root`` is where the
    host has the driver root the agent sees at ``driver_root`` (MPS daemons run on the host).
    Imported only when chosen, as in :func:`~dra_driver.gpu.discovery.factory.make_discovery`."""
    if backend == "simulated":
        from dra_driver.gpu.sharing.simulated import SIMULATED_STATE_FILE, SimulatedSharing

        return SimulatedSharing(state_dir / SIMULATED_STATE_FILE)
    from dra_driver.gpu.sharing.host import HostSharing

    return HostSharing(
        mps_root=state_dir / "mps", driver_root=driver_root, host_driver_root=host_driver_root
    )
