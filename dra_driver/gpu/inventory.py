"""The node's GPU inventory: what discovery found, independent of how it was found.

Both discovery backends (NVML and simulated) produce an :class:`Inventory`; everything
downstream (devices, slices, prepare) reads only this model.
"""

from __future__ import annotations

import uuid as uuidlib
from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MIB = 1024 * 1024

#: nvmlGpuFabricState_t, by name, in NVML's numbering (index = NVML value).
FabricState = Literal["not-supported", "not-started", "in-progress", "completed"]
FABRIC_STATES: tuple[FabricState, ...] = (
    "not-supported",
    "not-started",
    "in-progress",
    "completed",
)
_NO_CLUSTER = str(uuidlib.UUID(int=0))
_MAX_CLIQUE_ID = 2**32 - 1  # NVML's cliqueId is a uint32


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Placement(_Model):
    """A MIG placement on the GPU's memory-slice axis: ``start`` and ``size`` in slices."""

    start: int = Field(ge=0)
    size: int = Field(ge=1)


class MigProfile(_Model):
    """One GPU-instance profile a GPU supports (a row of ``nvidia-smi mig -lgip``)."""

    name: str  # e.g. "1g.10gb", "1g.10gb+me"
    profile_id: int = Field(ge=0)  # the GI profile id NVML reports (e.g. 19 for 1g)
    nvml_index: int = Field(ge=0)  # the NVML_GPU_INSTANCE_PROFILE_* constant it is queried by
    slice_count: int = Field(ge=1)  # compute slices
    instance_count: int = Field(ge=1)
    memory_bytes: int = Field(ge=0)
    multiprocessors: int = Field(ge=0)
    copy_engines: int = Field(ge=0)
    decoders: int = Field(ge=0)
    encoders: int = Field(ge=0)
    jpeg_engines: int = Field(ge=0)
    ofa_engines: int = Field(ge=0)
    placements: tuple[Placement, ...]

    def device(self, placement: Placement, uuid: str, gi_id: int, ci_id: int = 0) -> MigDevice:
        """The MIG device a GPU instance of this profile with one full-size compute instance is."""
        return MigDevice(
            uuid=uuid,
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            profile_id=self.profile_id,
            profile_name=self.name,
            placement=placement,
            memory_bytes=self.memory_bytes,
            multiprocessors=self.multiprocessors,
            copy_engines=self.copy_engines,
            decoders=self.decoders,
            encoders=self.encoders,
            jpeg_engines=self.jpeg_engines,
            ofa_engines=self.ofa_engines,
        )


class MigDevice(_Model):
    """A MIG device that exists on a GPU (a GPU instance plus its compute instance)."""

    uuid: str
    gpu_instance_id: int = Field(ge=0)
    compute_instance_id: int = Field(ge=0)
    profile_id: int = Field(ge=0)
    profile_name: str
    placement: Placement
    memory_bytes: int = Field(ge=0)
    multiprocessors: int = Field(ge=0)
    copy_engines: int = Field(ge=0)
    decoders: int = Field(ge=0)
    encoders: int = Field(ge=0)
    jpeg_engines: int = Field(ge=0)
    ofa_engines: int = Field(ge=0)


class MigState(_Model):
    """MIG capability and mode of one GPU."""

    capable: bool = False
    current_enabled: bool = False
    pending_enabled: bool = False


def format_clique(cluster_uuid: str, clique_id: int) -> str | None:
    """The clique ``<clusterUUID>.<cliqueId>`` as GPU feature discovery labels it
    (``nvidia.com/gpu.clique``): canonical lower-case UUID, decimal clique ID.

    None for the all-zero cluster UUID: NVML reports it for GPUs that have NVLink but are not
    part of a multi-node fabric. Raises ValueError for a malformed UUID or clique ID.
    """
    if not 0 <= clique_id <= _MAX_CLIQUE_ID:
        raise ValueError(f"clique ID {clique_id} is not a 32-bit unsigned number")
    canonical = str(uuidlib.UUID(cluster_uuid))
    if canonical == _NO_CLUSTER:
        return None
    return f"{canonical}.{clique_id}"


