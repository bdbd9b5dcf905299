"""The DRA CEL environment: a table of selectors against one device, with expected verdicts."""

from __future__ import annotations

import pytest

from dra_driver.cel import (
    CompileError,
    Verdict,
    compile_selector,
    device_variables,
    evaluate,
    evaluate_expression,
)

DRIVER = "gpu.dra.dev"

DEVICE = {
    "name": "gpu-0",
    "attributes": {
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "560.35.3"},
        "numaNode": {"int": 1},
        "migEnabled": {"bool": False},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:10"},
        "example.com/rack": {"int": 7},
    },
    "capacity": {
        "memory": {"value": "80Gi"},
        "multiprocessors": {"value": "132"},
    },
}

A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'

M, N, E = Verdict.MATCH, Verdict.NO_MATCH, Verdict.ERROR

CASES = [
    # quantity units: binary, decimal, milli and exponents are different numbers
    (f'{C}.memory.compareTo(quantity("80Gi")) == 0', M),
    (f'{C}.memory.compareTo(quantity("80G")) > 0', M),
    (f'{C}.memory.isGreaterThan(quantity("85899345919"))', M),
    (f'{C}.memory.isLessThan(quantity("85899345921"))', M),
    (f'{C}.memory == quantity("81920Mi")', M),
    (f'{C}.memory.compareTo(quantity("40Gi")) >= 0', M),
    (f'{C}.memory.compareTo(quantity("100Gi")) >= 0', N),
    ('quantity("1500m") == quantity("1.5")', M),
    ('quantity("1k") == quantity("1e3")', M),
    ('quantity("1Ki") == quantity("1024")', M),
    ('quantity("1M").isLessThan(quantity("1Mi"))', M),
    ('quantity("0.5").isInteger()', N),
    ('quantity("2k").asInteger() == 2000', M),
    ('quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")', M),
    ('quantity("1").add(1).sub(quantity("500m")) == quantity("1500m")', M),
    ('sign(quantity("-1")) == -1 && sign(quantity("0")) == 0', M),
    ('quantity("1.5").asApproximateFloat() == 1.5', M),
    ('isQuantity("1Gi") && !isQuantity("1GB") && !isQuantity("")', M),
    ('quantity("1GB") == quantity("1")', E),
    ('quantity("0.5").asInteger() == 0', E),
    (f"{C}.multiprocessors.asInteger() >= 100", M),
    # semver
    (f'{A}.cudaComputeCapability.compareTo(semver("8.0.0")) >= 0', M),
    (f'{A}.cudaComputeCapability.isGreaterThan(semver("9.0.0"))', N),
    (f'{A}.cudaComputeCapability == semver("9.0.0")', M),
    (f"{A}.driverVersion.major() == 560 && {A}.driverVersion.minor() == 35", M),
    (f"{A}.driverVersion.patch() == 3", M),
    ('semver("1.2.3-alpha").isLessThan(semver("1.2.3"))', M),
    ('semver("1.2.3-alpha.2").isLessThan(semver("1.2.3-alpha.10"))', M),
    ('semver("1.2.3-alpha").isLessThan(semver("1.2.3-beta"))', M),
    ('semver("1.2.3+build") == semver("1.2.3")', M),
    ('semver("v1.2", true) == semver("1.2.0")', M),
    ('isSemver("1.2.3") && !isSemver("1.2") && !isSemver("01.2.3")', M),
    ('semver("1.2") == semver("1.2.0")', E),
    # missing attribute: an error, not false; has() and "in" guard it
    (f"{A}.nosuch == 1", E),
    (f"has({A}.nosuch) && {A}.nosuch == 1", N),
    (f'"nosuch" in {A} && {A}.nosuch == 1', N),
    (f"!has({A}.nosuch) || {A}.nosuch == 1", M),
    (f"has({A}.numaNode) && {A}.numaNode == 1", M),
    (f"{A}.nosuch == 1 || true", M),
    (f"false && {A}.nosuch == 1", N),
    (f"{A}.nosuch == 1 && false", N),
    # other domains
    ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:10"', M),
    ('device.attributes["example.com"].rack == 7', M),
    ('device.attributes["unknown.example.com"].x == 1', E),
    ('"unknown.example.com" in device.attributes', N),
    ('size(device.attributes["unknown.example.com"]) == 0', M),
    ('"example.com" in device.attributes', M),
    (f'device.driver == "{DRIVER}" && !device.allowMultipleAllocations', M),
    # types: int, bool, string
    (f"{A}.numaNode == 1 && !{A}.migEnabled", M),
    (f"{A}.migEnabled == false", M),
    (f'{A}.numaNode == "1"', N),
    (f"{A}.numaNode < 2 && {A}.numaNode + 1 == 2", M),
    (f"{A}.numaNode < 1.5", M),
    (f'{A}.numaNode < "2"', E),
    # strings extension
    (f'{A}.productName.lowerAscii().contains("h100")', M),
    (f'{A}.productName.upperAscii().startsWith("NVIDIA H")', M),
    (f'{A}.productName.split(" ")[1] == "H100"', M),
    (f'{A}.productName.split(" ", 2) == ["NVIDIA", "H100 80GB HBM3"]', M),
    (f'{A}.productName.replace(" ", "-") == "NVIDIA-H100-80GB-HBM3"', M),
    (f'{A}.productName.substring(7, 11) == "H100"', M),
    (f'{A}.productName.indexOf("H") == 7 && {A}.productName.lastIndexOf("H") == 17', M),
    (f'{A}.productName.charAt(0) == "N"', M),
    ('"  x ".trim() == "x"', M),
    ('["a", "b"].join("-") == "a-b" && ["a", "b"].join() == "ab"', M),
    ('"%s has %d SMs".format([dyn("H100"), dyn(132)]) == "H100 has 132 SMs"', M),
    ('strings.quote("a\\"b") == "\\"a\\\\\\"b\\""', M),
    ('"abc".substring(2, 5) == "c"', E),
    ('"abc".charAt(4) == ""', E),
    # regex
    (f'{A}.productName.matches("^NVIDIA H[0-9]+")', M),
    (f'{A}.productName.find("[0-9]+GB") == "80GB"', M),
    (f'{A}.productName.findAll("[0-9]+") == ["100", "80", "3"]', M),
    (f'{A}.productName.findAll("[0-9]+", 1) == ["100"]', M),
    ('"x".matches("(")', E),
    # lists and sets
    ("[1, 2, 3].isSorted() && ![3, 1].isSorted()", M),
    ("[1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0", M),
    ("[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3", M),
    ("[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2", M),
    ("[].max() == 0", E),
    ("sets.contains([1, 2, 3], [3, 1]) && !sets.contains([1], [2])", M),
    ("sets.equivalent([1, 2, 2], [2, 1]) && sets.intersects([1, 2], [2, 5])", M),
    ("[1, 2, 3].filter(x, x > 1).map(x, x * 10) == [20, 30]", M),
    ("[1, 2, 3].exists_one(x, x == 2) && [1, 2].all(x, x > 0)", M),
    ('{"a": 1}.exists(k, k == "a")', M),
    ("lists.range(3) == [0, 1, 2] && [[1], [2]].flatten() == [1, 2]", M),
    ("cel.bind(x, 2, x * x == 4)", M),
    # standard semantics
    ("1 / 0 == 1", E),
    ("9223372036854775807 + 1 > 0", E),
    ("-7 / 2 == -3 && -7 % 2 == -1", M),
    ("dyn(1u) == 1 && dyn(1) == 1.0 && dyn(true) != 1", M),
    ("type(1) == int && type('a') == string", M),
    ("int('42') == 42 && string(42) == '42' && double('1.5') == 1.5", M),
    ("size('héllo') == 5 && size([1]) == 1 && size({'a': 1}) == 1", M),
    # non-bool results are errors
    (f"{A}.numaNode", E),
    (f"{A}.productName", E),
]


