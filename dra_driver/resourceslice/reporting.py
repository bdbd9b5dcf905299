"""Logging the publisher's API failures: clearly, and loudly only the first time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.resourceslice.dropped import describe_dropped
from dra_driver.resourceslice.rawapi import ApiError


def describe(err: BaseException) -> str:
    """A short one-line description of a connection error for logs."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def log_dropped(log: Any, dropped: Mapping[str, str], *, handled: bool = False) -> None:
    """Report newly dropped fields (path -> first slice), one line per feature gate: a
    warning, or at debug level when the driver ``handled`` them with a line of its own."""
    level = log.debug if handled else log.warning
    for gate, paths in describe_dropped(dropped).items():
        level(
            "the API server dropped fields from the slices; the feature gate is probably "
            "disabled, publishing without these fields",
            feature_gate=gate,
            fields=paths,
            slice=dropped[paths[0]],
        )


class ApiErrorReporter:
    """Logs API errors; the same kind of failure is logged loudly only once."""

    def __init__(self, log: Any) -> None:
        """``log`` is a structlog logger (bound to the node and driver)."""
        self._log = log
        self._reported: set[tuple[int, str, str]] = set()
        self._taken: set[str] = set()

    def name_taken(self, name: str) -> None:
        """Our create of slice ``name`` conflicts with an object we cannot see: a slice of
        another node or driver holds the name, and only its removal lets the pool publish."""
        first = name not in self._taken
        self._taken.add(name)
        level = self._log.error if first else self._log.debug
        level(
            f"slice name {name} is taken by a ResourceSlice of another node or driver; "
            f"delete it (kubectl delete resourceslice {name}) to publish this node's pool",
            slice=name,
        )

    def published(self) -> None:
        """The pool is published: a name taken again later is reported loudly again."""
        self._taken.clear()

    def report(self, err: ApiError) -> None:
        """Log an API error with what to do about it where that is known."""
        key = (err.status, err.verb, err.name or "")
        first = key not in self._reported
        self._reported.add(key)
        if err.status == 403:
            if first:
                self._log.error(
                    f"forbidden: this service account may not {err.verb} {err.resource}; "
                    "grant the verb in the driver's ClusterRole",
                    verb=err.verb,
                    resource=err.resource,
                    message=err.message,
                )
            return
        if err.status in (400, 422):
            self._log.error(
                "the API server rejected a slice",
                slice=err.name,
                verb=err.verb,
                status=err.status,
                message=err.message,
            )
            return
        level = self._log.warning if first else self._log.debug
        level(
            "API request failed, backing off",
            verb=err.verb,
            resource=err.resource,
            slice=err.name,
            status=err.status,
            message=err.message,
        )
