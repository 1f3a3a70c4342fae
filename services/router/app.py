"""The router process: gRPC API, OpenAI-compatible HTTP API, metrics, API keys
and rate limits, TLS, and graceful drain on SIGTERM.

Drain: readiness (gRPC health and ``/health``) turns NOT_SERVING, new
requests are refused with UNAVAILABLE / 503, requests in flight run to the
end within ``--drain-timeout``, then the servers stop.
"""
from __future__ import annotations

import asyncio

from dspark.router.servicer import SERVICE_NAME, RouterServicer
from dspark.router.tokenizer import Tokenizer
from dspark.shared import errors
from dspark.shared.config import RouterConfig
from dspark.shared.logging import get_logger
from dspark.shared.metrics import RouterMetrics
from dspark.shared.security import (
    ApiKeys,
    AuthInterceptor,
    Gate,
    RateLimiter,
    server_tls,
)
from dspark.shared.service import GRPC_OPTIONS, Service
from dspark.v1 import common_pb2, router_pb2, router_pb2_grpc

log = get_logger(component="router")

_OUTCOMES = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length",
             common_pb2.FINISH_REASON_ABORT: "abort"}


class InstrumentedRouter(RouterServicer):
    """RouterServicer that records each Generate in the router's metrics:
    outcome, TTFT, ITL, end-to-end latency, requests running, tokens."""

    def __init__(self, config: RouterConfig, tokenizer, metrics: RouterMetrics) -> None:
        super().__init__(config, tokenizer)
        self.metrics = metrics

    async def Generate(self, request, context):
        m = self.metrics
        timer = m.request_timer()
        outcome = "internal"
        done = False
        m.running.inc()

        def record() -> None:  # once, when the final response goes out (or the call ends)
            nonlocal done
            if not done:
                done = True
                m.running.dec()
                m.generation_tokens.inc(timer.num_tokens)
                m.requests.labels(outcome=outcome).inc()
                timer.finish()

        try:
            async for resp in super().Generate(request, context):
                timer.on_tokens(len(resp.token_ids))
                if resp.finish_reason:
                    outcome = _OUTCOMES.get(resp.finish_reason, "internal")
                    record()  # before the caller sees the end
                    m.prompt_tokens.inc(resp.usage.prompt_tokens)
                yield resp
        except errors.DSparkError as e:
            outcome = e.GRPC_CODE.lower()
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            record()


def _gate(config: RouterConfig) -> Gate:
    keys = ApiKeys.from_file(config.api_keys_file) if config.api_keys_file else None
    return Gate(keys, RateLimiter(config.rate_limit_rps, config.rate_limit_burst))


async def _poll_forever(servicer: RouterServicer, svc: Service, metrics: RouterMetrics,
                        period_s: float = 0.5) -> None:
    while True:
        try:
            await servicer.poll_once()
        except Exception:  # noqa: BLE001 - keep polling
            log.exception("poll_failed")
        metrics.replicas_available.set(servicer.replicas.num_available())
        await svc.set_ready(servicer.ready and not svc.draining)
        await asyncio.sleep(period_s)


async def serve(config: RouterConfig) -> None:
    metrics = RouterMetrics()
    gate = _gate(config)
    tls = server_tls(config)
    options = [o for o in GRPC_OPTIONS if o[0] != "grpc.max_receive_message_length"]
    options.append(("grpc.max_receive_message_length", config.max_request_bytes))
    auth = AuthInterceptor(gate, on_reject=lambda o: metrics.requests.labels(outcome=o).inc())
    svc = Service(SERVICE_NAME, config.host, config.port, tls=tls, metrics=metrics,
                  metrics_port=config.metrics_port, interceptors=[auth], options=options)
    svc.install_signal_handlers()
    tokenizer = Tokenizer.from_dir(config.model_dir)
    servicer = InstrumentedRouter(config, tokenizer, metrics)
    svc.add(router_pb2_grpc.add_RouterServicer_to_server, servicer,
            [router_pb2.DESCRIPTOR.services_by_name["Router"].full_name])
    await svc.start()
    http = None
    if config.http_port:
        from dspark.router.http_api import OpenAIApi

        http = OpenAIApi(servicer, gate, metrics, max_request_bytes=config.max_request_bytes)
        try:
            await http.start(config.host, config.http_port,
                             ssl_context=tls.ssl_context() if tls else None)
        except BaseException:
            await svc.server.stop(0)
            raise
    log.info("router_started", keys=len(gate.keys) if gate.keys else 0,
             rate_limit_rps=config.rate_limit_rps or None, http_port=config.http_port or None)
    poller = asyncio.create_task(_poll_forever(servicer, svc, metrics))

    async def drain():
        servicer.draining = True
        while servicer._running or (http is not None and http.inflight):
            await asyncio.sleep(0.05)

    await svc.run_until_stopped(grace_s=config.drain_timeout, on_drain=drain)
    poller.cancel()
    if http is not None:
        await http.stop()
