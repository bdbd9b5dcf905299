"""Render an :class:`Inventory` as the stand-in NVML library's data file and a fake sysfs tree.

The data file format is documented at the top of ``fakenvml.c``. Rendering from the same
inventory the simulated backend builds means the stand-in library and the simulated
backend describe the same node, so the two discovery backends can be compared exactly.

The enum and cores-per-SM tables below are written out independently of
``dra_driver.gpu.discovery.nvml`` on purpose: a wrong entry there shows up as a test failure here.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.gpu.inventory import (
    FABRIC_STATES,
    MIB,
    Fabric,
    Gpu,
    Inventory,
    MigProfile,
    parse_clique,
)

# nvmlBrandType_t values (nvml.h).
BRAND_VALUES = {
    "Unknown": 0,
    "Quadro": 1,
    "Tesla": 2,
    "NVS": 3,
    "Grid": 4,
    "GeForce": 5,
    "Titan": 6,
    "QuadroRTX": 12,
    "NvidiaRTX": 13,
    "Nvidia": 14,
}
# nvmlDeviceArchitecture_t values (nvml.h).
ARCH_VALUES = {
    "Kepler": 2,
    "Maxwell": 3,
    "Pascal": 4,
    "Volta": 5,
    "Turing": 6,
    "Ampere": 7,
    "Ada Lovelace": 8,
    "Hopper": 9,
    "Blackwell": 10,
}
# FP32 cores per SM for the compute capabilities the product catalogue uses.
CORES_PER_SM = {
    "7.0": 64,
    "7.5": 64,
    "8.0": 64,
    "8.6": 128,
    "8.7": 128,
    "8.9": 128,
    "9.0": 128,
    "10.0": 128,
    "12.0": 128,
}


def nvml_bus_id(bus_id: str) -> str:
    """``0000:07:00.0`` as NVML prints it: ``00000000:07:00.0`` (8-digit domain, upper case)."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def cuda_version_int(version: str) -> int:
    """``"12.6"`` as NVML's integer ``12060``."""
    major, minor = version.split(".")
    return int(major) * 1000 + int(minor) * 10


def _placements(profile: MigProfile) -> str:
    sizes = {p.size for p in profile.placements}
    if len(sizes) != 1:
        raise ValueError(f"profile {profile.name}: placements of different sizes")
    return ",".join(str(p.start) for p in profile.placements) + f":{sizes.pop()}"


def fabric_line(fabric: Fabric) -> str | None:
    """The ``fabric`` record of a GPU's fabric; None (no record: NVML answers NOT_SUPPORTED)
    for a GPU without one."""
    if fabric.state == "not-supported" and fabric.clique is None:
        return None
    state = FABRIC_STATES.index(fabric.state)
    if fabric.clique is None:
        return f"fabric {state}"
    cluster, clique_id = parse_clique(fabric.clique)
    return f"fabric {state} {cluster} {clique_id}"


def _gpu_lines(gpu: Gpu) -> list[str]:
    lines = [
        f"gpu {gpu.uuid}",
        f"minor {gpu.minor}",
        f"name {gpu.product_name}",
        f"brand {BRAND_VALUES[gpu.brand]}",
        f"arch {ARCH_VALUES[gpu.architecture]}",
        "cc {} {}".format(*gpu.cuda_compute_capability.split(".")),
        f"pci {nvml_bus_id(gpu.pci_bus_id)}",
        f"memory {gpu.memory_bytes}",
        f"cores {gpu.multiprocessors * CORES_PER_SM[gpu.cuda_compute_capability]}",
    ]
    fabric = fabric_line(gpu.fabric)
    if fabric is not None:
        lines.append(fabric)
    if gpu.mig.capable:
        lines.append(f"mig {int(gpu.mig.current_enabled)} {int(gpu.mig.pending_enabled)}")
        # NVML reports the most MIG devices the GPU can hold: its smallest profile's count.
        lines.append(f"maxmig {max((p.instance_count for p in gpu.mig_profiles), default=0)}")
    for p in gpu.mig_profiles:
        if p.memory_bytes % MIB:
            raise ValueError(f"profile {p.name}: memory is not a whole number of MiB")
        lines.append(
            f"profile {p.nvml_index} {p.profile_id} {p.slice_count} {p.instance_count} "
            f"{p.multiprocessors} {p.copy_engines} {p.decoders} {p.encoders} "
            f"{p.jpeg_engines} {p.ofa_engines} {p.memory_bytes // MIB} {_placements(p)} "
            f"MIG {p.name}"
        )
    for d in gpu.mig_devices:
        lines.append(
            f"gi {d.gpu_instance_id} {d.profile_id} {d.placement.start} {d.placement.size}"
        )
    for d in gpu.mig_devices:
        lines.append(f"ci {d.gpu_instance_id} {d.compute_instance_id} {d.uuid}")
    return lines


def render(inventory: Inventory) -> str:
    """The stand-in library's data file describing ``inventory``."""
    lines = [
        "# fakenvml data (format: tests/fakenvml/fakenvml.c)",
        f"driver {inventory.driver_version}",
        f"cuda {cuda_version_int(inventory.cuda_driver_version)}",
    ]
    for gpu in inventory.gpus:
        lines.extend(_gpu_lines(gpu))
    return "\n".join(lines) + "\n"


def render_sysfs(inventory: Inventory, root: Path) -> None:
    """A sysfs tree under ``root`` giving each GPU its PCIe root and NUMA node.

    As on a real node, ``bus/pci/devices/<bus id>`` is a relative symlink to
    ``devices/pciDDDD:BB/<bridge>/<bus id>``, which holds ``numa_node`` (-1: none).
    A GPU without a PCIe root gets no entry at all, so both facts read as unknown.
    """
    bus_dir = root / "bus" / "pci" / "devices"
    bus_dir.mkdir(parents=True, exist_ok=True)
    for gpu in inventory.gpus:
        if gpu.pcie_root is None:
            continue
        root_bus = gpu.pcie_root.removeprefix("pci")
        bridge = f"{root_bus}:01.0"
        device_dir = root / "devices" / gpu.pcie_root / bridge / gpu.pci_bus_id
        device_dir.mkdir(parents=True, exist_ok=True)
        numa = -1 if gpu.numa_node is None else gpu.numa_node
        (device_dir / "numa_node").write_text(f"{numa}\n")
        link = bus_dir / gpu.pci_bus_id
        if link.is_symlink():
            link.unlink()
        link.symlink_to(Path("../../..") / device_dir.relative_to(root))
