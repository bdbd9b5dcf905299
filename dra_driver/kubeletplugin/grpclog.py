"""grpc's own log records, kept to one line for requests the plugin could not decode.

When a request on a plugin socket is not valid protobuf, grpc's server logs the decoding
error at error level with a full traceback (logger ``grpc._cython.cygrpc``), once per request:
anyone who can write to the socket can fill the log with tracebacks. The client already gets
the error as its RPC status; the record becomes a one-line warning.
"""

from __future__ import annotations

import logging

from google.protobuf.message import DecodeError

GRPC_LOGGER = "grpc._cython.cygrpc"


class MalformedRequestFilter(logging.Filter):
    """Turns grpc's "Unexpected [DecodeError]" records into one-line warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, DecodeError):
            first = str(error).splitlines()[0] if str(error) else "DecodeError"
            record.msg = "malformed request on a plugin socket: %s"
            record.args = (first,)
            record.levelno = logging.WARNING
            record.levelname = logging.getLevelName(logging.WARNING)
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_malformed_requests() -> None:
    """Install the filter on grpc's server logger (once per process)."""
    logger = logging.getLogger(GRPC_LOGGER)
    if not any(isinstance(f, MalformedRequestFilter) for f in logger.filters):
        logger.addFilter(MalformedRequestFilter())
