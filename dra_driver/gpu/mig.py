"""Creating and destroying MIG devices: one small interface, a simulated implementation.

A MIG device is a GPU instance (GI: memory slices at a placement) plus a compute instance (CI)
spanning it. :class:`MigBackend` hides how they are made; :mod:`dra_driver.gpu.nvml_mig` does
it with NVML, :class:`SimulatedMig` keeps the state of a simulated node in a JSON file so that a
restarted driver sees what exists. All methods block.
"""

from __future__ import annotations

import json
import threading
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver import faults
from dra_driver.cdi.writer import write_atomic
from dra_driver.gpu.inventory import Gpu, Inventory, MigDevice, MigProfile, MigState, Placement

SIMULATED_STATE_FILE = "simulated-mig.json"


class MigError(Exception):
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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _SimInstance(_Model):
    gi_id: int = Field(alias="giId", ge=1)
    profile_id: int = Field(alias="profileId", ge=0)
    start: int = Field(ge=0)
    size: int = Field(ge=1)
    ci_id: int | None = Field(default=None, alias="ciId")  # None: no compute instance yet
    uuid: str = ""


class _SimGpu(_Model):
    mig_enabled: bool = Field(alias="migEnabled")
    instances: list[_SimInstance] = Field(default_factory=list)


class _SimState(_Model):
    gpus: dict[str, _SimGpu] = Field(default_factory=dict)  # by GPU UUID


class SimulatedMig:
    """MIG on a simulated node: the rules NVML enforces, state in a JSON file.

    The file is created from the node profile's MIG mode and MIG devices on first use and
    written atomically after every change, so a driver killed at any point and restarted
    finds exactly the instances that existed. Creating a GI and its CI are two writes, with
    the fault points ``mig.gi-created`` and ``mig.ci-destroyed`` between them, as on real
    hardware where either step can be the last one before a crash.
    """

    def __init__(self, path: Path, inventory: Inventory) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._state = self._load(inventory)

    def _read(self) -> _SimState | None:
        try:
            return _SimState.model_validate_json(self.path.read_text())
        except FileNotFoundError:
            return None
        except (ValidationError, ValueError) as exc:
            first = str(exc).splitlines()[0]
            raise MigError(f"simulated MIG state {self.path} is corrupt: {first}") from None

    def _load(self, inventory: Inventory) -> _SimState:
        found = self._read()
        if found is not None:
            return found
        state = _SimState(
            gpus={
                g.uuid: _SimGpu(
                    mig_enabled=g.mig_enabled,
                    instances=[
                        _SimInstance(
                            gi_id=d.gpu_instance_id,
                            profile_id=d.profile_id,
                            start=d.placement.start,
                            size=d.placement.size,
                            ci_id=d.compute_instance_id,
                            uuid=d.uuid,
                        )
                        for d in g.mig_devices
                    ],
                )
                for g in inventory.gpus
                if g.mig.capable
            }
        )
        self._save(state)
        return state

    def _save(self, state: _SimState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.loads(state.model_dump_json(by_alias=True)))

    def _gpu(self, gpu: Gpu) -> _SimGpu:
        # Re-read on every call: like the hardware, the file is shared by every process.
        self._state = self._read() or self._state
        found = self._state.gpus.get(gpu.uuid)
        if found is None:
            raise MigError(f"GPU {gpu.uuid} is not MIG capable")
        return found

    def mig_enabled(self, gpu: Gpu) -> bool:
        """Whether MIG mode is on."""
        with self._lock:
            return self._gpu(gpu).mig_enabled

    def set_mig_mode(self, gpu: Gpu, enabled: bool) -> None:
        """Switch MIG mode (at once: a simulated GPU needs no reset)."""
        with self._lock:
            sim = self._gpu(gpu)
            if sim.mig_enabled == enabled:
                return
            if not enabled and sim.instances:
                raise MigError(f"GPU {gpu.uuid}: cannot turn MIG off while GPU instances exist")
            sim.mig_enabled = enabled
            self._save(self._state)

    def _instances(self, gpu: Gpu, sim: _SimGpu) -> tuple[Instance, ...]:
        out = []
        for i in sim.instances:
            placement = Placement(start=i.start, size=i.size)
            profile = profile_by_id(gpu, i.profile_id)
            device = None
            if i.ci_id is not None and profile is not None:
                device = profile.device(placement, i.uuid, i.gi_id, i.ci_id)
            out.append(Instance(i.gi_id, i.profile_id, placement, device))
        return tuple(out)

    def list(self, gpu: Gpu) -> tuple[Instance, ...]:
        """The GPU instances that exist."""
        with self._lock:
            return self._instances(gpu, self._gpu(gpu))

    def create(self, gpu: Gpu, profile: MigProfile, start: int) -> MigDevice:
        """Create a GI and its CI, each persisted before the next step."""
        with self._lock:
            sim = self._gpu(gpu)
            if not sim.mig_enabled:
                raise MigError(f"GPU {gpu.uuid}: MIG mode is off")
            placement = check_create(gpu, profile, start, self._instances(gpu, sim))
            used = {i.gi_id for i in sim.instances}
            gi_id = next(n for n in range(1, len(used) + 2) if n not in used)
            record = _SimInstance(
                gi_id=gi_id, profile_id=profile.profile_id, start=start, size=placement.size
            )
            sim.instances.append(record)
            self._save(self._state)
            faults.point("mig.gi-created")
            # Real MIG devices get a fresh UUID each time they are created.
            record.ci_id, record.uuid = 0, f"MIG-{uuidlib.uuid4()}"
            self._save(self._state)
            return profile.device(placement, record.uuid, gi_id)

    def destroy(self, gpu: Gpu, gpu_instance_id: int) -> None:
        """Destroy the CI, then the GI (two persisted steps)."""
        with self._lock:
            sim = self._gpu(gpu)
            record = next((i for i in sim.instances if i.gi_id == gpu_instance_id), None)
            if record is None:
                return
            if record.ci_id is not None:
                record.ci_id, record.uuid = None, ""
                self._save(self._state)
                faults.point("mig.ci-destroyed")
            sim.instances.remove(record)
            self._save(self._state)


def make_mig_backend(
    backend: str, *, state_dir: Path, inventory: Inventory, driver_root: Path = Path("/")
) -> MigBackend:
    """The MIG backend matching the discovery backend."""
    if backend == "simulated":
        return SimulatedMig(state_dir / SIMULATED_STATE_FILE, inventory)
    from dra_driver.gpu.nvml_mig import NvmlMig

    return NvmlMig(driver_root=driver_root)
