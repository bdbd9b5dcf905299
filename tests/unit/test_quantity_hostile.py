"""Quantity texts from users (an opaque config, a CEL literal) cannot hang or crash a reader.

Kubernetes reads a quantity of any length; Python refuses to turn more than 4300 digits into an
int, and a huge exponent would make a number of billions of digits. What Kubernetes computes
cheaply is read here exactly; what no resource needs (a value of more than 4000 digits) is
refused with a QuantityError, never another exception.
"""

from __future__ import annotations

import math
import time

import pytest

from dra_driver.gpu.config import ConfigError, parse_config
from dra_driver.quantity import NANOS, QuantityError, is_quantity, parse_quantity


@pytest.mark.parametrize(
    "text", ["9" * 5000, "1e2147483647", "1e4000", "-1e2147483647", "0.1e4002"]
)
def test_too_large_is_a_quantity_error(text: str) -> None:
    start = time.monotonic()
    with pytest.raises(QuantityError, match="more than 4000 digits"):
        parse_quantity(text)
    assert not is_quantity(text)
    assert time.monotonic() - start < 1


def test_long_texts_read_exactly() -> None:
    assert parse_quantity("9" * 4000).value() == 10**4000 - 1
    assert parse_quantity("0." + "0" * 5000 + "1").nanos == 1  # rounded up to 1n
    assert parse_quantity("1." + "0" * 5000).value() == 1
    assert parse_quantity("0" * 5000 + "7").value() == 7
    assert parse_quantity("9" * 5000 + "Ki").nanos == (2**63 - 1) * NANOS  # capped


def test_huge_negative_exponents_round_to_one_nano() -> None:
    assert parse_quantity("1e-2147483648").nanos == 1
    assert parse_quantity("-5e-2000000000").nanos == -1
    assert parse_quantity("0e2147483647").nanos == 0


def test_a_zero_with_a_huge_scale_adds_and_subtracts() -> None:
    zero = parse_quantity("0e2147483647")
    one = parse_quantity("1")
    start = time.monotonic()
    assert one.minus(zero) == one
    assert one.plus(zero) == one
    assert zero.minus(one).sign() == -1
    assert time.monotonic() - start < 1


def test_an_exponent_beyond_int64_is_a_suffix_error() -> None:
    with pytest.raises(QuantityError, match="unable to parse quantity's suffix"):
        parse_quantity("1e9223372036854775808")
    with pytest.raises(QuantityError, match="unable to parse quantity's suffix"):
        parse_quantity("1e" + "9" * 5000)
    assert parse_quantity("1e" + "0" * 5000 + "3").value() == 1000


def test_large_values_print_and_convert() -> None:
    big = parse_quantity("9" * 4000)
    assert str(big) == "9" * 4000
    assert big.human() == "9" * 4000
    assert big.as_float() == math.inf
    assert parse_quantity("-" + "9" * 4000).as_float() == -math.inf
    assert str(big.plus(big)).startswith("1999")


def test_a_hostile_memory_limit_is_refused_quickly() -> None:
    for limit in ("1e2147483647", "9" * 9000, "0e2147483647"):
        params = {
            "apiVersion": "gpu.dra.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": limit}},
        }
        start = time.monotonic()
        with pytest.raises(ConfigError):
            parse_config(params, where="c")
        assert time.monotonic() - start < 1
