"""Log lines a machine reads: JSON through structlog, colour only on a terminal.

Baton's modules log through the standard library (``logging.getLogger("baton...")``) with the run
and submission ids as ``extra`` fields; this renders every record, FastStream's and the brokers'
clients' included, as one JSON object per line (``timestamp`` ISO-8601 UTC, ``level``, ``logger``,
``event`` and the extras), or as coloured console lines when the stream is a terminal.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

__all__ = ["LogFormat", "configure_logging"]

LogFormat = Literal["auto", "json", "console"]

# FastStream's loggers come with handlers of their own that colour every line, also into a file
_OWN_HANDLERS = ("faststream", "faststream.access")


def configure_logging(stream: TextIO | None = None, *, level: int = logging.INFO, fmt: LogFormat = "auto") -> None:
    """Send every log record to ``stream`` (stderr), rendered as ``fmt`` ("auto": console on a tty, else JSON)."""
    stream = stream or sys.stderr
    console = fmt == "console" or (fmt == "auto" and stream.isatty())
    renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty()) if console else structlog.processors.JSONRenderer()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    for name in _OWN_HANDLERS:
        own = logging.getLogger(name)
        own.handlers = []
        own.propagate = True
