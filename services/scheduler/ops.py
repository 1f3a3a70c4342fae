"""Operations hooks of the scheduler process, kept beside the servicer:
per-request metrics around Submit, load gauges, step timing, and the drain
with its timeout."""
from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2

from dspark.scheduler.engine import WORKER_SERVICE, Engine
from dspark.scheduler.servicer import SchedulerServicer
from dspark.shared import errors
from dspark.shared.logging import get_logger
from dspark.shared.metrics import SchedulerMetrics
from dspark.shared.types import FinishReason

log = get_logger(component="scheduler")


class InstrumentedSchedulerServicer(SchedulerServicer):
    """SchedulerServicer recording each Submit: outcome, TTFT, ITL,
    end-to-end latency, running requests, tokens."""

    def __init__(self, engine: Engine, metrics: SchedulerMetrics) -> None:
        super().__init__(engine)
        self.metrics = metrics
        engine.metrics = metrics
        engine.on_step = lambda dt, plan, outs: metrics.observe_step(
            dt, sum(len(s.token_ids) for s in plan.seqs))

    async def Submit(self, request, context):
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

        m.prompt_tokens.inc(len(request.prompt_token_ids))
        try:
            async for resp in super().Submit(request, context):
                timer.on_tokens(len(resp.token_ids))
                if resp.finish_reason:
                    outcome = FinishReason(resp.finish_reason).name.lower()
                    record()  # before the caller sees the end
                yield resp
        except errors.DSparkError as e:
            outcome = e.GRPC_CODE.lower()
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            record()


async def sample_load(engine: Engine, metrics: SchedulerMetrics, period_s: float = 0.25):
    """Queue depth, batch, KV blocks and leases into the gauges, on the loop."""
    while True:
        metrics.observe_load(engine.load())
        await asyncio.sleep(period_s)


async def drain(engine: Engine, timeout_s: float) -> None:
    """Stop admitting; let requests finish within ``timeout_s``; past it, fail
    what is left with a clear UNAVAILABLE (not a bare cancel)."""
    try:
        await asyncio.wait_for(engine.drain(), timeout=timeout_s)
    except asyncio.TimeoutError:
        d = engine.load()
        log.warning("drain_timeout", drain_timeout_s=timeout_s,
                    unfinished=d.get("num_running", 0) + d.get("num_waiting", 0))
        engine._fail_all(errors.Unavailable(
            f"scheduler shut down: the request did not finish within the drain timeout "
            f"({timeout_s:g}s)"))
        await asyncio.sleep(0.2)  # let the streams carry the error out


async def watch_worker(engine: Engine, svc, period_s: float = 1.0) -> None:
    """Follow the worker's readiness: while it is NOT_SERVING (draining,
    restarting) the scheduler stops admitting (GetLoad.accepting false, its
    own readiness off), so routers send new work elsewhere and the worker can
    finish what it has; when it serves again, admission resumes. Requests
    already running keep being stepped."""
    worker_ready = True
    while not svc.draining:
        try:
            r = await engine.health.Check(
                health_pb2.HealthCheckRequest(service=WORKER_SERVICE), timeout=2.0)
            ready = r.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.aio.AioRpcError:
            ready = False
        if svc.draining:
            return
        if ready != worker_ready:
            worker_ready = ready
            engine.accepting = ready
            await svc.set_ready(ready)
            log.warning("worker_ready" if ready else "worker_not_ready",
                        worker=engine.config.worker, accepting=ready)
        await asyncio.sleep(period_s)
