"""Explanations of non-matches: the false part of the selector and the values it read."""

from __future__ import annotations

import pytest

from dra_driver.cel import compile_selector, device_variables, explain

DRIVER = "gpu.dra.dev"
DEVICE = {
    "attributes": {
        "architecture": {"string": "Ampere"},
        "numaNode": {"int": 1},
        "migEnabled": {"bool": True},
        "cudaComputeCapability": {"version": "8.0.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:20"},
    },
    "capacity": {"memory": {"value": "40Gi"}},
}
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'


@pytest.mark.parametrize(
    ("expression", "failed", "values"),
    [
        (
            f'{C}.memory.compareTo(quantity("80Gi")) >= 0 && {A}.architecture == "Hopper"',
            f'{C}.memory.compareTo(quantity("80Gi")) >= 0',
            ["memory = 40Gi"],
        ),
        (
            f'{C}.memory.compareTo(quantity("40Gi")) >= 0 && {A}.architecture == "Hopper"',
            f'{A}.architecture == "Hopper"',
            ['architecture = "Ampere"'],
        ),
        (
            f"!{A}.migEnabled && {A}.numaNode == 0",
            f"!{A}.migEnabled",
            ["migEnabled = true"],
        ),
        (
            f"{A}.numaNode == 0 || {A}.numaNode == 2",
            f"{A}.numaNode == 0 || {A}.numaNode == 2",
            ["numaNode = 1"],
        ),
        (
            f'device.driver == "{DRIVER}" && ({A}.numaNode == 1 && {A}.cudaComputeCapability'
            '.isGreaterThan(semver("8.6.0")))',
            f'{A}.cudaComputeCapability.isGreaterThan(semver("8.6.0"))',
            ["cudaComputeCapability = 8.0.0"],
        ),
        (
            'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:10"',
            'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:10"',
            ['resource.kubernetes.io/pcieRoot = "pci0000:20"'],
        ),
        (
            f"has({A}.brand) && {A}.brand == 'Tesla'",
            f"has({A}.brand)",
            ["brand = <not set>"],
        ),
    ],
)
def test_explain(expression: str, failed: str, values: list[str]) -> None:
    program = compile_selector(expression)
    variables = device_variables(DEVICE, DRIVER)
    assert program.evaluate(variables) is False
    why = explain(program, variables, DRIVER)
    assert why.failed == failed
    assert [str(r) for r in why.reads] == values
    assert str(why).startswith(failed + " is false")


def test_explanation_json() -> None:
    program = compile_selector(f"{A}.numaNode == 0")
    variables = device_variables(DEVICE, DRIVER)
    data = explain(program, variables, DRIVER).to_json()
    assert data == {
        "failed": f"{A}.numaNode == 0",
        "values": [{"name": "numaNode", "expression": f"{A}.numaNode", "value": "1"}],
    }
