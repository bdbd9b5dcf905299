"""Inventory -> DRA devices (resource.k8s.io/v1 JSON); :mod:`.catalog` assembles the pool.

Attribute names follow the widely used NVIDIA DRA driver so users' selectors port by changing
the domain only; ``migCapable``, ``migEnabled``, ``numaNode`` and ``cliqueId`` are this driver's
additions.
"""

from __future__ import annotations

import re
from typing import Any

from dra_driver.gpu.inventory import Gpu, Inventory, MigDevice
from dra_driver.quantity import format_quantity

DEFAULT_DRIVER_NAME = "gpu.dra.dev"
STANDARD_DOMAIN = "resource.kubernetes.io"

JSON = dict[str, Any]

# DOTALL: whatever follows the numbers, newlines included, is judged (and dropped) as a whole.
_SEMVER_CORE = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)$", re.DOTALL)

# A pre-release identifier: a number without leading zeros, or [0-9A-Za-z-] with a non-digit.
_PRE_RELEASE_ID = r"(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
#: Semantic Versioning 2.0 (semver.org's pattern), as the API server checks version attributes
#: (``semverRe``); use with ``fullmatch``. ASCII: Go's ``\d`` is ASCII only, Python's is not.
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    rf"(?:-({_PRE_RELEASE_ID}(?:\.{_PRE_RELEASE_ID})*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?",
    re.ASCII,
)

#: The API's limit for string and version attribute values, in bytes (Go's ``len``).
MAX_STRING = 64


def to_semver(version: str) -> str:
    """Normalise an NVIDIA version string to semver 2.0 (the API validates versions).

    ``560.35.03`` -> ``560.35.3`` (no leading zeros), ``12.6`` -> ``12.6.0``, ``9.0`` -> ``9.0.0``.
    Anything after the numeric core (e.g. ``-rc1``) is kept only if the result is valid semver
    of at most :data:`MAX_STRING` bytes (``-01`` is not: a numeric pre-release has no leading
    zero), else dropped. Raises ValueError for text without a numeric core, or whose core alone
    is longer than the API accepts.
    """
    match = _SEMVER_CORE.match(version.strip())
    if not match:
        raise ValueError(f"not a version: {version!r}")
    major, minor, patch, rest = match.groups()
    core = ".".join(str(int(p or 0)) for p in (major, minor, patch))
    if len(core) > MAX_STRING:
        raise ValueError(f"version {version!r} is longer than {MAX_STRING} bytes")
    full = core + (rest or "")
    if SEMVER.fullmatch(full) and len(full.encode()) <= MAX_STRING:
        return full
    return core


def quantity(value: int) -> str:
    """An integer capacity as the canonical quantity text the API server stores for it.

    The server re-serialises quantities canonically; sending the canonical form keeps what it
    stores byte-equal to what was sent, so the publisher sees no drift.
    """
    if value < 0:
        raise ValueError("capacities are never negative")
    return format_quantity(value)


def fit_string(value: str) -> str:
    """``value`` cut to at most :data:`MAX_STRING` UTF-8 bytes, never inside a character.

    NVML names may be up to 96 bytes, and names decoded with replacement characters carry
    U+FFFD, three bytes each: a cut by characters can still be too long for the API.
    """
    # Only the cut can leave an incomplete character, at the end: "ignore" drops just that.
    return value.encode()[:MAX_STRING].decode(errors="ignore")


def _string(value: str) -> JSON:
    return {"string": fit_string(value)}


def _int(value: int) -> JSON:
    return {"int": value}


def _bool(value: bool) -> JSON:
    return {"bool": value}


def _version(value: str) -> JSON:
    return {"version": to_semver(value)}


def gpu_device_name(gpu: Gpu) -> str:
    """``gpu-<minor>``."""
    return f"gpu-{gpu.minor}"


def mig_profile_token(profile_name: str) -> str:
    """A MIG profile name as a DNS-label fragment: ``1g.10gb`` -> ``1g10gb``, ``+me`` -> ``me``."""
    return profile_name.replace(".", "").replace("+", "").lower()


def mig_device_name(parent_minor: int, profile_name: str, profile_id: int, start: int) -> str:
    """``gpu-<parentMinor>-mig-<profile without dots>-<giProfileId>-<placementStart>``."""
    return f"gpu-{parent_minor}-mig-{mig_profile_token(profile_name)}-{profile_id}-{start}"


