"""Discovery from a node profile: the driver runs, and is tested, on machines without GPUs.

A profile names GPU products from a catalogue of real product facts (``profiles/products.yaml``)
and places them on the node (PCI bus, PCIe root, NUMA node, MIG mode and existing MIG devices).
UUIDs are derived from the node name, so a node keeps its GPUs' identities across restarts.

A profile with a ``fabric`` section puts all its GPUs in one multi-node NVLink clique. The
clique is the profile's, not derived from the node name, so every node simulated from the
profile lands in the same clique, as the compute trays of one NVL72 rack do;
``$DRA_SIMULATED_CLIQUE`` moves one node to another clique (another rack).
"""

from __future__ import annotations

import hashlib
import os
import uuid as uuidlib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dra_driver.gpu.discovery.base import DiscoveryError
from dra_driver.gpu.inventory import (
    MIB,
    Fabric,
    Gpu,
    Inventory,
    MigDevice,
    MigProfile,
    MigState,
    Placement,
    format_clique,
    parse_clique,
)

_PACKAGE = "dra_driver.gpu.discovery"  # holds profiles/
BUILTIN_PROFILES = ("dgx-a100", "dgx-h100", "gb200", "l4x4", "mixed")
#: Overrides the clique of a fabric-attached profile on this node: ``<cliqueId>`` (same
#: cluster) or ``<clusterUUID>.<cliqueId>``.
CLIQUE_ENV = "DRA_SIMULATED_CLIQUE"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ProductMigProfile(_Strict):
    """A MIG profile row of the product catalogue (compact field names, as in the YAML)."""

    name: str
    id: int = Field(ge=0)
    nvml_index: int = Field(alias="nvmlIndex", ge=0)
    slices: int = Field(ge=1)
    instances: int = Field(ge=1)
    memory_mib: int = Field(alias="memoryMiB", ge=0)
    sm: int = Field(ge=0)
    ce: int = Field(ge=0)
    dec: int = Field(ge=0)
    enc: int = Field(ge=0)
    jpeg: int = Field(ge=0)
    ofa: int = Field(ge=0)
    placements: tuple[Placement, ...]

    @field_validator("placements", mode="before")
    @classmethod
    def _parse_placements(cls, value: Any) -> Any:
        # "0,2,4:2" -> starts 0, 2 and 4, each 2 memory slices wide.
        if not isinstance(value, str):
            return value
        starts, sep, size = value.partition(":")
        if not sep:
            raise ValueError(f"placements {value!r}: expected 'start,start,...:size'")
        return tuple(Placement(start=int(s), size=int(size)) for s in starts.split(","))

    def to_inventory(self) -> MigProfile:
        """This row as an inventory MIG profile."""
        return MigProfile(
            name=self.name,
            profile_id=self.id,
            nvml_index=self.nvml_index,
            slice_count=self.slices,
            instance_count=self.instances,
            memory_bytes=self.memory_mib * MIB,
            multiprocessors=self.sm,
            copy_engines=self.ce,
            decoders=self.dec,
            encoders=self.enc,
            jpeg_engines=self.jpeg,
            ofa_engines=self.ofa,
            placements=self.placements,
        )


class Product(_Strict):
    """A GPU product with the facts NVML reports for it."""

    name: str
    brand: str
    architecture: str
    compute_capability: str = Field(alias="computeCapability", pattern=r"^\d+\.\d+$")
    memory_mib: int = Field(alias="memoryMiB", gt=0)
    multiprocessors: int = Field(gt=0)
    mig_profiles: tuple[ProductMigProfile, ...] = Field(default=(), alias="migProfiles")


class ProfileMigDevice(_Strict):
    """A MIG device that already exists on a simulated GPU."""

    profile: str
    start: int = Field(ge=0)


class ProfileGpu(_Strict):
    """One GPU of a node profile."""

    product: str
    pci_bus_id: str = Field(
        alias="pciBusId", pattern=r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"
    )
    pcie_root: str | None = Field(default=None, alias="pcieRoot")
    numa_node: int | None = Field(default=None, alias="numaNode", ge=0)
    minor: int | None = Field(default=None, ge=0)
    mig_enabled: bool = Field(default=False, alias="migEnabled")
    mig_devices: tuple[ProfileMigDevice, ...] = Field(default=(), alias="migDevices")


