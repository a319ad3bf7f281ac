"""structlog setup shared by every Tandem process.

JSON lines when stderr is not a terminal (files, CI, containers), coloured console output
when it is. Every service binds its name (and later run id, step, version) to each line.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog


def configure_logging(service: str, *, level: str | None = None, json: bool | None = None,
                      file: TextIO | None = None) -> structlog.stdlib.BoundLogger:
    """Configure structlog for this process and return a logger bound to `service`.

    `file`: write there instead of stderr (JSON unless told otherwise).
    """
    level_name = (level or os.environ.get("TANDEM_LOG_LEVEL", "INFO")).upper()
    out = file or sys.stderr
    use_json = (not out.isatty()) if json is None else json
    renderer = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level_name, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(service=service)
    return structlog.get_logger()
