"""Domain errors of the scheduler core.

The servicer maps them to gRPC status codes at the service boundary:
``AdmissionError`` -> RESOURCE_EXHAUSTED, ``RequestValidationError`` ->
INVALID_ARGUMENT (``DuplicateRequestError`` may be mapped to ALREADY_EXISTS).
"""
from __future__ import annotations


class SchedulerError(Exception):
    """Base class of every error the scheduler core raises on purpose."""


class AdmissionError(SchedulerError):
    """The waiting queue is full; the caller should retry later or elsewhere."""


class RequestValidationError(SchedulerError, ValueError):
    """A request is malformed or can never fit; names the field and the limit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class DuplicateRequestError(RequestValidationError):
    """A live request already has this id."""
