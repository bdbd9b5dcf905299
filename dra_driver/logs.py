"""Structured logging: JSON lines for the DaemonSet, a readable console format for people.

The agent's events are rendered and written directly; library loggers (grpc, kubernetes,
urllib3, aiohttp) go through the logging module to the same renderer, so an operator sees
one format on one stream.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


#: Longest value a log event carries. A claim's config (which the API server accepts up to
#: megabytes) ends up in error messages; copying it into every event that mentions the
#: error would write megabytes per failed prepare.
MAX_VALUE = 4096


def truncate_values(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Cut string values longer than :data:`MAX_VALUE`, saying how much was cut."""
    for key, value in event.items():
        if isinstance(value, str) and len(value) > MAX_VALUE:
            event[key] = f"{value[:MAX_VALUE]}... ({len(value) - MAX_VALUE} more characters)"
    return event


class UtcStamper:
    """Adds ``timestamp``: the time in ISO 8601 UTC with microseconds, as structlog's
    ``TimeStamper(fmt="iso", utc=True)`` writes it. The date and time of day are formatted
    once a second, not per event: a datetime per event was, with the JSON rendering, the
    costliest step of an event, and prepare and unprepare log one event each."""

    def __init__(self) -> None:
        # The second and its text in one tuple, replaced in one step: worker threads log
        # too, and must never pair one second with another's text.
        self._formatted = (-1, "")

    def __call__(
        self, _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        now = time.time()
        second = int(now)
        formatted = self._formatted
        if formatted[0] != second:
            formatted = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
            self._formatted = formatted
        event["timestamp"] = f"{formatted[1]}.{int((now - second) * 1e6):06d}Z"
        return event


class JsonLine:
    """The JSON format of the agent's own events in one processor: the shared processors'
    fields (context variables, level, logger name, time stamp, an exception's traceback)
    added in their order, long values cut, then the line rendered. One call instead of six
    processors and a renderer: measured in the agent at concurrency 1, the chain cost about 7%
    of a prepare and unprepare's CPU, and this one call saves about half of it."""

    def __init__(self) -> None:
        self._stamp = UtcStamper()
        self._render = structlog.processors.JSONRenderer()

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        event = structlog.contextvars.merge_contextvars(logger, method, event)
        event = truncate_values(logger, method, event)
        event = structlog.stdlib.add_log_level(logger, method, event)
        event["logger"] = logger.name
        event = self._stamp(logger, method, event)
        if "exc_info" in event:
            event = structlog.processors.format_exc_info(logger, method, event)
        return self._render(logger, method, event)


class _StderrLogger:
    """Where the agent's own events go: one rendered line each, straight to stderr, which
    is line-buffered. Skipping the logging module (a record, a handler, its lock and a
    second pass through the processors) halves what an event costs; prepare logs two."""

    def __init__(self, name: str) -> None:
        self.name = name  # for add_logger_name

    def msg(self, message: str) -> None:
        """Write one rendered event."""
        sys.stderr.write(message + "\n")

    debug = info = warning = error = critical = exception = msg


def _stderr_logger(*args: Any) -> _StderrLogger:
    return _StderrLogger(str(args[0]) if args else "")


def configure(
    fmt: Literal["json", "console"] = "console",
    level: Literal["debug", "info", "warning", "error"] = "info",
) -> None:
    """Configure structlog and the standard library logging once for the process."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        truncate_values,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        UtcStamper(),
    ]
    renderer: structlog.types.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        # An event below the level costs a method call that does nothing.
        processors=[JsonLine()] if fmt == "json" else [*shared, renderer],
        logger_factory=_stderr_logger,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    # Client libraries are chatty at debug level and may log request headers (tokens).
    for noisy in ("urllib3", "kubernetes", "aiohttp", "asyncio"):
        logging.getLogger(noisy).setLevel(max(_LEVELS[level], logging.INFO))