class ProfileFabric(_Strict):
    """The multi-node NVLink fabric every GPU of the node is attached to."""

    cluster_uuid: str = Field(alias="clusterUuid")
    clique_id: int = Field(alias="cliqueId", ge=0, le=2**32 - 1)

    @field_validator("cluster_uuid")
    @classmethod
    def _real_cluster(cls, value: str) -> str:
        if format_clique(value, 0) is None:
            raise ValueError("the all-zero cluster UUID means no fabric; omit `fabric` instead")
        return str(uuidlib.UUID(value))

    @property
    def clique(self) -> str:
        """``<clusterUUID>.<cliqueId>``."""
        return f"{self.cluster_uuid}.{self.clique_id}"


class NodeProfile(_Strict):
    """A simulated node: driver versions, extra products, the GPUs it holds and their fabric."""

    driver_version: str = Field(alias="driverVersion")
    cuda_driver_version: str = Field(alias="cudaDriverVersion", pattern=r"^\d+\.\d+$")
    products: tuple[Product, ...] = ()
    fabric: ProfileFabric | None = None
    gpus: tuple[ProfileGpu, ...]


#: libyaml's loader where PyYAML was built with it: a 72-GPU profile loads in 2 ms instead
#: of 45, which the agent pays between binding its sockets and publishing its slices.
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(text: str) -> Any:
    """``text`` parsed safely; a syntax error is raised by the pure-Python loader, whose
    message shows the offending line (libyaml's only names it)."""
    try:
        return yaml.load(text, Loader=_FAST_LOADER)  # a safe loader (C or Python)
    except yaml.YAMLError:
        return yaml.safe_load(text)


@cache
def builtin_products() -> dict[str, Product]:
    """The product catalogue shipped with the package, by product name."""
    text = resources.files(_PACKAGE).joinpath("profiles/products.yaml").read_text()
    return {p.name: p for p in (Product.model_validate(item) for item in _load_yaml(text))}


def load_profile(name_or_path: str) -> NodeProfile:
    """Load a built-in profile by name, or a YAML profile file by path."""
    if name_or_path in BUILTIN_PROFILES:
        source = f"built-in profile {name_or_path!r}"
        text = resources.files(_PACKAGE).joinpath(f"profiles/{name_or_path}.yaml")
        raw = text.read_text()
    else:
        path = Path(name_or_path)
        source = f"profile file {str(path)!r}"
        if not path.is_file():
            raise DiscoveryError(
                f"{source} does not exist; use a path or one of: {', '.join(BUILTIN_PROFILES)}"
            )
        raw = path.read_text()
    try:
        data = _load_yaml(raw)
    except yaml.YAMLError as exc:
        raise DiscoveryError(f"{source} is not valid YAML: {exc}".replace("\n", " ")) from None
    try:
        return NodeProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise DiscoveryError(f"{source}: {where}: {first['msg']}") from None


