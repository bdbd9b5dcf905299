"""Semantic versions (semver 2.0) as the Kubernetes CEL library and DRA version attributes use them.

Parsing is strict (``major.minor.patch``, no leading zeros) unless ``normalize`` is requested,
which accepts a ``v`` prefix, missing minor/patch and leading zeros. Build metadata is kept but
ignored by comparison, as semver 2.0 says.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

from dra_driver.cel.errors import EvalError

_NUM: Final = r"(?:0|[1-9][0-9]*)"
_IDENT: Final = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_STRICT: Final = re.compile(
    rf"({_NUM})\.({_NUM})\.({_NUM})"
    rf"(?:-({_IDENT}(?:\.{_IDENT})*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


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
    """Parse a version; :class:`EvalError` if it is not valid semver (cached: immutable)."""
    source = _normalize(text) if normalize else text
    match = _STRICT.fullmatch(source)
    if match is None:
        raise EvalError(f"invalid semver: {text!r}")
    major, minor, patch, pre, build = match.groups()
    values = (int(major), int(minor), int(patch))
    if any(v >= 2**64 for v in values):
        raise EvalError(f"invalid semver: {text!r}")
    return Semver(*values, tuple(pre.split(".")) if pre else (), build or "")


def is_semver(text: str, normalize: bool = False) -> bool:
    """Whether ``text`` is a valid version."""
    try:
        parse_semver(text, normalize)
    except EvalError:
        return False
    return True
