"""Kubernetes resource quantities (``1Gi``, ``500m``, ``1e3``) with the API server's exact rules.

The project's one reader and writer of quantities: CEL's ``quantity()``, the capacities it
publishes and compares with what the API server stored, consumed capacity of shares and the
memory limits of the opaque config all go through here.

A quantity is held as an integer count of nano-units: Kubernetes rounds every quantity up (away
from zero) to a multiple of 1n, so nanos represent every parsed value exactly, and comparison,
addition and subtraction are plain integer arithmetic. Its format (DecimalSI, BinarySI or
DecimalExponent, from the suffix it was written with) decides how it prints: ``str()`` is
Kubernetes' ``String()``, the text the API server stores.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Final

from dra_driver.errors import DriverError

DECIMAL_SI: Final = "DecimalSI"
BINARY_SI: Final = "BinarySI"
DECIMAL_EXPONENT: Final = "DecimalExponent"

#: Kubernetes' own error texts (ErrFormatWrong, ErrSuffix, ErrNumeric).
FORMAT_ERROR: Final = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
SUFFIX_ERROR: Final = "unable to parse quantity's suffix"
NUMERIC_ERROR: Final = "unable to parse numeric part of quantity"
#: Values with more digits than this before the point are refused. Kubernetes has no limit, but
#: it computes them in full too (``1e2147483647`` would take it gigabytes); no resource comes
#: near, and a user's text (an opaque config, a CEL literal) must not stall the agent.
MAX_DIGITS: Final = 4000


class QuantityError(DriverError, ValueError):
    """Text that is not a quantity, or a quantity that is not what was asked (an integer).

    ``reason`` is the error alone, as Kubernetes words it; the message adds the text.
    """

    def __init__(self, reason: str, text: str | None = None) -> None:
        super().__init__(reason if text is None else f"{reason}: {text!r}")
        self.reason = reason


NANOS: Final = 10**9
_INT64_MAX: Final = 2**63 - 1

_DECIMAL: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX: Final = {power: suffix for suffix, power in _DECIMAL.items()}
_BINARY_SUFFIX: Final = {0: "", **{power // 10: suffix for suffix, power in _BINARY.items()}}
# Sign, digits, optional fraction, then a suffix: SI letters or an exponent e<int>/E<int>.
_SYNTAX: Final = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*(?:[+-]?[0-9]+)?)")
_EXPONENT: Final = re.compile(r"[eE]([+-]?)([0-9]+)")


class Quantity:
    """An exact, immutable quantity; ``text`` is how it was written (for display).

    ``scale`` mirrors how Kubernetes holds the value: a power of ten when it fits its fast
    int64 form (value x 10^scale), None when it needs its arbitrary-precision form. Only
    ``isInteger``/``asInteger`` see the difference: Kubernetes converts only the fast form.
    ``format`` is Kubernetes' format, which only printing (``str()``) sees.
    """

    __slots__ = ("_string", "dec_scale", "format", "nanos", "scale", "text")
    cel_type_name: Final = "kubernetes.Quantity"

    def __init__(
        self,
        nanos: int,
        text: str = "",
        scale: int | None = 0,
        fmt: str = DECIMAL_SI,
        *,
        verbatim: bool = False,
        dec_scale: int = 9,
    ) -> None:
        """``verbatim``: Kubernetes prints ``text`` as it is (see :func:`_verbatim`);
        ``dec_scale``: in the arbitrary-precision form (``scale`` None), the scale of
        Kubernetes' ``inf.Dec`` (parsing rounds to 9, a sum takes the larger)."""
        self.nanos = nanos
        self.scale = scale
        self.dec_scale = -scale if scale is not None else dec_scale
        self.format = fmt
        self.text = text or _canonical(nanos, fmt)
        self._string = self.text if verbatim or not text else ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and other.nanos == self.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"

    def __str__(self) -> str:
        """Kubernetes' ``String()``: the text the API server stores (and CEL converts to)."""
        return self._string or _canonical(self.nanos, self.format)

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
        fmt = other.format if self.nanos == 0 else self.format
        if self.scale is not None and other.scale is not None:
            negated = Quantity(-other.nanos, scale=other.scale)
            if other.nanos and Fraction(other.nanos) / (Fraction(10) ** other.scale * NANOS) == -(
                2**63
            ):
                negated = other
            fast = self._fast_sum(negated, fmt)
            if fast is not None:
                return fast
        return Quantity(
            self.nanos - other.nanos,
            scale=None,
            fmt=fmt,
            dec_scale=max(self.dec_scale, other.dec_scale),
        )

    def plus(self, other: Quantity) -> Quantity:
        """``self + other``, keeping the fast form when Kubernetes' int64 addition does."""
        fmt = other.format if self.nanos == 0 else self.format
        fast = self._fast_sum(other, fmt)
        if fast is not None:
            return fast
        return Quantity(
            self.nanos + other.nanos,
            scale=None,
            fmt=fmt,
            dec_scale=max(self.dec_scale, other.dec_scale),
        )

    def _fast_sum(self, other: Quantity, fmt: str) -> Quantity | None:
        # Kubernetes' int64Amount.Add: None where it overflows (the caller then computes exactly).
        if self.scale is None or other.scale is None:
            return None
        nanos = self.nanos + other.nanos
        if other.nanos == 0:
            return Quantity(nanos, scale=self.scale, fmt=fmt)
        if self.nanos == 0:
            return Quantity(nanos, scale=other.scale, fmt=fmt)
        scale = min(self.scale, other.scale)
        unit = Fraction(10) ** scale * NANOS
        terms = [Fraction(q.nanos) / unit for q in (self, other)]
        if all(_fits(t) for t in terms) and _fits(terms[0] + terms[1]):
            return Quantity(nanos, scale=scale, fmt=fmt)
        return None

    def as_integer(self) -> int:
        """The value as int64, or an error when it has a fraction or does not fit."""
        if not self.is_integer():
            raise QuantityError("cannot convert value to integer")
        return self.nanos // NANOS

    def value(self) -> int:
        """Kubernetes' ``Value()``: the whole number, rounded up away from zero (``1.5`` is 2,
        ``-0.1`` is -1); exact where Kubernetes' int64 would overflow."""
        whole, rest = divmod(abs(self.nanos), NANOS)
        if rest:
            whole += 1
        return whole if self.nanos >= 0 else -whole

    def as_float(self) -> float:
        """Kubernetes' ``AsApproximateFloat64``: the unscaled integer as a float, times
        ``math.Pow10`` of the scale (``0.3`` is 3 x 10^-1 = 0.30000000000000004)."""
        exponent = -self.dec_scale
        shift = 9 + exponent  # nanos = unscaled x 10^shift
        unscaled = self.nanos // 10**shift if shift >= 0 else self.nanos * 10**-shift
        try:
            base = float(unscaled)
        except OverflowError:
            base = math.inf if unscaled > 0 else -math.inf
        return base if exponent == 0 else base * _pow10(exponent)

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self.nanos > 0) - (self.nanos < 0)

    def human(self) -> str:
        """The value in binary units when it is a large whole number (``79.6Gi``), else ``text``."""
        if self.nanos % NANOS or not 1024 * NANOS <= abs(self.nanos) < 2**1000:
            return self.text
        value = self.nanos // NANOS
        for suffix, power in reversed(list(_BINARY.items())):
            unit = 1 << power
            if abs(value) >= unit:
                whole, rest = divmod(value, unit)
                return f"{whole}{suffix}" if rest == 0 else f"{value / unit:.1f}{suffix}"
        return self.text  # pragma: no cover - the loop always returns for |value| >= 1Ki


