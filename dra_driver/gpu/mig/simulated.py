"""MIG on a simulated node: the state lives in a JSON file so a restarted driver sees it."""

from __future__ import annotations

import json
import threading
import uuid as uuidlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver import faults
from dra_driver.cdi.writer import write_atomic
from dra_driver.gpu.inventory import Gpu, Inventory, MigDevice, MigProfile, Placement
from dra_driver.gpu.mig.backend import Instance, MigError, check_create, profile_by_id

SIMULATED_STATE_FILE = "simulated-mig.json"


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
    # Set by a test: creating a GPU instance fails with this error (a GPU in a bad state).
    fail_create: str | None = Field(default=None, alias="failCreate")


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
        write_atomic(self.path, json.loads(state.model_dump_json(by_alias=True, exclude_none=True)))

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
        """Create a GI and its CI, each persisted before the next step.

        Every check comes before the GI exists and only a crash comes between the two steps,
        so a create that raises leaves no GI behind, as
        :meth:`dra_driver.gpu.mig.nvml.NvmlMig.create` ensures by destroying it: the carver
        never has to find one by placement.
        """
        with self._lock:
            sim = self._gpu(gpu)
            if not sim.mig_enabled:
                raise MigError(f"GPU {gpu.uuid}: MIG mode is off")
            if sim.fail_create:
                raise MigError(f"GPU {gpu.uuid}: creating a GPU instance failed: {sim.fail_create}")
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
