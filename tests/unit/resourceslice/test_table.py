from __future__ import annotations

from typing import Any

import pytest

from dra_driver.resourceslice.table import slices_table


def _slice(memory: Any) -> dict[str, Any]:
    device: dict[str, Any] = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
    if memory is not None:
        device["capacity"] = {"memory": {"value": memory}}
    return {
        "metadata": {"name": "node-a-gpu"},
        "spec": {"pool": {"name": "node-a"}, "devices": [device]},
    }


@pytest.mark.parametrize(
    ("memory", "shown"),
    [
        ("85899345920", "80.0Gi"),
        # The API server stores a quantity in its canonical form: bytes read back are "80Gi".
        ("80Gi", "80.0Gi"),
        ("81920Mi", "80.0Gi"),
        ("40G", "37.3Gi"),
        (None, "-"),
        ("lots", "-"),
    ],
)
def test_memory_column_reads_every_quantity_form(memory: Any, shown: str) -> None:
    row = slices_table([_slice(memory)], "gpu.dra.dev").splitlines()[1].split()
    assert row[1] == "gpu-0" and row[-2] == shown, row
