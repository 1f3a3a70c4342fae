"""Thin gRPC layer of the scheduler: protobuf <-> domain, nothing else."""
from __future__ import annotations

import asyncio

import structlog

from dspark.scheduler.engine import Engine
from dspark.shared import errors, pb
from dspark.shared.config import SchedulerConfig
from dspark.shared.logging import get_logger
from dspark.shared.metrics import SchedulerMetrics
from dspark.shared.security import server_tls
from dspark.shared.service import Service, request_id_from
from dspark.shared.types import FinishReason
from dspark.v1 import scheduler_pb2, scheduler_pb2_grpc

SERVICE_NAME = "dspark.v1.Scheduler"
log = get_logger(component="scheduler")


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, engine: Engine, metrics: SchedulerMetrics | None = None):
        self.engine = engine
        self.metrics = metrics

    async def Submit(self, request, context):
        if self.metrics is None:
            async for resp in self._submit(request, context):
                yield resp
            return
        m = self.metrics
        timer = m.request_timer()
        outcome = "internal"
        m.running.inc()
        m.prompt_tokens.inc(len(request.prompt_token_ids))
        try:
            async for resp in self._submit(request, context):
                timer.on_tokens(len(resp.token_ids))
                if resp.finish_reason:
                    outcome = FinishReason(resp.finish_reason).name.lower()
                yield resp
        except errors.DSparkError as e:
            outcome = e.GRPC_CODE.lower()
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            m.running.dec()
            m.generation_tokens.inc(timer.num_tokens)
            m.requests.labels(outcome=outcome).inc()
            timer.finish()

    async def _submit(self, request, context):
        rid = request.request_id or request_id_from(context)
        structlog.contextvars.bind_contextvars(request_id=rid)
        sampling = pb.sampling_from_pb(request.sampling)
        prompt = list(request.prompt_token_ids)
        log.info("request_received", prompt_tokens=len(prompt), max_tokens=sampling.max_tokens)
        first = True
        n_out = 0
        async for out in self.engine.submit(rid, prompt, sampling):
            n_out += len(out.new_token_ids)
            resp = scheduler_pb2.SubmitResponse(
                token_ids=out.new_token_ids, finish_reason=pb.finish_to_pb(out.finish_reason))
            if first:
                resp.num_prompt_tokens = len(prompt)
                first = False
            yield resp
            if out.finished:
                log.info("request_finished", reason=out.finish_reason.name, output_tokens=n_out)

    async def Abort(self, request, context):
        return scheduler_pb2.SchedulerAbortResponse(found=self.engine.abort(request.request_id))

    async def GetLoad(self, request, context):
        d = self.engine.load()
        info = self.engine.info
        return scheduler_pb2.GetLoadResponse(
            num_waiting=d.get("num_waiting", 0), num_running=d.get("num_running", 0),
            free_kv_blocks=d.get("free_kv_blocks", 0), total_kv_blocks=d.get("total_kv_blocks", 0),
            outstanding_tokens=d.get("outstanding_tokens", 0),
            model_name=info.model_name if info else "",
            max_model_len=info.max_model_len if info else 0,
            accepting=d["accepting"], num_preemptions=d["num_preemptions"],
        )


async def _sample_load(engine: Engine, metrics: SchedulerMetrics, period_s: float = 0.25):
    """Queue depth, batch, KV blocks and leases into the gauges, on the loop."""
    while True:
        metrics.observe_load(engine.load())
        await asyncio.sleep(period_s)


async def serve(config: SchedulerConfig) -> None:
    metrics = SchedulerMetrics()
    svc = Service(SERVICE_NAME, config.host, config.port, tls=server_tls(config),
                  metrics=metrics, metrics_port=config.metrics_port)
    svc.install_signal_handlers()
    engine = Engine(config)
    engine.on_step = lambda dt, plan, outs: metrics.observe_step(
        dt, sum(len(s.token_ids) for s in plan.seqs))
    svc.add(scheduler_pb2_grpc.add_SchedulerServicer_to_server,
            SchedulerServicer(engine, metrics),
            [scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name])
    await svc.start()
    try:
        await engine.start(config.worker_start_timeout_s)
    except BaseException as e:
        log.error("startup_failed", error=str(e))
        await svc.server.stop(0)
        raise
    sampler = asyncio.create_task(_sample_load(engine, metrics))
    await svc.set_ready(True)
    log.info("ready", address=svc.address, worker=config.worker)
    async def drain():
        """Stop admitting; let requests finish within --drain-timeout; past
        it, fail what is left with a clear UNAVAILABLE (not a bare cancel)."""
        try:
            await asyncio.wait_for(engine.drain(), timeout=config.drain_timeout)
        except asyncio.TimeoutError:
            d = engine.load()
            log.warning("drain_timeout", drain_timeout_s=config.drain_timeout,
                        unfinished=d.get("num_running", 0) + d.get("num_waiting", 0))
            engine._fail_all(errors.Unavailable(
                f"scheduler shut down: the request did not finish within the drain timeout "
                f"({config.drain_timeout:g}s)"))
            await asyncio.sleep(0.2)  # let the streams carry the error out

    await svc.run_until_stopped(grace_s=config.drain_timeout + 1.0, on_drain=drain)
    sampler.cancel()
    await engine.close()
