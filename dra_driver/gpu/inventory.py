"""The node's GPU inventory: what discovery found, independent of how it was found.

Both discovery backends (NVML and simulated) produce an :class:`Inventory`; everything
downstream (devices, slices, prepare) reads only this model.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MIB = 1024 * 1024


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
    mig_devices: tuple[MigDevice, ...] = ()

    @property
    def mig_enabled(self) -> bool:
        """MIG mode as it is now (a pending change takes effect only after a GPU reset)."""
        return self.mig.capable and self.mig.current_enabled


class Inventory(_Model):
    """Everything the node agent knows about the node's GPUs."""

    driver_version: str  # "560.35.03"
    cuda_driver_version: str  # "12.6"
    gpus: tuple[Gpu, ...] = ()
