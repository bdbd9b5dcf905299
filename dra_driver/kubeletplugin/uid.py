"""The one check of a claim UID, wherever one comes in from outside.

A driver names files after claim UIDs (a CDI spec per claim, directories per claim), so a
UID must be one harmless file name before anything uses it: from the kubelet's gRPC calls,
from the API server, from file names found on disk, from keys of a stored checkpoint.

``metadata.uid`` is set by the API server, always a lower-case UUID (8-4-4-4-12 hex digits).
The check is a little wider on purpose, and only in ways that stay harmless: at most 36
lower-case letters, digits and dashes, the first a letter or digit. That rules out every
path step (``/``, ``.``, ``..``), hidden and option-like names (a leading ``.`` or ``-``),
whitespace and control characters, and names too long for a file system; the unit tests'
short stand-in UIDs (``a``, ``uid-a``) pass, so they exercise the same code as real ones.
"""

from __future__ import annotations

import re
from typing import TypeGuard

_UID = re.compile(r"[0-9a-z][0-9a-z-]{0,35}")

#: What :func:`valid_uid` accepts, for error messages.
UID_SHAPE = "up to 36 characters of a-z, 0-9 and -, starting with a letter or digit"


def valid_uid(uid: object) -> TypeGuard[str]:
    """Whether ``uid`` can be a claim UID (and so be part of a file name)."""
    # fullmatch, not match with $: "$" also matches before a trailing newline.
    return isinstance(uid, str) and _UID.fullmatch(uid) is not None
