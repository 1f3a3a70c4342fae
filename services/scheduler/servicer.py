"""Thin gRPC layer of the scheduler: protobuf <-> domain, nothing else."""
from __future__ import annotations

import asyncio

import structlog

from dspark.scheduler.engine import Engine
from dspark.shared import pb
from dspark.shared.config import SchedulerConfig
from dspark.shared.logging import get_logger
from dspark.shared.security import server_tls
from dspark.shared.service import Service, request_id_from
from dspark.v1 import scheduler_pb2, scheduler_pb2_grpc

SERVICE_NAME = "dspark.v1.Scheduler"
log = get_logger(component="scheduler")


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, engine: Engine):
        self.engine = engine

    async def Submit(self, request, context):
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
            if out.finished and out.spec is not None and request.return_spec_summary:
                resp.spec_summary.CopyFrom(pb.spec_summary_to_pb(out.spec))
            yield resp
            if out.finished:
                extra = {}
                if out.spec is not None:  # the per-request speculation summary
                    sp = out.spec
                    extra = dict(spec_k=sp.num_speculative_tokens, verify_steps=sp.verify_steps,
                                 drafted=sp.num_draft_tokens, accepted=sp.num_accepted_tokens,
                                 mean_accepted_length=round(sp.mean_accepted_length, 3),
                                 per_position_acceptance=[
                                     round(x, 3) for x in sp.per_position_acceptance],
                                 fallback_steps=sp.fallback_steps,
                                 unverified_steps=sp.unverified_steps)
                log.info("request_finished", reason=out.finish_reason.name, output_tokens=n_out,
                         **extra)

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
            free_leases=d.get("free_leases", 0), total_leases=d.get("total_leases", 0),
        )


async def serve(config: SchedulerConfig) -> None:
    from dspark.scheduler import ops
    from dspark.shared.metrics import SchedulerMetrics

    metrics = SchedulerMetrics()
    svc = Service(SERVICE_NAME, config.host, config.port, tls=server_tls(config),
                  metrics=metrics, metrics_port=config.metrics_port)
    svc.install_signal_handlers()
    engine = Engine(config)
    svc.add(scheduler_pb2_grpc.add_SchedulerServicer_to_server,
            ops.InstrumentedSchedulerServicer(engine, metrics),
            [scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name])
    await svc.start()
    try:
        await engine.start(config.worker_start_timeout_s)
    except BaseException as e:
        log.error("startup_failed", error=str(e))
        await svc.server.stop(0)
        raise
    sampler = asyncio.create_task(ops.sample_load(engine, metrics))
    watcher = asyncio.create_task(ops.watch_worker(engine, svc))
    await svc.set_ready(True)
    log.info("ready", address=svc.address, worker=config.worker)
    await svc.run_until_stopped(grace_s=config.drain_timeout + 1.0,
                                on_drain=lambda: ops.drain(engine, config.drain_timeout))
    sampler.cancel()
    watcher.cancel()
    await engine.close()
