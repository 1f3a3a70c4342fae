"""structlog set-up: JSON, one event per line, with the request id bound."""
from __future__ import annotations

import logging
import sys

import structlog


def configure(service: str, level: str = "INFO", json: bool = True) -> structlog.BoundLogger:
    """Configure structlog for a service process and return its logger."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=lvl, format="%(message)s")
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Every event of this process carries the service name (asyncio tasks
    # inherit the context they were created in).
    structlog.contextvars.bind_contextvars(service=service)
    return structlog.get_logger()


def get_logger(**kw) -> structlog.BoundLogger:
    """A lazy logger: safe at import time, configured by `configure` later
    (binding eagerly would freeze structlog's default configuration)."""
    return structlog.get_logger(**kw)


# gRPC metadata key carrying the request id from router to scheduler to worker.
REQUEST_ID_KEY = "x-request-id"
