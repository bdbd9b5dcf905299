"""A readable table of the inventory, for ``dra-driver discover``."""

from __future__ import annotations

from dra_driver.gpu.inventory import Inventory, node_clique
from dra_driver.output import table as _rows


def _gib(value: int) -> str:
    return f"{value / 2**30:.1f}Gi"


def inventory_table(inventory: Inventory) -> str:
    """GPUs one per row, then existing MIG devices, then the driver versions and, on a node
    in a multi-node NVLink fabric, its clique."""
    gpu_rows = [
        [
            str(g.index),
            str(g.minor),
            g.product_name,
            g.architecture,
            g.cuda_compute_capability,
            _gib(g.memory_bytes),
            str(g.multiprocessors),
            ("on" if g.mig_enabled else "off") if g.mig.capable else "-",
            g.pci_bus_id,
            g.pcie_root or "-",
            "-" if g.numa_node is None else str(g.numa_node),
            g.uuid,
        ]
        for g in inventory.gpus
    ]
    lines = _rows(
        [
            "IDX",
            "MINOR",
            "PRODUCT",
            "ARCH",
            "CC",
            "MEMORY",
            "SMS",
            "MIG",
            "PCI",
            "PCIE-ROOT",
            "NUMA",
            "UUID",
        ],
        gpu_rows,
    )
    mig_rows = [
        [
            str(g.index),
            m.profile_name,
            f"{m.placement.start}:{m.placement.size}",
            _gib(m.memory_bytes),
            str(m.multiprocessors),
            m.uuid,
        ]
        for g in inventory.gpus
        for m in g.mig_devices
    ]
    if mig_rows:
        lines += [
            "",
            *_rows(["GPU", "MIG-PROFILE", "PLACEMENT", "MEMORY", "SMS", "UUID"], mig_rows),
        ]
    lines += ["", f"driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}"]
    clique = node_clique(inventory)
    if clique is not None:
        attached = sum(g.fabric.clique is not None for g in inventory.gpus)
        lines.append(f"NVLink clique {clique} ({attached} of {len(inventory.gpus)} GPUs)")
    return "\n".join(lines)
