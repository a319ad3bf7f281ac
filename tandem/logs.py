"""structlog setup shared by every Tandem process.

JSON lines when stderr is not a terminal (files, CI, containers), coloured console output
when it is. Every service binds its name (and later run id, step, version) to each line; a
service process (`route_all=True`) also turns everything else it or its children write into
JSON lines: third-party logging, C++ warnings, progress bars (tandem/process_logs.py).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog


def _processors(use_json: bool) -> list:
    renderer = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        renderer,
    ]


def _level(level: str | None) -> int:
    name = (level or os.environ.get("TANDEM_LOG_LEVEL", "INFO")).upper()
    return getattr(logging, name, logging.INFO)


def configure_logging(service: str, *, level: str | None = None, json: bool | None = None,
                      route_all: bool = False) -> structlog.stdlib.BoundLogger:
    """Configure structlog for this (service) process and return a logger bound to `service`.
    route_all (service entry points): in JSON mode, every other line of the process is JSON too."""
    use_json = (not sys.stderr.isatty()) if json is None else json
    if use_json and route_all:
        from tandem.process_logs import json_everywhere

        json_everywhere(service)
    structlog.configure(
        processors=_processors(use_json),
        wrapper_class=structlog.make_filtering_bound_logger(_level(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(service=service)
    return structlog.get_logger()


def file_logger(service: str, file: TextIO, *, level: str | None = None) -> structlog.stdlib.BoundLogger:
    """A JSON-lines logger into `file`, bound to `service`, that leaves structlog's global
    configuration alone (a run started from the Python API must not redirect its caller's logs)."""
    return structlog.wrap_logger(structlog.PrintLogger(file), processors=_processors(True),
                                 wrapper_class=structlog.make_filtering_bound_logger(_level(level))).bind(service=service)
