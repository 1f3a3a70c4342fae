"""Typed errors shared by the client SDK and the service boundary.

Each class carries the name of the gRPC status code it maps to (``GRPC_CODE``,
a ``grpc.StatusCode`` member name as a string) so that this module does not
import grpc. Services raise these from domain code; the servicer's error
interceptor turns them into statuses with :func:`grpc_status_code`. The client
SDK turns a ``grpc.RpcError`` back into one with :func:`from_grpc_error`.

Example::

    try:
        client.generate(prompt="")
    except InvalidArgument as e:
        print(e.field, e)   # "prompt", "prompt: must not be empty"
"""
from __future__ import annotations


class DSparkError(Exception):
    """Base of every DSpark error; ``GRPC_CODE`` names its gRPC status code."""

    GRPC_CODE: str = "UNKNOWN"

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(DSparkError, ValueError):
    """Bad input. ``field`` names the offending field ("" when unknown).

    ``InvalidArgument("top_p", "must be in (0, 1], got 1.5")`` renders as
    ``"top_p: must be in (0, 1], got 1.5"``.
    """

    GRPC_CODE = "INVALID_ARGUMENT"

    def __init__(self, field: str = "", message: str = "") -> None:
        self.field = field
        self.detail = message
        full = f"{field}: {message}" if field and message else (message or field)
        super().__init__(full)


class NotFound(DSparkError):
    """A named thing (model, request id) does not exist."""

    GRPC_CODE = "NOT_FOUND"


class ResourceExhausted(DSparkError):
    """The service is full (queue or capacity); retry later."""

    GRPC_CODE = "RESOURCE_EXHAUSTED"


class Unauthenticated(DSparkError):
    """Missing or wrong API key."""

    GRPC_CODE = "UNAUTHENTICATED"


class Unavailable(DSparkError):
    """No backend can serve the request right now (down, draining, unreachable)."""

    GRPC_CODE = "UNAVAILABLE"


class NoReplicaAvailable(Unavailable):
    """No healthy, accepting scheduler replica is left to pick."""


class DeadlineExceeded(DSparkError, TimeoutError):
    """The call's deadline passed before it finished."""

    GRPC_CODE = "DEADLINE_EXCEEDED"


class Cancelled(DSparkError):
    """The call was cancelled (by the client or the server)."""

    GRPC_CODE = "CANCELLED"


class Internal(DSparkError):
    """A bug or an unexpected failure on the server side."""

    GRPC_CODE = "INTERNAL"


# Status code name -> class. Codes without a class of their own map to Internal
# (UNKNOWN, DATA_LOSS, ...) or to the closest meaning.
_BY_CODE: dict[str, type[DSparkError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "OUT_OF_RANGE": InvalidArgument,
    "FAILED_PRECONDITION": InvalidArgument,
    "NOT_FOUND": NotFound,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "UNAVAILABLE": Unavailable,
    "UNAUTHENTICATED": Unauthenticated,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "CANCELLED": Cancelled,
    "INTERNAL": Internal,
}


def error_for_code(code_name: str, message: str = "") -> DSparkError:
    """The DSpark error for a gRPC status code name (e.g. "NOT_FOUND")."""
    cls = _BY_CODE.get(code_name, Internal)
    if cls is InvalidArgument:
        # The server's message already reads "field: detail"; recover the field.
        field, sep, detail = message.partition(": ")
        if sep and field and " " not in field:
            return InvalidArgument(field, detail)
        return InvalidArgument("", message)
    err = cls(message)
    if cls is Internal and code_name not in ("INTERNAL",):
        err.message = f"{code_name}: {message}" if message else code_name
    return err


def from_grpc_error(rpc_error: BaseException) -> DSparkError:
    """Map a ``grpc.RpcError`` (sync or aio) to the matching DSpark error.

    Anything that is not an RpcError with a status code becomes ``Internal``.
    The original error is attached as ``__cause__``.
    """
    if isinstance(rpc_error, DSparkError):
        return rpc_error
    code_name = "UNKNOWN"
    message = str(rpc_error)
    code = getattr(rpc_error, "code", None)
    if callable(code):
        try:
            c = code()
            code_name = getattr(c, "name", str(c))
            details = rpc_error.details()  # type: ignore[attr-defined]
            message = details or ""
        except Exception:  # noqa: BLE001 - a half-built RpcError: keep defaults
            pass
    err = error_for_code(code_name, message)
    err.__cause__ = rpc_error
    return err


def grpc_status_code(err: BaseException):
    """The ``grpc.StatusCode`` a service should answer for ``err``.

    DSpark errors use their ``GRPC_CODE``; a plain ``ValueError`` is treated
    as INVALID_ARGUMENT; anything else is INTERNAL. Imports grpc lazily.
    """
    import grpc

    if isinstance(err, DSparkError):
        return getattr(grpc.StatusCode, err.GRPC_CODE, grpc.StatusCode.UNKNOWN)
    if isinstance(err, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL
