"""Kubernetes quantity parsing: units, rounding, and the texts the API server rejects."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.quantity import NANOS, QuantityError, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("1Ki", 1024),
        ("1Mi", 1024**2),
        ("1Gi", 1024**3),
        ("1Ti", 1024**4),
        ("1Pi", 1024**5),
        ("1Ei", 1024**6),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("500m", Fraction(1, 2)),
        ("1u", Fraction(1, 10**6)),
        ("1n", Fraction(1, 10**9)),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e-3", Fraction(1, 1000)),
        ("1.5Gi", 3 * 512 * 1024**2),
        ("+1", 1),
        ("-1.5", Fraction(-3, 2)),
        (".5", Fraction(1, 2)),
        ("0.1n", Fraction(1, 10**9)),  # rounded up to a whole nano
        ("-0.1n", Fraction(-1, 10**9)),  # away from zero
        ("85520809984", 85520809984),
        ("Gi", 0),  # no number reads as 0, as in Kubernetes (isQuantity("Gi") is true)
        ("e3", 0),
        ("m", 0),
    ],
)
def test_parse(text: str, value: Fraction | int) -> None:
    assert Fraction(parse_quantity(text).nanos, NANOS) == value


@pytest.mark.parametrize("text", ["", "1GB", "1K", "1.2.3", "1 Gi", "1e", "abc", "1Gi1"])
def test_reject(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@given(st.integers(min_value=0, max_value=2**40), st.sampled_from(["", "k", "Ki", "M", "Mi", "m"]))
def test_unit_scaling(number: int, suffix: str) -> None:
    scale = {"": 1, "k": 1000, "Ki": 1024, "M": 10**6, "Mi": 1024**2, "m": Fraction(1, 1000)}
    assert Fraction(parse_quantity(f"{number}{suffix}").nanos, NANOS) == number * scale[suffix]


def test_human_form() -> None:
    assert parse_quantity("85520809984").human() == "79.6Gi"
    assert parse_quantity("40Gi").human() == "40Gi"
    assert parse_quantity("500m").human() == "500m"


def test_binary_suffix_is_capped_at_int64_max() -> None:
    assert parse_quantity("9Ei").nanos == (2**63 - 1) * NANOS
    assert parse_quantity("9E").nanos == 9 * 10**18 * NANOS  # decimal suffixes are not capped
