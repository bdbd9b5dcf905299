"""The project's exception hierarchy, free of any particular driver.

Everything the project raises on purpose derives from :class:`DriverError`, so a caller can
tell an expected failure (bad input, a refused claim, an unreachable API server) from a bug.
:class:`PrepareError` is the one users read: the kubelet shows its message on the pod, so
the message says what is wrong with the claim and what to change.
"""

from __future__ import annotations


class DriverError(Exception):
    """Base of every exception the project raises on purpose (as opposed to a bug)."""


class StartError(DriverError):
    """A command cannot start with what it was given (a flag, a file, the node): the command
    line prints the message as one line and exits with status 1."""


class PrepareError(DriverError):
    """A claim cannot be prepared; the message is shown to the user and says what to fix."""