def _common_attributes(gpu: Gpu, inventory: Inventory) -> JSON:
    attrs: JSON = {
        "productName": _string(gpu.product_name),
        "brand": _string(gpu.brand),
        "architecture": _string(gpu.architecture),
        "cudaComputeCapability": _version(gpu.cuda_compute_capability),
        "driverVersion": _version(inventory.driver_version),
        "cudaDriverVersion": _version(inventory.cuda_driver_version),
    }
    # A MIG device is at its GPU's PCI address, as the NVIDIA DRA driver publishes it too.
    attrs[f"{STANDARD_DOMAIN}/pciBusID"] = _string(gpu.pci_bus_id)
    if gpu.pcie_root:
        attrs[f"{STANDARD_DOMAIN}/pcieRoot"] = _string(gpu.pcie_root)
    if gpu.numa_node is not None:
        attrs["numaNode"] = _int(gpu.numa_node)
        # The standard name (k8s.io/dynamic-resource-allocation/deviceattribute), which other
        # drivers' devices (NICs, CPUs) carry too, so one claim can align them with
        # matchAttribute; the driver's own name stays for existing selectors.
        attrs[f"{STANDARD_DOMAIN}/numaNode"] = _int(gpu.numa_node)
    return attrs


def fabric_attributes(gpu: Gpu) -> JSON:
    """``cliqueId``: the multi-node NVLink clique (``<clusterUUID>.<cliqueId>``, the value of
    GPU feature discovery's ``nvidia.com/gpu.clique`` node label) of a fabric-attached GPU, so
    a claim can ask for GPUs of one NVLink domain (``matchAttribute``). Nothing otherwise.

    Whole GPUs only: a GPU in MIG mode has no NVLink, so its MIG devices are in no clique.
    """
    if gpu.fabric.clique is None:
        return {}
    return {"cliqueId": _string(gpu.fabric.clique)}


def gpu_device(gpu: Gpu, inventory: Inventory) -> JSON:
    """The DRA device for a whole GPU."""
    attributes: JSON = {
        "type": _string("gpu"),
        "uuid": _string(gpu.uuid),
        **_common_attributes(gpu, inventory),
        "migCapable": _bool(gpu.mig.capable),
        "migEnabled": _bool(gpu.mig_enabled),
        **fabric_attributes(gpu),
    }
    capacity: JSON = {
        "memory": {"value": quantity(gpu.memory_bytes)},
        "multiprocessors": {"value": quantity(gpu.multiprocessors)},
    }
    return {"name": gpu_device_name(gpu), "attributes": attributes, "capacity": capacity}


def list_attributes(gpu: Gpu) -> JSON:
    """A whole GPU's list-type attributes (DRAListTypeAttributes, alpha): the MIG profiles it
    supports (``migProfiles``), for selectors such as ``.migProfiles.includes("3g.40gb")``.
    Empty for GPUs without MIG."""
    if not gpu.mig.capable or not gpu.mig_profiles:
        return {}
    profiles = sorted({fit_string(p.name) for p in gpu.mig_profiles})
    return {"migProfiles": {"strings": profiles}}


def legacy_nvidia_attributes(gpu: Gpu, whole: bool) -> JSON:
    """Attributes older NVIDIA DRA driver releases published, which selectors (and its own
    examples) still name: ``pcieBusID`` (now the standard ``pciBusID``) on GPUs and MIG
    devices, on whole GPUs ``index`` and ``minor``, and on MIG devices their GPU's index as
    ``parentIndex``. Compat mode adds them."""
    legacy = {"pcieBusID": _string(gpu.pci_bus_id)}
    if whole:
        legacy |= {"index": _int(gpu.index), "minor": _int(gpu.minor)}
    else:
        legacy |= {"parentIndex": _int(gpu.index)}
    return legacy


def mig_device(gpu: Gpu, mig: MigDevice, inventory: Inventory) -> JSON:
    """The DRA device for a MIG device that exists on ``gpu``."""
    attributes: JSON = {
        "type": _string("mig"),
        "uuid": _string(mig.uuid),
        "parentUUID": _string(gpu.uuid),
        "profile": _string(mig.profile_name),
        **_common_attributes(gpu, inventory),
    }
    capacity: JSON = {
        name: {"value": quantity(value)}
        for name, value in (
            ("memory", mig.memory_bytes),
            ("multiprocessors", mig.multiprocessors),
            ("copyEngines", mig.copy_engines),
            ("decoders", mig.decoders),
            ("encoders", mig.encoders),
            ("jpegEngines", mig.jpeg_engines),
            ("ofaEngines", mig.ofa_engines),
        )
    }
    name = mig_device_name(gpu.minor, mig.profile_name, mig.profile_id, mig.placement.start)
    return {"name": name, "attributes": attributes, "capacity": capacity}


def devices_for_gpu(gpu: Gpu, inventory: Inventory) -> list[JSON]:
    """A GPU in MIG mode offers its MIG devices; any other GPU offers itself."""
    if gpu.mig_enabled:
        return [mig_device(gpu, m, inventory) for m in gpu.mig_devices]
    return [gpu_device(gpu, inventory)]
