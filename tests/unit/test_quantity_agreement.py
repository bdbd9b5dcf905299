"""The project's quantity readers and writers agree with Kubernetes (and so with each other).

The opaque config's memory limits (``gpu.config.memory_bytes``), the slice normaliser
(``resourceslice.normalize``), the published capacities (``gpu.publish.devices.quantity``),
the consumed capacity of shares (``gpu.sharing.shared_gpus``) and the CEL quantities
(``dra_driver.quantity``) each had their own parser, rounding or formatter, and they disagreed. Every expected answer below is what ``k8s.io/apimachinery``'s ``resource.Quantity``
(v0.37) says: ``ParseQuantity(text).Value()`` for a memory limit, the exact value for the
normaliser, ``String()`` for the text the API server stores.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_driver.gpu.config import ConfigError, memory_bytes, parse_config
from dra_driver.gpu.publish.devices import quantity as publish_quantity
from dra_driver.gpu.sharing.shared_gpus import consumed
from dra_driver.quantity import NANOS, Quantity, QuantityError, is_quantity, parse_quantity
from dra_driver.resourceslice.normalize import normalize_spec
from dra_driver.resourceslice.normalize import parse_quantity as normalize_value

FORMAT_ERROR = "quantities must match the regular expression"
SUFFIX_ERROR = "unable to parse quantity's suffix"


# text -> Quantity.Value() (rounded up, away from zero), or the error ParseQuantity returns.
MEMORY = [
    ("10Gi", 10 * 2**30),
    ("512Mi", 512 * 2**20),
    ("1G", 10**9),
    ("1024", 1024),
    # Suffixes and forms the old memory parser refused and Kubernetes accepts.
    ("1.5Gi", 1610612736),
    ("0.5Mi", 524288),
    (".5Ki", 512),
    ("1.G", 10**9),
    ("1Pi", 2**50),
    ("1P", 10**15),
    ("1e9", 10**9),
    ("1E9", 10**9),
    ("1e+9", 10**9),
    ("+1Gi", 2**30),
    ("-1Gi", -(2**30)),
    ("12345678901234567", 12345678901234567),
    ("1.5", 2),  # rounded up to a whole byte
    ("0.1", 1),
    # Refused by both.
    (" 1Gi", FORMAT_ERROR),
    ("1Gi ", FORMAT_ERROR),
    ("10Gi\n", FORMAT_ERROR),
    ("1GB", FORMAT_ERROR),
    ("1ki", SUFFIX_ERROR),
    ("1K", SUFFIX_ERROR),
]


@pytest.mark.parametrize(("text", "expected"), MEMORY)
def test_memory_limits_read_as_kubernetes_reads_them(text: str, expected: int | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            memory_bytes(text)
    else:
        assert memory_bytes(text) == expected


@pytest.mark.parametrize(("text", "expected"), MEMORY)
def test_quantity_value_is_kubernetes_value(text: str, expected: int | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(QuantityError, match=expected):
            parse_quantity(text)
    else:
        assert parse_quantity(text).value() == expected


def test_a_memory_limit_error_names_the_cause_and_stays_short() -> None:
    params = {
        "apiVersion": "gpu.dra.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "x" * 5000}},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(params, where="claim ns/c")
    message = str(info.value)
    assert "not a memory quantity" in message and FORMAT_ERROR in message
    assert len(message) < 400


# text -> the exact value, or None where the text is not a quantity.
VALUES = [
    ("80Gi", Fraction(80 * 2**30)),
    ("500m", Fraction(1, 2)),
    # Kubernetes rounds up to a whole nano-unit; the old normaliser kept the exact decimal.
    ("0.1n", Fraction(1, NANOS)),
    ("1e-12", Fraction(1, NANOS)),
    ("1.0000000001", Fraction(1000000001, NANOS)),
    # Binary suffixes are capped at the int64 maximum.
    ("9Ei", Fraction(2**63 - 1)),
    ("-9Ei", Fraction(-(2**63 - 1))),
    # A missing number reads as 0.
    ("Gi", Fraction(0)),
    ("m", Fraction(0)),
    (".", Fraction(0)),
    ("+", Fraction(0)),
    ("Ti", Fraction(0)),
    # ... but only where Kubernetes' int64 path reads the text: these need a digit.
    ("Pi", None),
    ("Ei", None),
    ("e-12", None),
    ("+.e-20", None),
    # The exponent is read as int64 and then cut to int32: 2^32 is 0.
    ("1e4294967296", Fraction(1)),
    # Not quantities: the old normaliser stripped the blanks.
    (" 1Gi", None),
    ("1Gi ", None),
    ("1e-3Ki", None),
]


@pytest.mark.parametrize(("text", "expected"), VALUES)
def test_normalised_values_are_kubernetes_values(text: str, expected: Fraction | None) -> None:
    value = normalize_value(text)
    assert (value if value is None else Fraction(value)) == expected


@pytest.mark.parametrize(("text", "expected"), VALUES)
def test_quantity_values_are_kubernetes_values(text: str, expected: Fraction | None) -> None:
    if expected is None:
        assert not is_quantity(text)
    else:
        assert Fraction(parse_quantity(text).nanos, NANOS) == expected


# What is sent -> what the API server stores for it (String() of the parsed quantity).
STORED = [
    ("1024Mi", "1Gi"),
    ("1.5Gi", "1536Mi"),
    ("0.5Mi", "512Ki"),
    ("1000", "1k"),
    ("1500000", "1500k"),
    ("1.5", "1500m"),
    ("0.1n", "1n"),
    ("1e-12", "1e-9"),
    ("1.5e9", "1500e6"),
    ("3e2", "300"),
    ("1.0000000001", "1000000001n"),
    ("9Ei", "9223372036854775807"),
    (".5Ki", "512"),
    ("+0", "0"),
    # Texts the server keeps as they are.
    ("+1", "+1"),
    ("007", "007"),
    ("1.", "1."),
    ("1e3", "1e3"),
    ("1E3", "1E3"),
    ("10Gi", "10Gi"),
    ("1025Ki", "1025Ki"),
    ("+1Ki", "+1Ki"),
    ("1e4294967296", "1e4294967296"),
]


@pytest.mark.parametrize(("sent", "stored"), STORED)
def test_the_text_is_what_the_api_server_stores(sent: str, stored: str) -> None:
    assert str(parse_quantity(sent)) == stored


@pytest.mark.parametrize(("sent", "stored"), STORED)
def test_what_is_sent_normalises_like_what_is_stored(sent: str, stored: str) -> None:
    def spec(value: str) -> dict[str, object]:
        return {"devices": [{"name": "d", "capacity": {"memory": {"value": value}}}]}

    assert normalize_spec(spec(sent)) == normalize_spec(spec(stored))


# An integer capacity -> String() of resource.NewQuantity(value, DecimalSI).
PUBLISHED = [
    (0, "0"),
    (132, "132"),
    (1000, "1k"),
    (123000, "123k"),
    (1500000, "1500k"),
    (10**9, "1G"),
    (40 * 10**9, "40G"),
    (2**30, "1073741824"),
    (85520809984, "85520809984"),
    (10**18, "1E"),
    (9 * 10**18, "9E"),
]


@pytest.mark.parametrize(("value", "text"), PUBLISHED)
def test_published_capacities_are_canonical(value: int, text: str) -> None:
    assert publish_quantity(value) == text


@pytest.mark.parametrize(("value", "text"), PUBLISHED)
def test_a_computed_quantity_prints_canonically(value: int, text: str) -> None:
    # The old formatter of computed quantities printed 1000 as "1000", not "1k".
    assert Quantity(value * NANOS).text == text
    assert str(Quantity(value * NANOS)) == text


# Sums keep the format of the left operand (of the right one when the left is zero).
SUMS = [
    ("1Gi", "1Gi", "2Gi"),
    ("0", "1Ki", "1Ki"),
    ("1k", "1Ki", "2024"),
    ("500m", "500m", "1"),
    ("1e3", "1", "1001"),
]


@pytest.mark.parametrize(("a", "b", "total"), SUMS)
def test_sums_print_as_kubernetes_prints_them(a: str, b: str, total: str) -> None:
    assert str(parse_quantity(a).plus(parse_quantity(b))) == total


def test_differences_print_as_kubernetes_prints_them() -> None:
    assert str(parse_quantity("2Ki").minus(parse_quantity("1Ki"))) == "1Ki"
    assert str(parse_quantity("0").minus(parse_quantity("1Ki"))) == "-1Ki"


@pytest.mark.parametrize(
    ("text", "value"),
    [("1.5", 2), ("500m", 1), ("80Gi", 80 * 2**30), ("9007199254740993", 9007199254740993)],
)
def test_a_share_consumes_what_kubernetes_value_says(text: str, value: int) -> None:
    # The old share reader rounded through a float: 2^53 + 1 bytes came out as 2^53.
    assert consumed({"gpu.dra.dev/memory": text}) == {"memory": value}