def parse_clique(text: str) -> tuple[str, int]:
    """``<clusterUUID>.<cliqueId>`` -> (canonical cluster UUID, clique ID); the inverse of
    :func:`format_clique`. Raises ValueError for anything else."""
    cluster, sep, clique = text.strip().rpartition(".")
    if not sep or not clique.isdigit():
        raise ValueError(f"clique {text!r}: expected <clusterUUID>.<cliqueId>")
    formatted = format_clique(cluster, int(clique))
    if formatted is None:
        raise ValueError(f"clique {text!r}: the all-zero cluster UUID names no fabric")
    return str(uuidlib.UUID(cluster)), int(clique)


class Fabric(_Model):
    """A GPU's multi-node NVLink fabric membership (GB200/GB300 NVL racks).

    ``clique`` (``<clusterUUID>.<cliqueId>``) is set only when the GPU is attached: NVML's
    cluster UUID and clique ID mean something only once fabric registration completed.
    """

    state: FabricState = "not-supported"
    clique: str | None = None

    @field_validator("clique")
    @classmethod
    def _canonical_clique(cls, value: str | None) -> str | None:
        # One spelling per clique, so cliques compare (and label nodes) by plain equality.
        if value is None:
            return None
        return format_clique(*parse_clique(value))

    @model_validator(mode="after")
    def _clique_needs_completed_registration(self) -> Fabric:
        if self.clique is not None and self.state != "completed":
            raise ValueError(f"a GPU in fabric state {self.state} has no clique yet")
        return self


class Gpu(_Model):
    """One physical GPU."""

    uuid: str
    minor: int = Field(ge=0)
    index: int = Field(ge=0)
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str  # "major.minor"
    pci_bus_id: str  # "0000:07:00.0"
    pcie_root: str | None = None  # "pci0000:00"
    numa_node: int | None = None
    memory_bytes: int = Field(ge=0)
    multiprocessors: int = Field(ge=0)
    mig: MigState = MigState()
    mig_profiles: tuple[MigProfile, ...] = ()
    # All the GPU's MIG compute and memory slices when mig_profiles lists only some of its
    # profiles (--mig-profiles); None: the slices mig_profiles span. See
    # dra_driver.gpu.publish.mig_capacity.totals.
    mig_compute_slices: int | None = Field(default=None, ge=1)
    mig_memory_slices: int | None = Field(default=None, ge=1)
    # The profile spanning the whole GPU (7g.80gb) when mig_profiles leaves it out: its
    # engines bound every MIG layout (dra_driver.gpu.publish.partitions.engine_totals).
    mig_full_profile: MigProfile | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    fabric: Fabric = Fabric()

    @property
    def mig_enabled(self) -> bool:
        """MIG mode as it is now (a pending change takes effect only after a GPU reset)."""
        return self.mig.capable and self.mig.current_enabled


class Inventory(_Model):
    """Everything the node agent knows about the node's GPUs."""

    driver_version: str  # "560.35.03"
    cuda_driver_version: str  # "12.6"
    gpus: tuple[Gpu, ...] = ()


def node_clique(inventory: Inventory) -> str | None:
    """The NVLink clique the node belongs to (the ``nvidia.com/gpu.clique`` label value): the
    clique of its fabric-attached GPUs, None when no GPU is attached.

    On a healthy node all attached GPUs share one clique. Should they disagree (a GPU whose
    registration went wrong), the clique most GPUs report wins, ties going to the smallest
    clique string, so every run on the same inventory labels the node the same way.
    """
    counts = Counter(g.fabric.clique for g in inventory.gpus if g.fabric.clique is not None)
    if not counts:
        return None
    return min(counts, key=lambda clique: (-counts[clique], clique))
