"""Semantic versions (semver 2.0) as the Kubernetes CEL library and DRA version attributes use them.

Parsing is strict (``major.minor.patch``, no leading zeros) unless ``normalize`` is requested,
which accepts a ``v`` prefix, missing minor/patch and leading zeros. Build metadata is kept but
ignored by comparison, as semver 2.0 says.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from dra_driver.cel.errors import EvalError


class Semver:
    """An immutable semantic version."""

    __slots__ = ("build", "major", "minor", "patch", "pre")
    cel_type_name: Final = "kubernetes.Semver"

    def __init__(
        self, major: int, minor: int, patch: int, pre: tuple[str, ...] = (), build: str = ""
    ) -> None:
        self.major = major
        self.minor = minor
        self.patch = patch
        self.pre = pre
        self.build = build

    def _key(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 by semver precedence (a pre-release sorts before its release)."""
        a, b = self._key(), other._key()
        if a != b:
            return -1 if a < b else 1
        if self.pre == other.pre:
            return 0
        if not self.pre or not other.pre:
            return 1 if not self.pre else -1
        for x, y in zip(self.pre, other.pre, strict=False):
            if x == y:
                continue
            xn, yn = x.isdigit(), y.isdigit()
            if xn and yn:
                return -1 if int(x) < int(y) else 1
            if xn != yn:
                return -1 if xn else 1  # numeric identifiers sort before alphanumeric ones
            return -1 if x < y else 1
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self._key(), self.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(self.pre)
        if self.build:
            text += "+" + self.build
        return text

    def __repr__(self) -> str:
        return f"semver({str(self)!r})"


def _normalize(text: str) -> str:
    # The tolerant form: drop "v", strip leading zeros, fill missing minor/patch with 0.
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or not stripped[0].isdigit():
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise EvalError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


@lru_cache(maxsize=4096)
def parse_semver(text: str, normalize: bool = False) -> Semver:
    """Parse a version as ``blang/semver`` does, with its error texts; :class:`EvalError` if
    it is not valid semver (cached: immutable)."""
    s = _normalize(text) if normalize else text
    if not s:
        raise EvalError("Version string empty")
    parts = s.split(".", 2)
    if len(parts) != 3:
        raise EvalError("No Major.Minor.Patch elements found")
    major = _number("major", parts[0])
    minor = _number("minor", parts[1])
    rest, build = parts[2], ""
    if "+" in rest:
        rest, build = rest.split("+", 1)
        for item in build.split("."):
            if not item:
                raise EvalError("Build meta data is empty")
            if not _only(item, _ALPHANUM):
                raise EvalError(f"Invalid character(s) found in build meta data {_q(item)}")
    pre: tuple[str, ...] = ()
    if "-" in rest:
        rest, pre_text = rest.split("-", 1)
        pre = tuple(pre_text.split("."))
    patch = _number("patch", rest)
    for item in pre:
        if not item:
            raise EvalError("Prerelease is empty")
        if _only(item, _DIGITS):
            if len(item) > 1 and item[0] == "0":
                raise EvalError(
                    f"Numeric PreRelease version must not contain leading zeroes {_q(item)}"
                )
            _parse_uint(item)
        elif not _only(item, _ALPHANUM):
            raise EvalError(f"Invalid character(s) found in prerelease {_q(item)}")
    return Semver(major, minor, patch, pre, build)


_DIGITS: Final = frozenset("0123456789")
_ALPHANUM: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789")


def _only(text: str, allowed: frozenset[str]) -> bool:
    return all(c in allowed for c in text)


def _q(text: str) -> str:
    from dra_driver.cel.lib_strings import go_quote  # here: lib_strings imports the checker

    return go_quote(text)


def _parse_uint(digits: str) -> int:
    # Go's strconv.ParseUint(digits, 10, 64) on a string of ASCII digits.
    if not digits:
        raise EvalError('strconv.ParseUint: parsing "": invalid syntax')
    value = int(digits)
    if value >= 2**64:
        raise EvalError(f"strconv.ParseUint: parsing {_q(digits)}: value out of range")
    return value


def _number(name: str, text: str) -> int:
    if not _only(text, _DIGITS):
        raise EvalError(f"Invalid character(s) found in {name} number {_q(text)}")
    if len(text) > 1 and text[0] == "0":
        raise EvalError(f"{name.capitalize()} number must not contain leading zeroes {_q(text)}")
    return _parse_uint(text)


def is_semver(text: str, normalize: bool = False) -> bool:
    """Whether ``text`` is a valid version."""
    try:
        parse_semver(text, normalize)
    except EvalError:
        return False
    return True