@pytest.fixture(scope="module")
def variables() -> dict[str, object]:
    return device_variables(DEVICE, DRIVER)


@pytest.mark.parametrize(("expression", "verdict"), CASES, ids=[c[0][:60] for c in CASES])
def test_selector(expression: str, verdict: Verdict, variables: dict[str, object]) -> None:
    outcome = evaluate_expression(expression, variables)  # type: ignore[arg-type]
    assert outcome.verdict is verdict, outcome.error


def test_missing_attribute_error_names_the_key(variables: dict[str, object]) -> None:
    outcome = evaluate_expression(f"{A}.architecturee == 'Hopper'", variables)  # type: ignore[arg-type]
    assert outcome.verdict is Verdict.ERROR
    assert "no such key: architecturee" in outcome.error
    assert 'device.attributes["gpu.dra.dev"]' in outcome.error


def test_non_bool_error_names_the_type(variables: dict[str, object]) -> None:
    outcome = evaluate_expression(f"{A}.numaNode", variables)  # type: ignore[arg-type]
    assert "int" in outcome.error and "bool" in outcome.error


@pytest.mark.parametrize(
    ("expression", "line", "column", "fragment"),
    [
        ('device.attributes["x"].y ==', 1, 26, "Syntax error"),
        ("device.driver == \n  'a' &&& true", 2, 9, "Syntax error"),
        ("nosuchfn(1)", 1, 1, "undeclared reference to 'nosuchfn'"),
        ("device.nosuch == 1", 1, 7, "undefined field 'nosuch'"),
        ("other.x == 1", 1, 1, "undeclared reference to 'other"),
        ("device.driver", 1, 1, "must evaluate to bool"),
        ('device.capacity["a"].b > quantity("1")', 1, 24, "no matching overload"),
        ("1 == 1.0", 1, 3, "found no matching overload for '_==_' applied to '(int, double)'"),
        ("'a'.contains(1)", 1, 13, "applied to 'string.(int)'"),
        ("quantity(1) == quantity('1')", 1, 9, "applied to '(int)'"),
        ('"a" @ "b"', 1, 5, "token recognition error"),
    ],
)
def test_compile_error_position(expression: str, line: int, column: int, fragment: str) -> None:
    with pytest.raises(CompileError) as info:
        compile_selector(expression)
    err = info.value
    assert (err.line, err.column) == (line, column)
    assert fragment in str(err)
    text = str(err).splitlines()
    assert text[0].startswith(f"ERROR: <input>:{line}:{column}:")
    assert text[2] == " | " + "." * (column - 1) + "^"


def test_compiled_programs_are_cached() -> None:
    assert compile_selector("true") is compile_selector("true")


def test_invalid_version_attribute_is_an_error() -> None:
    bad = {"attributes": {"v": {"version": "1.2"}}}
    with pytest.raises(Exception, match="parse semantic version"):
        device_variables(bad, DRIVER)


def test_evaluate_reuses_variables(variables: dict[str, object]) -> None:
    program = compile_selector(f"{A}.numaNode == 1")
    assert all(evaluate(program, variables).verdict is M for _ in range(3))  # type: ignore[arg-type]
