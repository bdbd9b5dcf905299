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
    """An exact, immutable quantity; ``text`` is how it was written (for display).

    ``scale`` mirrors how Kubernetes holds the value: a power of ten when it fits its fast
    int64 form (value x 10^scale), None when it needs its arbitrary-precision form. Only
    ``isInteger``/``asInteger`` see the difference: Kubernetes converts only the fast form.
    """

    __slots__ = ("nanos", "scale", "text")
    cel_type_name: Final = "kubernetes.Quantity"

    def __init__(self, nanos: int, text: str = "", scale: int | None = 0) -> None:
        self.nanos = nanos
        self.scale = scale
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
        """Kubernetes' ``AsInt64``: the fast form with a scale >= 0 whose value fits int64."""
        return (
            self.scale is not None
            and self.scale >= 0
            and self.nanos % NANOS == 0
            and -(2**63) <= self.nanos // NANOS <= _INT64_MAX
        )

    def minus(self, other: Quantity) -> Quantity:
        """``self - other`` as Kubernetes computes it: in the int64 form by adding the negated
        value (negating the smallest int64 wraps around to itself), exactly when that fails."""
        if self.scale is not None and other.scale is not None:
            negated = Quantity(-other.nanos, scale=other.scale)
            if Fraction(other.nanos) / (Fraction(10) ** other.scale * NANOS) == -(2**63):
                negated = other
            fast = self._fast_sum(negated)
            if fast is not None:
                return fast
        return Quantity(self.nanos - other.nanos, scale=None)

    def plus(self, other: Quantity) -> Quantity:
        """``self + other``, keeping the fast form when Kubernetes' int64 addition does."""
        fast = self._fast_sum(other)
        return fast if fast is not None else Quantity(self.nanos + other.nanos, scale=None)

    def _fast_sum(self, other: Quantity) -> Quantity | None:
        # Kubernetes' int64Amount.Add: None where it overflows (the caller then computes exactly).
        if self.scale is None or other.scale is None:
            return None
        nanos = self.nanos + other.nanos
        if other.nanos == 0:
            return Quantity(nanos, scale=self.scale)
        if self.nanos == 0:
            return Quantity(nanos, scale=other.scale)
        scale = min(self.scale, other.scale)
        unit = Fraction(10) ** scale * NANOS
        terms = [Fraction(q.nanos) / unit for q in (self, other)]
        if all(_fits(t) for t in terms) and _fits(terms[0] + terms[1]):
            return Quantity(nanos, scale=scale)
        return None

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
    if text.isascii() and text.isdigit():
        # The common case: a plain byte count.
        digits = text.lstrip("0") or "0"
        return Quantity(int(text) * NANOS, text, 0 if len(digits) <= _FAST_DIGITS else None)
    match = _SYNTAX.fullmatch(text)
    if not text or match is None:
        raise QuantityError(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""
    # A missing number reads as 0, as Kubernetes parses it: "m", "Ki", "+", "." are quantities.
    value = Fraction(int(whole + fraction or "0"), 10 ** len(fraction))
    binary = False
    if suffix in _DECIMAL:
        power = _DECIMAL[suffix]
        value *= Fraction(10) ** power
    elif suffix in _BINARY:
        power = _BINARY[suffix]
        value *= 2**power
        binary = True
    elif exp := _EXPONENT.fullmatch(suffix):
        power = int(exp.group(1))
        if not -(2**31) <= power < 2**31:
            raise QuantityError(f"unable to parse quantity's suffix: {text!r}")
        value *= Fraction(10) ** power
    else:
        raise QuantityError(f"unable to parse quantity's suffix: {text!r}")
    scale = _fast_scale(whole.lstrip("0") or "0", fraction, power, binary)
    # Round up (away from zero) to whole nano-units, as the API server does.
    scaled = value * NANOS
    nanos = -(-scaled.numerator // scaled.denominator)
    if binary and nanos > _INT64_MAX * NANOS:
        nanos = _INT64_MAX * NANOS  # binary-suffixed values are capped at the int64 maximum
    return Quantity(-nanos if sign == "-" else nanos, text, 0 if text == "0" else scale)


_FAST_DIGITS: Final = 18  # digits Kubernetes parses into its int64 form


def _fits(value: Fraction) -> bool:
    return value.denominator == 1 and -(2**63) <= value.numerator <= _INT64_MAX


def _fast_scale(num: str, denom: str, power: int, binary: bool) -> int | None:
    # resource.ParseQuantity's fast path: which parsed quantities it holds as value x 10^scale.
    mantissa = 1
    if binary:
        if denom:
            return None
        scale = 0
        mantissa = 1 << power
        precision = 15 - len(num) - int(power * 3 / 10) - 1
    else:
        scale = power
        precision = _FAST_DIGITS - (len(num) + len(denom))
    if precision < 0:
        return None
    scale -= len(denom)
    if scale < -9 or int(num + denom) > _INT64_MAX or int(num + denom) * mantissa > _INT64_MAX:
        return None
    return scale


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