def stable_uuid(prefix: str, *parts: object) -> str:
    """A UUID that depends only on ``parts`` (e.g. node name and GPU index)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return f"{prefix}-{uuidlib.UUID(bytes=digest[:16])}"


def overlaps(a: Placement, b: Placement) -> bool:
    """Whether two placements share a memory slice."""
    return a.start < b.start + b.size and b.start < a.start + a.size


def build_mig_device(
    node_name: str, gpu_index: int, profile: MigProfile, start: int, gi_id: int
) -> MigDevice:
    """The MIG device a GPU instance of ``profile`` at ``start`` would be."""
    placement = next((p for p in profile.placements if p.start == start), None)
    if placement is None:
        valid = ", ".join(str(p.start) for p in profile.placements)
        raise DiscoveryError(
            f"MIG profile {profile.name} cannot start at memory slice {start} (valid: {valid})"
        )
    return profile.device(
        placement, stable_uuid("MIG", node_name, gpu_index, profile.profile_id, start), gi_id
    )


def _mig_devices(
    node_name: str, index: int, spec: ProfileGpu, profiles: tuple[MigProfile, ...]
) -> tuple[MigDevice, ...]:
    by_name = {p.name: p for p in profiles}
    devices: list[MigDevice] = []
    for gi_id, wanted in enumerate(spec.mig_devices, start=1):
        profile = by_name.get(wanted.profile)
        if profile is None:
            raise DiscoveryError(
                f"GPU {index}: unknown MIG profile {wanted.profile!r} for {spec.product} "
                f"(known: {', '.join(by_name) or 'none'})"
            )
        device = build_mig_device(node_name, index, profile, wanted.start, gi_id)
        clash = next((d for d in devices if overlaps(d.placement, device.placement)), None)
        if clash is not None:
            raise DiscoveryError(
                f"GPU {index}: MIG device {wanted.profile}@{wanted.start} overlaps "
                f"{clash.profile_name}@{clash.placement.start}"
            )
        devices.append(device)
    return tuple(devices)


def resolve_clique(fabric: ProfileFabric | None, override: str | None) -> str | None:
    """The clique a simulated node's GPUs are in: the profile's, unless ``override`` names
    another (``<cliqueId>`` in the profile's cluster, or ``<clusterUUID>.<cliqueId>``).

    A profile without a fabric has no clique whatever the override says: the override picks
    a rack for fabric-attached nodes, it cannot give NVLink to GPUs without it.
    """
    if fabric is None:
        return None
    text = (override or "").strip()
    if not text:
        return fabric.clique
    try:
        cluster, clique_id = (
            (fabric.cluster_uuid, int(text)) if text.isdigit() else parse_clique(text)
        )
        return format_clique(cluster, clique_id)
    except ValueError as exc:
        raise DiscoveryError(
            f"{CLIQUE_ENV}={text!r}: expected <cliqueId> or <clusterUUID>.<cliqueId> ({exc})"
        ) from None


def build_inventory(profile: NodeProfile, node_name: str, clique: str | None = None) -> Inventory:
    """Resolve a node profile into the inventory NVML would report on such a node.

    ``clique`` overrides the profile's fabric clique (see :func:`resolve_clique`).
    """
    products = {**builtin_products(), **{p.name: p for p in profile.products}}
    node_clique = resolve_clique(profile.fabric, clique)
    fabric = Fabric(state="completed", clique=node_clique) if node_clique else Fabric()
    gpus: list[Gpu] = []
    for index, spec in enumerate(profile.gpus):
        product = products.get(spec.product)
        if product is None:
            raise DiscoveryError(
                f"GPU {index}: unknown product {spec.product!r} (known: {', '.join(products)})"
            )
        mig_profiles = tuple(p.to_inventory() for p in product.mig_profiles)
        capable = bool(mig_profiles)
        if (spec.mig_enabled or spec.mig_devices) and not capable:
            raise DiscoveryError(f"GPU {index}: {spec.product} does not support MIG")
        if spec.mig_devices and not spec.mig_enabled:
            raise DiscoveryError(f"GPU {index}: migDevices need migEnabled: true")
        gpus.append(
            Gpu(
                uuid=stable_uuid("GPU", node_name, index),
                minor=index if spec.minor is None else spec.minor,
                index=index,
                product_name=product.name,
                brand=product.brand,
                architecture=product.architecture,
                cuda_compute_capability=product.compute_capability,
                pci_bus_id=spec.pci_bus_id,
                pcie_root=spec.pcie_root,
                numa_node=spec.numa_node,
                memory_bytes=product.memory_mib * MIB,
                multiprocessors=product.multiprocessors,
                mig=MigState(
                    capable=capable,
                    current_enabled=spec.mig_enabled,
                    pending_enabled=spec.mig_enabled,
                ),
                mig_profiles=mig_profiles,
                mig_devices=_mig_devices(node_name, index, spec, mig_profiles),
                fabric=fabric,
            )
        )
    minors = [g.minor for g in gpus]
    if len(set(minors)) != len(minors):
        raise DiscoveryError(f"GPU minor numbers must be unique, got {minors}")
    return Inventory(
        driver_version=profile.driver_version,
        cuda_driver_version=profile.cuda_driver_version,
        gpus=tuple(gpus),
    )


class SimulatedDiscovery:
    """Discovery backend that reads a node profile instead of the hardware."""

    def __init__(self, profile: str, node_name: str, clique: str | None = None) -> None:
        """``clique`` defaults to ``$DRA_SIMULATED_CLIQUE`` (unset: the profile's clique)."""
        self._profile = load_profile(profile)
        self._node_name = node_name
        self._clique = os.environ.get(CLIQUE_ENV) if clique is None else clique
        # A bad override fails at start, not at the first discovery.
        resolve_clique(self._profile.fabric, self._clique)

    def discover(self) -> Inventory:
        """The inventory of the simulated node."""
        return build_inventory(self._profile, self._node_name, self._clique)
