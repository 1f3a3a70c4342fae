"""Prometheus metrics of every service, in one place.

Each service process builds one metric set (:class:`RouterMetrics`,
:class:`SchedulerMetrics`, :class:`WorkerMetrics`) on its own
``CollectorRegistry`` (so several sets can live in one test process) and
serves it on ``--metrics-port`` with
:func:`dspark.shared.metrics_server.start_metrics_server` (with the TLS of the
service's gRPC port, mutual included). The router also serves it at
``/metrics`` of its HTTP API.

Names: ``dspark_<service>_...``; the speculation counters use the names vLLM
users already have dashboards for, with our prefix:
``dspark_spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total``,
``..._num_accepted_tokens_per_pos_total{position}``, plus
``dspark_spec_decode_num_fallback_steps_total``, and
``dspark_spec_decode_num_unverified_steps_total`` (ours: a step of a
speculating request whose confidence-scheduled verify budget gave it no draft).

Example (scheduler, once per request per verify step)::

    m = SchedulerMetrics(num_speculative_tokens=7)
    m.record_spec_step(num_draft_tokens=7, num_accepted=3, fallback=False)
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# No `*_created` series next to every counter and histogram: dashboards use
# rate() over the _total / _count series (as vLLM does).
disable_created_metrics()

__all__ = ["CONTENT_TYPE_LATEST", "GrpcMetricsInterceptor", "RequestTimer", "RouterMetrics",
           "SchedulerMetrics", "ServiceMetrics", "WorkerMetrics"]

# Seconds. TTFT includes queueing and prefill; ITL is one decode step on CPU
# (tens of ms) up to a preempted request's wait.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5,
                1.0, 2.5, 5.0)


class ServiceMetrics:
    """What every service exports: readiness, draining and gRPC calls by code."""

    service = "service"

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        p = f"dspark_{self.service}"
        self.ready = Gauge(f"{p}_ready", "1 while readiness is SERVING", registry=self.registry)
        self.draining = Gauge(f"{p}_draining", "1 after SIGTERM, while in-flight work drains",
                              registry=self.registry)
        self.grpc_requests = Counter(
            f"{p}_grpc_requests", "gRPC calls handled, by method and status code",
            ["method", "code"], registry=self.registry)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)


class RequestTimer:
    """Times one request: TTFT at the first token, ITL between token batches
    (per token), end-to-end at :meth:`finish`. Not thread-safe (one request)."""

    def __init__(self, ttft: Histogram, itl: Histogram, e2e: Histogram) -> None:
        self._ttft, self._itl, self._e2e = ttft, itl, e2e
        self.start = time.monotonic()
        self._last: float | None = None
        self.num_tokens = 0

    def on_tokens(self, n: int) -> None:
        """``n`` tokens arrived now (one batch)."""
        if n <= 0:
            return
        now = time.monotonic()
        if self._last is None:
            self._ttft.observe(now - self.start)
            n_itl, gap = n - 1, 0.0  # tokens after the first in the same batch: no gap
        else:
            n_itl, gap = n, (now - self._last) / n
        for _ in range(n_itl):
            self._itl.observe(gap)
        self._last = now
        self.num_tokens += n

    def finish(self) -> float:
        """Observe and return the end-to-end latency."""
        dt = time.monotonic() - self.start
        self._e2e.observe(dt)
        return dt


class _RequestMetricsMixin:
    """Requests by outcome, TTFT, ITL, e2e, running requests (router and scheduler)."""

    def _init_request_metrics(self, p: str) -> None:
        r = self.registry
        self.requests = Counter(
            f"{p}_requests", "Finished requests by outcome (stop, length, abort, or the "
            "error: invalid_argument, not_found, unauthenticated, rate_limited, "
            "resource_exhausted, unavailable, cancelled, internal, ...)",
            ["outcome"], registry=r)
        self.ttft = Histogram(f"{p}_time_to_first_token_seconds",
                              "Time from arrival to the first output token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(f"{p}_inter_token_latency_seconds",
                             "Time between consecutive output tokens",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(f"{p}_e2e_request_latency_seconds",
                             "Time from arrival to the last response", buckets=E2E_BUCKETS,
                             registry=r)
        self.running = Gauge(f"{p}_num_requests_running", "Requests in flight here",
                             registry=r)
        self.prompt_tokens = Counter(f"{p}_prompt_tokens", "Prompt tokens of admitted requests",
                                     registry=r)
        self.generation_tokens = Counter(f"{p}_generation_tokens", "Output tokens streamed",
                                         registry=r)

    def request_timer(self) -> RequestTimer:
        return RequestTimer(self.ttft, self.itl, self.e2e)


class RouterMetrics(_RequestMetricsMixin, ServiceMetrics):
    """The router: requests by API and outcome, latencies, replicas."""

    service = "router"

    def __init__(self) -> None:
        super().__init__()
        self._init_request_metrics("dspark_router")
        self.replicas_available = Gauge(
            "dspark_router_replicas_available", "Scheduler replicas healthy and accepting",
            registry=self.registry)
        self.http_requests = Counter(
            "dspark_router_http_requests", "HTTP API requests by path and status",
            ["path", "status"], registry=self.registry)


class SchedulerMetrics(_RequestMetricsMixin, ServiceMetrics):
    """The scheduler: queue, batch, KV blocks, leases, steps, speculation.

    Args:
      num_speculative_tokens: K; the per-position counter is created for
        positions 0..K-1 up front so dashboards see zeros before traffic.
    """

    service = "scheduler"

    def __init__(self, num_speculative_tokens: int = 0) -> None:
        super().__init__()
        p, r = "dspark_scheduler", self.registry
        self._init_request_metrics(p)
        self.waiting = Gauge(f"{p}_num_requests_waiting", "Queue depth: requests waiting "
                             "for admission to the running batch", registry=r)
        self.batch_running = Gauge(f"{p}_num_requests_batched",
                                   "Requests in the running batch", registry=r)
        self.kv_blocks_used = Gauge(f"{p}_kv_blocks_used", "KV blocks allocated", registry=r)
        self.kv_blocks_total = Gauge(f"{p}_kv_blocks_total", "KV blocks of the worker",
                                     registry=r)
        self.leases_used = Gauge(f"{p}_leases_used", "Drafter leases held by requests",
                                 registry=r)
        self.leases_total = Gauge(f"{p}_leases_total", "Drafter leases of the worker",
                                  registry=r)
        self.preemptions = Gauge(f"{p}_num_preemptions", "Preemptions since start",
                                 registry=r)
        self.accepting = Gauge(f"{p}_accepting", "1 while new requests are admitted",
                               registry=r)
        self.steps = Counter(f"{p}_steps", "Worker steps completed", registry=r)
        self.step_duration = Histogram(f"{p}_step_duration_seconds",
                                       "One step: plan, worker RPC, commit", buckets=STEP_BUCKETS,
                                       registry=r)
        self.step_tokens = Counter(f"{p}_step_tokens", "Tokens scheduled into steps",
                                   registry=r)
        # vLLM-compatible speculation counters (our prefix).
        self.spec_num_drafts = Counter(
            "dspark_spec_decode_num_drafts", "Verify steps that carried drafts (per request)",
            registry=r)
        self.spec_num_draft_tokens = Counter(
            "dspark_spec_decode_num_draft_tokens", "Draft tokens proposed", registry=r)
        self.spec_num_accepted_tokens = Counter(
            "dspark_spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.spec_accepted_per_pos = Counter(
            "dspark_spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by draft position (0 = first draft)", ["position"],
            registry=r)
        self.spec_fallback_steps = Counter(
            "dspark_spec_decode_num_fallback_steps",
            "Steps decoded one token at a time (window past max_model_len, or speculation "
            "off for the request)", registry=r)
        self.spec_unverified_steps = Counter(
            "dspark_spec_decode_num_unverified_steps",
            "Speculating requests' steps that verified no draft because the confidence-"
            "scheduled verify budget left them none (one token committed)", registry=r)
        for k in range(num_speculative_tokens):
            self.spec_accepted_per_pos.labels(position=str(k))

    def record_spec_step(self, num_draft_tokens: int, num_accepted: int,
                         fallback: bool = False, unverified: bool = False) -> None:
        """One request's share of one verify step.

        Args:
          num_draft_tokens: drafts verified for this request this step (K, or
            fewer near max_model_len); 0 for a plain decode step.
          num_accepted: drafts the target accepted, a prefix: positions
            0..num_accepted-1 (the bonus token is not a draft and not counted).
          fallback: the step decoded one token without drafts.
          unverified: the request could speculate but the step's verify budget
            (confidence-scheduled verification) gave it no draft row: one
            token, counted apart from fallback steps.
        """
        if num_accepted < 0 or num_accepted > num_draft_tokens:
            raise ValueError(f"num_accepted={num_accepted} is invalid: must be in "
                             f"0..{max(num_draft_tokens, 0)} (num_draft_tokens)")
        if fallback:
            self.spec_fallback_steps.inc()
        if unverified:
            self.spec_unverified_steps.inc()
        if num_draft_tokens <= 0:
            return
        self.spec_num_drafts.inc()
        self.spec_num_draft_tokens.inc(num_draft_tokens)
        self.spec_num_accepted_tokens.inc(num_accepted)
        for pos in range(num_accepted):
            self.spec_accepted_per_pos.labels(position=str(pos)).inc()

    def observe_load(self, load: Mapping[str, int | bool]) -> None:
        """Set the gauges from an ``Engine.load()`` dict (missing keys read 0)."""
        g = load.get
        self.waiting.set(g("num_waiting", 0))
        self.batch_running.set(g("num_running", 0))
        total = g("total_kv_blocks", 0)
        self.kv_blocks_total.set(total)
        self.kv_blocks_used.set(total - g("free_kv_blocks", 0))
        total_leases = g("total_leases", 0)
        self.leases_total.set(total_leases)
        self.leases_used.set(total_leases - g("free_leases", 0))
        self.preemptions.set(g("num_preemptions", 0))
        self.accepting.set(1 if g("accepting", False) else 0)

    def observe_step(self, duration_s: float, num_tokens: int) -> None:
        """One finished step of ``num_tokens`` scheduled tokens."""
        self.steps.inc()
        self.step_duration.observe(duration_s)
        self.step_tokens.inc(num_tokens)


class WorkerMetrics(ServiceMetrics):
    """The worker: forward time per step, batch sizes, KV pool size."""

    service = "worker"

    def __init__(self) -> None:
        super().__init__()
        p, r = "dspark_worker", self.registry
        self.steps = Counter(f"{p}_steps", "Steps executed", registry=r)
        self.step_duration = Histogram(f"{p}_step_duration_seconds",
                                       "Forward time of one step", buckets=STEP_BUCKETS,
                                       registry=r)
        self.step_tokens = Counter(f"{p}_step_tokens", "Tokens computed", registry=r)
        self.step_seqs = Histogram(f"{p}_step_batch_size", "Sequences per step",
                                   buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.kv_blocks_total = Gauge(f"{p}_kv_blocks_total", "KV blocks in the paged pool",
                                     registry=r)

    def observe_step(self, forward_s: float, num_seqs: int, num_tokens: int) -> None:
        self.steps.inc()
        self.step_duration.observe(forward_s)
        self.step_tokens.inc(num_tokens)
        self.step_seqs.observe(num_seqs)


class GrpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts every ``/dspark.*`` call by method and final status code."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._m = metrics

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith("/dspark."):
            return handler
        short = method.rsplit("/", 1)[-1]
        counter = self._m.grpc_requests
        kw = dict(request_deserializer=handler.request_deserializer,
                  response_serializer=handler.response_serializer)

        def code_of(ctx, exc: BaseException | None) -> str:
            if exc is None or isinstance(exc, grpc.aio.AbortError):
                code = ctx.code()
                return code.name if isinstance(code, grpc.StatusCode) else "OK"
            if isinstance(exc, asyncio.CancelledError):
                return "CANCELLED"
            return "UNKNOWN"

        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary(req, ctx):
                exc = None
                try:
                    return await inner(req, ctx)
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    counter.labels(method=short, code=code_of(ctx, exc)).inc()

            return grpc.unary_unary_rpc_method_handler(unary, **kw)
        if handler.unary_stream:
            inner_s = handler.unary_stream

            async def stream(req, ctx):
                exc = None
                try:
                    async for resp in inner_s(req, ctx):
                        yield resp
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    counter.labels(method=short, code=code_of(ctx, exc)).inc()

            return grpc.unary_stream_rpc_method_handler(stream, **kw)
        return handler
