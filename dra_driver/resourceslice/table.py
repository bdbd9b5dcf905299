"""A readable table of ResourceSlices, for ``dra-driver slices -o table``."""

from __future__ import annotations

from typing import Any

from dra_driver.output import table
from dra_driver.quantity import NANOS, QuantityError, parse_quantity


def _attribute(device: dict[str, Any], name: str) -> str:
    value = (device.get("attributes") or {}).get(name) or {}
    return str(next(iter(value.values()), "")) if value else ""


def _memory(device: dict[str, Any]) -> str:
    raw = ((device.get("capacity") or {}).get("memory") or {}).get("value")
    try:
        # As the API server returns it too: "80Gi" as well as "85899345920".
        return f"{parse_quantity(str(raw)).nanos / NANOS / 2**30:.1f}Gi"
    except QuantityError:
        return "-"


def slices_table(slices: list[dict[str, Any]], driver: str) -> str:
    """One row per device: its slice, name, type, product, MIG profile and memory."""
    rows = [
        [
            s["metadata"]["name"],
            device["name"],
            _attribute(device, "type") or "-",
            _attribute(device, "productName") or "-",
            _attribute(device, "profile") or "-",
            _memory(device),
            "yes" if device.get("allowMultipleAllocations") else "-",
        ]
        for s in slices
        for device in s["spec"].get("devices") or []
    ]
    pool = slices[0]["spec"]["pool"]["name"] if slices else "-"
    header = ["SLICE", "DEVICE", "TYPE", "PRODUCT", "PROFILE", "MEMORY", "SHARED"]
    footer = f"{len(rows)} device(s) of driver {driver} in pool {pool}, {len(slices)} slice(s)"
    return "\n".join([*table(header, rows), footer])