_POW10 = [float(10**i) for i in range(32)]
_POW10_POS32 = [1e00, 1e32, 1e64, 1e96, 1e128, 1e160, 1e192, 1e224, 1e256, 1e288]
_POW10_NEG32 = [1e-00, 1e-32, 1e-64, 1e-96, 1e-128, 1e-160, 1e-192, 1e-224, 1e-256, 1e-288, 1e-320]


def _pow10(n: int) -> float:
    """Go's ``math.Pow10``, table for table (not always the float nearest 10^n)."""
    if 0 <= n <= 308:
        return _POW10_POS32[n // 32] * _POW10[n % 32]
    if -323 <= n <= 0:
        return _POW10_NEG32[-n // 32] / _POW10[-n % 32]
    return math.inf if n > 0 else 0.0


def _canonical(nanos: int, fmt: str) -> str:
    """Kubernetes' ``CanonicalizeBytes``: the shortest exact text in ``fmt``.

    BinarySI prints whole numbers from 1Ki up in powers of 1024 (``1536Mi``), anything else as
    DecimalSI; the decimal forms take the largest power of 1000 that keeps the number whole
    (``1500k``, ``1500e6``). Where Kubernetes has no suffix (beyond ``E`` and ``Ei``) it drops
    the suffix and so prints another value; here the number grows instead (``1000E``).
    """
    if nanos == 0:
        return "0"
    sign = "-" if nanos < 0 else ""
    magnitude = abs(nanos)
    if fmt == BINARY_SI and magnitude >= 1024 * NANOS and magnitude % NANOS == 0:
        amount, power = magnitude // NANOS, 0
        while amount % 1024 == 0 and power < 6:
            amount, power = amount // 1024, power + 1
        return f"{sign}{amount}{_BINARY_SUFFIX[power]}"
    digits = str(magnitude)
    mantissa = digits.rstrip("0")
    exponent = len(digits) - len(mantissa) - 9
    pad = exponent % 3  # down to a multiple of 3
    mantissa, exponent = mantissa + "0" * pad, exponent - pad
    if fmt == DECIMAL_EXPONENT:
        return f"{sign}{mantissa}{f'e{exponent}' if exponent else ''}"
    if exponent > 18:
        mantissa, exponent = mantissa + "0" * (exponent - 18), 18
    return f"{sign}{mantissa}{_DECIMAL_SUFFIX[exponent]}"


def format_quantity(value: int, fmt: str = DECIMAL_SI) -> str:
    """What Kubernetes prints for ``resource.NewQuantity(value, fmt)``, so what the API server
    stores for that whole number: ``1000`` is ``1k``, ``1073741824`` stays as it is."""
    return _canonical(value * NANOS, fmt)


@lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Quantity:
    """Parse ``text`` like ``resource.ParseQuantity``; :class:`QuantityError` if it is not one.

    Cached: devices of one product publish the same capacity strings, and quantities are
    immutable.
    """
    if text.isascii() and text.isdigit() and len(text) <= _FAST_DIGITS:
        # The common case: a plain count, held in Kubernetes' int64 form.
        digits = text.lstrip("0") or "0"
        verbatim = text == "0" or (digits != "0" and not digits.endswith("000"))
        return Quantity(int(text) * NANOS, text, 0, verbatim=verbatim)
    match = _SYNTAX.fullmatch(text)
    if not text or match is None:
        raise QuantityError(FORMAT_ERROR, text)
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""
    # A missing number reads as 0, as Kubernetes parses it: "m", "Ki", "+", "." are quantities.
    num = whole.lstrip("0") or "0"
    fmt, binary, power = _interpret(suffix, text)
    significant = fraction.rstrip("0")
    nanos = _nanos((num + significant).lstrip("0") or "0", -len(significant), power, binary, text)
    if binary and 0 < nanos < NANOS:
        fmt = DECIMAL_SI  # as Kubernetes does for binary values below 1
    scale = 0 if text == "0" else _fast_scale(num, fraction, power, binary)
    if scale is None and not whole + fraction:
        # Kubernetes reads no number as 0 only on its fast path ("Ki", "m"); its other path
        # needs a digit ("Pi", "e-12" are not quantities).
        raise QuantityError(NUMERIC_ERROR, text)
    verbatim = text == "0" or _verbatim(num + fraction, scale, binary)
    # Kubernetes' arbitrary-precision form is rounded to scale 9, or set to the int64 cap
    # (scale 0) when a binary value exceeds it.
    capped = binary and nanos == _INT64_MAX * NANOS
    return Quantity(
        -nanos if sign == "-" else nanos,
        text,
        scale,
        fmt,
        verbatim=verbatim,
        dec_scale=0 if capped else 9,
    )


def _interpret(suffix: str, text: str) -> tuple[str, bool, int]:
    """The format, whether the base is 2, and the power a suffix stands for."""
    if suffix in _DECIMAL:
        return DECIMAL_SI, False, _DECIMAL[suffix]
    if suffix in _BINARY:
        return BINARY_SI, True, _BINARY[suffix]
    exp = _EXPONENT.fullmatch(suffix)
    if exp is not None:
        digits = exp.group(2).lstrip("0") or "0"
        # Read as int64 (else an error), then cut to int32 as Kubernetes does: e4294967296 is e0.
        power = int(exp.group(1) + digits) if len(digits) <= 19 else 2**63
        if -(2**63) <= power <= _INT64_MAX:
            return DECIMAL_EXPONENT, False, (power + 2**31) % 2**32 - 2**31
    raise QuantityError(SUFFIX_ERROR, text)


def _nanos(digits: str, exponent: int, power: int, binary: bool, text: str) -> int:
    """The magnitude ``digits`` x 10^exponent x (2 or 10)^power in nano-units, rounded up as
    Kubernetes rounds (away from zero), without computing numbers larger than the result."""
    if digits == "0":
        return 0
    if binary:
        shift = exponent + 9
        if len(digits) + shift > 29:
            return _INT64_MAX * NANOS  # beyond 10^28 nanos: capped at the int64 maximum
        scaled = _int(digits) << power
        factor: int = 10 ** abs(shift)
        nanos = scaled * factor if shift >= 0 else -(-scaled // factor)
        return min(nanos, _INT64_MAX * NANOS)  # binary-suffixed values are capped
    shift = exponent + power + 9  # nanos = digits x 10^shift
    if len(digits) + shift > MAX_DIGITS + 9:
        raise QuantityError(f"quantities of more than {MAX_DIGITS} digits are not supported", text)
    if shift >= 0:
        scale: int = 10**shift
        return int(digits) * scale
    # Digits below 1n make the value round up; a number far below 1n is 1n.
    keep = max(len(digits) + shift, 0)
    return int(digits[:keep] or "0") + (1 if digits[keep:].strip("0") else 0)


def _int(digits: str) -> int:
    # int() refuses more than 4300 digits (a guard against slow conversion); Decimal is fast.
    return int(digits) if len(digits) <= MAX_DIGITS else int(Decimal(digits))


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


def _verbatim(shifted: str, scale: int | None, binary: bool) -> bool:
    # ParseQuantity keeps the text for String() when its fast path read it and the digits
    # (``shifted``: without leading zeros, with the fraction) look canonical already.
    if scale is None:
        return False
    if binary:
        return int(shifted) & 7 != 0
    return scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"


def is_quantity(text: str) -> bool:
    """Whether ``text`` parses as a quantity."""
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def int_quantity(value: int) -> Quantity:
    """A whole-number quantity as CEL makes one for ``q.add(1)``: in DecimalExponent format."""
    return Quantity(value * NANOS, fmt=DECIMAL_EXPONENT)
