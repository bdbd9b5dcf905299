"""Creating and destroying MIG devices: one small interface, a simulated implementation.

A MIG device is a GPU instance (GI: memory slices at a placement) plus a compute instance (CI)
spanning it. :class:`MigBackend` hides how they are made; :mod:`dra_driver.gpu.mig.nvml` does
it with NVML, :class:`SimulatedMig` keeps the state of a simulated node in a JSON file so that a
restarted driver sees what exists. All methods block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_driver.errors import DriverError
from dra_driver.gpu.inventory import Gpu, Inventory, MigDevice, MigProfile, MigState, Placement


class MigError(DriverError):
    """A MIG operation failed; the message is one line for a human."""


@dataclass(frozen=True)
class Instance:
    """A GPU instance that exists, with its MIG device once its compute instance exists."""

    gpu_instance_id: int
    profile_id: int
    placement: Placement
    device: MigDevice | None = None  # None: a GI whose CI was never created (or is gone)


class MigBackend(Protocol):
    """What the driver needs to carve MIG devices out of a GPU on demand."""

    def mig_enabled(self, gpu: Gpu) -> bool:
        """Whether MIG mode is on now."""
        ...

    def set_mig_mode(self, gpu: Gpu, enabled: bool) -> None:
        """Turn MIG mode on or off; raises :class:`MigError` if it needs a GPU reset."""
        ...

    def create(self, gpu: Gpu, profile: MigProfile, start: int) -> MigDevice:
        """Create a GI of ``profile`` at memory slice ``start`` and a CI spanning it."""
        ...

    def destroy(self, gpu: Gpu, gpu_instance_id: int) -> None:
        """Destroy a GI and its compute instances; an unknown id is not an error."""
        ...

    def list(self, gpu: Gpu) -> tuple[Instance, ...]:
        """The GPU instances that exist on ``gpu``."""
        ...


# -- placement rules (pure) --------------------------------------------------------------


def overlaps(a: Placement, b: Placement) -> bool:
    """Whether two placements share a memory slice."""
    return a.start < b.start + b.size and b.start < a.start + a.size


def check_create(
    gpu: Gpu, profile: MigProfile, start: int, existing: Sequence[Instance]
) -> Placement:
    """The placement a new GI would take, or :class:`MigError` saying why it cannot exist.

    The rules NVML enforces: the start must be one of the profile's placements, the GI must
    not share a memory slice with another, and the profile's instance limit holds.
    """
    placement = next((p for p in profile.placements if p.start == start), None)
    if placement is None:
        valid = ", ".join(str(p.start) for p in profile.placements)
        raise MigError(
            f"GPU {gpu.uuid}: MIG profile {profile.name} cannot start at memory slice {start} "
            f"(valid starts: {valid})"
        )
    clash = next((i for i in existing if overlaps(i.placement, placement)), None)
    if clash is not None:
        raise MigError(
            f"GPU {gpu.uuid}: {profile.name} at {start} overlaps GPU instance "
            f"{clash.gpu_instance_id} (profile {clash.profile_id} at {clash.placement.start})"
        )
    same = sum(1 for i in existing if i.profile_id == profile.profile_id)
    if same >= profile.instance_count:
        raise MigError(
            f"GPU {gpu.uuid}: MIG profile {profile.name} allows {profile.instance_count} "
            "instance(s) and that many exist"
        )
    return placement


def profile_by_id(gpu: Gpu, profile_id: int) -> MigProfile | None:
    """The GPU's GI profile with this id."""
    return next((p for p in gpu.mig_profiles if p.profile_id == profile_id), None)


def live_inventory(inventory: Inventory, backend: MigBackend) -> Inventory:
    """``inventory`` with each MIG-capable GPU's mode and MIG devices as they are now."""
    gpus = []
    for gpu in inventory.gpus:
        if not gpu.mig.capable:
            gpus.append(gpu)
            continue
        enabled = backend.mig_enabled(gpu)
        devices = tuple(i.device for i in backend.list(gpu) if i.device is not None)
        gpus.append(
            gpu.model_copy(
                update={
                    "mig": MigState(capable=True, current_enabled=enabled, pending_enabled=enabled),
                    "mig_devices": devices if enabled else (),
                }
            )
        )
    return inventory.model_copy(update={"gpus": tuple(gpus)})


# -- the simulated backend ---------------------------------------------------------------
