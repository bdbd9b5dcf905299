"""Structured logging: JSON lines for the DaemonSet, a readable console format for people.

Library loggers (grpc, kubernetes, urllib3, aiohttp) go through the same renderer, so an
operator sees one format on one stream.
"""

from __future__ import annotations

import logging
import sys
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
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        # The level filter first: a debug event below the level costs a check, not a
        # timestamp and a trip through the logging module (a tenth of a millisecond each).
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
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
