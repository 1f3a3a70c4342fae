"""What every service process shares: an asyncio gRPC server with the health
service, reflection and one interceptor that maps domain errors to gRPC status
codes, plus graceful shutdown on SIGTERM / Ctrl-C.
"""
from __future__ import annotations

import asyncio
import ipaddress
import signal
import time
from typing import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dspark.shared import errors
from dspark.shared.logging import get_logger

log = get_logger(component="service")

# Large enough for tap-row tensors and 8k-token prompts.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """Map a domain exception to (gRPC status, message)."""
    if isinstance(exc, errors.DSparkError):
        return getattr(grpc.StatusCode, exc.GRPC_CODE), str(exc)
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


async def _abort(ctx: grpc.aio.ServicerContext, exc: BaseException, method: str):
    code, msg = status_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("rpc_failed", method=method)
    else:
        log.info("rpc_rejected", method=method, code=code.name, error=msg)
    await ctx.abort(code, msg)


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Turns exceptions raised by our servicers into gRPC statuses."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith("/dspark."):
            return handler
        kw = dict(request_deserializer=handler.request_deserializer,
                  response_serializer=handler.response_serializer)
        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary(req, ctx):
                try:
                    return await inner(req, ctx)
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # noqa: BLE001 - the boundary
                    await _abort(ctx, exc, method)

            return grpc.unary_unary_rpc_method_handler(unary, **kw)
        if handler.unary_stream:
            inner_s = handler.unary_stream

            async def stream(req, ctx):
                try:
                    async for resp in inner_s(req, ctx):
                        yield resp
                except (grpc.aio.AbortError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # noqa: BLE001 - the boundary
                    await _abort(ctx, exc, method)

            return grpc.unary_stream_rpc_method_handler(stream, **kw)
        return handler


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Service:
    """An aio gRPC server for one service: health (liveness on "", readiness on
    the service's full name), reflection, error mapping, graceful stop.

    Optional: ``tls`` (a ``dspark.shared.security.ServerTLS``: TLS only, mutual
    when it has a client CA; the metrics port follows it), ``metrics`` (a
    ``dspark.shared.metrics`` set: gRPC calls are counted; served on
    ``metrics_port`` when > 0),
    extra ``interceptors`` (run before the error mapping) and server
    ``options`` (default GRPC_OPTIONS).
    """

    def __init__(self, service_name: str, host: str, port: int, *, tls=None, metrics=None,
                 metrics_port: int = 0, interceptors=(), options=None):
        self.service_name = service_name  # e.g. "dspark.v1.Worker"
        self.host = host
        self.address = f"{host}:{port}"
        self.tls = tls
        self.metrics = metrics
        self.metrics_port = metrics_port
        self._metrics_server = None
        chain = list(interceptors)
        if metrics is not None:
            from dspark.shared.metrics import GrpcMetricsInterceptor

            chain.insert(0, GrpcMetricsInterceptor(metrics))
        self.server = grpc.aio.server(interceptors=[*chain, ErrorInterceptor()],
                                      options=options or GRPC_OPTIONS)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._stopping = asyncio.Event()
        self.draining = False

    def add(self, add_fn: Callable, servicer, descriptor_names: list[str]) -> None:
        add_fn(servicer, self.server)
        reflection.enable_server_reflection(
            [*descriptor_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME], self.server)

    async def start(self) -> None:
        if self.tls is not None:
            self.tls.ssl_context()  # bad PEM files: a clear error naming the field
        try:
            if self.tls is not None:
                bound = self.server.add_secure_port(self.address, self.tls.grpc_credentials())
            else:
                bound = self.server.add_insecure_port(self.address)
        except RuntimeError:
            bound = 0
        if bound == 0:
            raise RuntimeError(f"cannot bind {self.address}")
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.set_ready(False)
        if self.metrics is not None and self.metrics_port:
            from dspark.shared.metrics_server import start_metrics_server

            try:  # the gRPC port's TLS: mutual there = a client certificate here too
                self._metrics_server = start_metrics_server(
                    self.metrics, self.host, self.metrics_port, tls=self.tls)
            except OSError as e:
                await self.server.stop(0)
                raise RuntimeError(f"cannot bind metrics port {self.host}:{self.metrics_port}: "
                                   f"{e.strerror}") from None
        if not is_loopback(self.host) and self.tls is None:
            log.warning("listening_without_tls", address=self.address,
                        hint="set tls_cert/tls_key, or keep the host on loopback")
        log.info("listening", service=self.service_name, address=self.address,
                 tls="mutual" if self.tls and self.tls.client_ca else bool(self.tls),
                 metrics_port=self.metrics_port or None)

    async def set_ready(self, ready: bool) -> None:
        status = (health_pb2.HealthCheckResponse.SERVING if ready
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(self.service_name, status)
        if self.metrics is not None:
            self.metrics.ready.set(1 if ready else 0)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)

    def request_stop(self) -> None:
        self._stopping.set()

    async def run_until_stopped(self, grace_s: float = 5.0,
                                on_drain: Callable[[], Awaitable[None]] | None = None) -> None:
        """Serve until SIGTERM/SIGINT; then drain: readiness goes NOT_SERVING,
        the drain hook (stop admitting, wait for in-flight work) runs for at
        most ``grace_s`` seconds (the service's --drain-timeout), and the
        server stops, cancelling whatever is still running."""
        await self._stopping.wait()
        self.draining = True
        t0 = time.monotonic()
        log.info("stopping", service=self.service_name, drain_timeout_s=grace_s)
        if self.metrics is not None:
            self.metrics.draining.set(1)
        await self.set_ready(False)
        if on_drain is not None:
            try:
                await asyncio.wait_for(on_drain(), timeout=grace_s)
                log.info("drained", service=self.service_name,
                         seconds=round(time.monotonic() - t0, 3))
            except asyncio.TimeoutError:
                log.warning("drain_timeout", service=self.service_name, drain_timeout_s=grace_s)
        await self.health.enter_graceful_shutdown()
        # Drained (or out of time): RPCs still open get a short grace, then cancelled.
        await self.server.stop(min(1.0, max(0.0, grace_s - (time.monotonic() - t0))) or None)
        if self._metrics_server is not None:
            self._metrics_server.stop()
        log.info("stopped", service=self.service_name)


def request_id_from(ctx: grpc.aio.ServicerContext) -> str:
    from dspark.shared.logging import REQUEST_ID_KEY

    for k, v in ctx.invocation_metadata() or ():
        if k == REQUEST_ID_KEY:
            return v
    return ""
