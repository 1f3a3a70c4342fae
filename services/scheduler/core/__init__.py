"""Scheduler core: request state, KV block allocator and the step scheduler.

Pure Python: no torch and no gRPC anywhere in this package.
"""
from .block_allocator import BlockAllocator
from .errors import (AdmissionError, DuplicateRequestError, RequestValidationError,
                     SchedulerError)
from .request import Request, RequestStatus
from .scheduler import Scheduler

__all__ = [
    "AdmissionError", "BlockAllocator", "DuplicateRequestError", "Request",
    "RequestStatus", "RequestValidationError", "Scheduler", "SchedulerError",
]
