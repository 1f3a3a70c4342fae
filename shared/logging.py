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
    return structlog.get_logger().bind(service=service)


def get_logger(**kw) -> structlog.BoundLogger:
    return structlog.get_logger().bind(**kw)


# gRPC metadata key carrying the request id from router to scheduler to worker.
REQUEST_ID_KEY = "x-request-id"
