"""The Kubernetes releases the local control plane builds for (``testenv/versions``).

Each listed release has its own binary, ``.cache/testenv/<version>/bin/testenv``; the
default is the newest. ``DRA_K8S_VERSION`` (a minor such as ``1.35`` or a full version, as
``make ... K8S=``) selects another. ``testenv/pin.sh --resolve`` applies the same rule for
the Makefile; ``tests/unit/test_localcluster.py`` checks that both agree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from dra_driver.errors import DriverError

RELEASE_ENV = "DRA_K8S_VERSION"
_RELEASE = re.compile(r"v1\.(\d+)\.(\d+)")


class ReleaseError(DriverError, ValueError):
    """A release that ``testenv/versions`` does not list, or a malformed list."""


def parse_versions(text: str) -> tuple[str, ...]:
    """The releases of a ``testenv/versions`` text, oldest first (``#`` starts a comment)."""
    found = []
    for word in (w for line in text.splitlines() for w in line.split("#", 1)[0].split()):
        if not _RELEASE.fullmatch(word):
            raise ReleaseError(f"testenv/versions: {word!r} is not a release like v1.35.4")
        found.append(word)
    if not found:
        raise ReleaseError("testenv/versions lists no release")
    return tuple(sorted(found, key=release_key))


def release_key(version: str) -> tuple[int, int]:
    """(minor, patch) of ``v1.N.M``, for ordering."""
    m = _RELEASE.fullmatch(version)
    if m is None:
        raise ReleaseError(f"{version!r} is not a release like v1.35.4")
    return int(m.group(1)), int(m.group(2))


def resolve_release(want: str, listed: Sequence[str]) -> str:
    """The listed release ``want`` names: ``1.35``, ``v1.35`` or ``1.35.4``; "" = the newest."""
    bare = want.strip().removeprefix("v")
    if not bare:
        return listed[-1]
    for version in listed:
        number = version.removeprefix("v")
        if number == bare or number.startswith(bare + "."):
            return version
    raise ReleaseError(
        f"Kubernetes {want!r} is not listed in testenv/versions ({' '.join(listed)})"
    )


def minor_of(version: str) -> int:
    """The minor of a release, e.g. 34 for ``v1.34.4``."""
    return release_key(version)[0]


def versions_file(root: Path) -> Path:
    """``testenv/versions`` of the repository at ``root``."""
    return root / "testenv" / "versions"


def selected_release(root: Path) -> str:
    """The release ``$DRA_K8S_VERSION`` names, or the newest listed one."""
    listed = parse_versions(versions_file(root).read_text())
    return resolve_release(os.environ.get(RELEASE_ENV, ""), listed)


def release_cache(root: Path, version: str) -> Path:
    """Where one release's binaries are built: ``.cache/testenv/<version>``."""
    return root / ".cache" / "testenv" / version
