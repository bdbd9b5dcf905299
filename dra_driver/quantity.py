"""Kubernetes resource quantities (``1Gi``, ``500m``, ``1e3``) with the API server's exact rules.

A quantity is held as an integer count of nano-units: Kubernetes rounds every quantity up (away
from zero) to a multiple of 1n, so nanos represent every parsed value exactly, and comparison,
addition and subtraction are plain integer arithmetic.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache
from typing import Final

from dra_driver.errors import DriverError


class QuantityError(DriverError, ValueError):
    """Text that is not a quantity, or a quantity that is not what was asked (an integer)."""


NANOS: Final = 10**9
_INT64_MAX: Final = 2**63 - 1

_DECIMAL: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
# Sign, digits, optional fraction, then a suffix: SI letters or an exponent e<int>/E<int>.
_SYNTAX: Final = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*(?:[+-]?[0-9]+)?)")
_EXPONENT: Final = re.compile(r"[eE]([+-]?[0-9]+)")


class Quantity:
    """An exact, immutable quantity; ``text`` is how it was written (for display)."""

    __slots__ = ("nanos", "text")
    cel_type_name: Final = "Quantity"

    def __init__(self, nanos: int, text: str = "") -> None:
        self.nanos = nanos
        self.text = text or _format(nanos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and other.nanos == self.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"

    def __str__(self) -> str:
        return self.text

    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1."""
        return (self.nanos > other.nanos) - (self.nanos < other.nanos)

    def is_integer(self) -> bool:
        """Whether the value is a whole number that fits int64 (Kubernetes' ``AsInt64``)."""
        return self.nanos % NANOS == 0 and -(2**63) <= self.nanos // NANOS <= _INT64_MAX

    def as_integer(self) -> int:
        """The value as int64, or an error when it has a fraction or does not fit."""
        if not self.is_integer():
            raise QuantityError("cannot convert value to integer")
        return self.nanos // NANOS

    def as_float(self) -> float:
        """The nearest float."""
        return self.nanos / NANOS

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self.nanos > 0) - (self.nanos < 0)

    def human(self) -> str:
        """The value in binary units when it is a large whole number (``79.6Gi``), else ``text``."""
        if self.nanos % NANOS or abs(self.nanos) < 1024 * NANOS:
            return self.text
        value = self.nanos // NANOS
        for suffix, power in reversed(list(_BINARY.items())):
            unit = 1 << power
            if abs(value) >= unit:
                whole, rest = divmod(value, unit)
                return f"{whole}{suffix}" if rest == 0 else f"{value / unit:.1f}{suffix}"
        return self.text  # pragma: no cover - the loop always returns for |value| >= 1Ki


def _format(nanos: int) -> str:
    # Computed quantities (add/sub) have no source text; print them plainly and exactly.
    sign = "-" if nanos < 0 else ""
    whole, frac = divmod(abs(nanos), NANOS)
    if frac == 0:
        return f"{sign}{whole}"
    for suffix, scale in (("m", 10**6), ("u", 10**3), ("n", 1)):
        if abs(nanos) % scale == 0:
            return f"{sign}{abs(nanos) // scale}{suffix}"
    return f"{sign}{abs(nanos)}n"  # pragma: no cover - scale 1 always divides


@lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Quantity:
    """Parse ``text`` like ``resource.ParseQuantity``; :class:`QuantityError` if it is not one.

    Cached: devices of one product publish the same capacity strings, and quantities are
    immutable.
    """
    if text.isdigit():
        return Quantity(int(text) * NANOS, text)  # the common case: a plain byte count
    match = _SYNTAX.fullmatch(text)
    if not text or match is None:
        raise QuantityError(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""
    if not whole and not fraction:
        raise QuantityError(f"unable to parse quantity's numeric part: {text!r}")
    value = Fraction(int(whole + fraction or "0"), 10 ** len(fraction))
    binary = False
    if suffix in _DECIMAL:
        value *= Fraction(10) ** _DECIMAL[suffix]
    elif suffix in _BINARY:
        value *= 2 ** _BINARY[suffix]
        binary = True
    elif exp := _EXPONENT.fullmatch(suffix):
        power = int(exp.group(1))
        if not -(2**31) <= power < 2**31:
            raise QuantityError(f"unable to parse quantity's suffix: {text!r}")
        value *= Fraction(10) ** power
    else:
        raise QuantityError(f"unable to parse quantity's suffix: {text!r}")
    # Round up (away from zero) to whole nano-units, as the API server does.
    scaled = value * NANOS
    nanos = -(-scaled.numerator // scaled.denominator)
    if binary and nanos > _INT64_MAX * NANOS:
        nanos = _INT64_MAX * NANOS  # binary-suffixed values are capped at the int64 maximum
    return Quantity(-nanos if sign == "-" else nanos, text)


def is_quantity(text: str) -> bool:
    """Whether ``text`` parses as a quantity."""
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def int_quantity(value: int) -> Quantity:
    """A whole-number quantity (for ``q.add(1)``)."""
    return Quantity(value * NANOS)
