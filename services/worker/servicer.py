"""Thin gRPC layer over the model runner: protobuf in, domain objects to the
runner, protobuf out. Forwards run on one dedicated thread so that health
checks and Info stay responsive while a step computes."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor


from dspark.shared import errors, pb
from dspark.shared.config import WorkerConfig
from dspark.shared.logging import get_logger
from dspark.shared.security import server_tls
from dspark.shared.service import Service
from dspark.v1 import worker_pb2, worker_pb2_grpc

SERVICE_NAME = "dspark.v1.Worker"
log = get_logger(component="worker")


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, runner=None):
        self.runner = runner  # None while the model loads: RPCs answer UNAVAILABLE
        # The one thread that runs every torch computation of this process.
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")
        # Async scheduling: a step may say "after step X"; steps done (or failed)
        self._finished_steps: set[int] = set()
        self._step_done = asyncio.Condition()

    def _require_runner(self):
        if self.runner is None:
            raise errors.Unavailable("worker is loading its model")
        return self.runner

    async def Info(self, request, context):
        return pb.info_to_pb(self._require_runner().info())

    async def Step(self, request, context):
        self._require_runner()
        plan = pb.step_from_pb(request)
        loop = asyncio.get_running_loop()
        for s in plan.seqs:
            if s.start_position == 0:  # a request's first chunk reaches this worker
                log.info("seq_started", request_id=s.request_id, step_id=plan.step_id)
        if request.after_step_id:  # run strictly after the step dispatched before it
            before = request.after_step_id - 1
            async with self._step_done:
                await asyncio.wait_for(self._step_done.wait_for(
                    lambda: before in self._finished_steps), timeout=60.0)
        try:
            out = await loop.run_in_executor(self.compute, self.runner.step, plan)
        finally:
            async with self._step_done:
                self._finished_steps.add(plan.step_id)
                if len(self._finished_steps) > 64:
                    self._finished_steps = set(sorted(self._finished_steps)[-32:])
                self._step_done.notify_all()
        log.debug("step", step_id=plan.step_id, seqs=len(plan.seqs),
                  tokens=sum(len(s.token_ids) for s in plan.seqs),
                  forward_ms=round(out.forward_ms, 2),
                  request_ids=[s.request_id for s in plan.seqs])
        return pb.step_output_to_pb(out)

    async def Release(self, request, context):
        self._require_runner()
        ids = list(request.request_ids)
        log.info("seqs_released", request_ids=ids)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.compute, self.runner.release, ids)
        return worker_pb2.ReleaseResponse()


async def serve(config: WorkerConfig) -> None:
    """Start the worker: bind first (liveness answers during loading), load the
    model, warm up, then turn readiness on."""
    from dspark.shared.metrics import WorkerMetrics
    from dspark.worker.ops import InstrumentedWorkerServicer
    from dspark.worker.runner import ModelRunner

    metrics = WorkerMetrics()
    svc = Service(SERVICE_NAME, config.host, config.port, tls=server_tls(config),
                  metrics=metrics, metrics_port=config.metrics_port)
    svc.install_signal_handlers()
    servicer = InstrumentedWorkerServicer(metrics)
    svc.add(worker_pb2_grpc.add_WorkerServicer_to_server, servicer,
            [worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name])
    await svc.start()
    loop = asyncio.get_running_loop()
    try:
        # Load, warm up and step on the SAME thread: OpenMP keeps one thread
        # team per calling thread, and a second team spinning on two cores
        # made every decode step ~2x slower (measured: 28 ms vs 65 ms).
        runner = await loop.run_in_executor(servicer.compute, ModelRunner, config)
        await loop.run_in_executor(servicer.compute, runner.warmup)
        prof = await loop.run_in_executor(servicer.compute, runner.profile)
        if prof is not None:
            log.info("sps_profile", rows=list(prof.rows),
                     forward_ms=[round(x, 2) for x in prof.forward_ms],
                     draft_fixed_ms=round(prof.draft_fixed_ms, 2),
                     draft_per_request_ms=round(prof.draft_per_request_ms, 2),
                     draft_per_position_ms=round(prof.draft_per_position_ms, 3),
                     verify_policy=runner.verify_policy)
    except BaseException as e:
        log.error("startup_failed", error=str(e))
        await svc.server.stop(0)
        raise
    servicer.runner = runner
    info = runner.info()
    log.info("ready", model=info.model_name, dtype=info.dtype, device=info.device,
             kv_blocks=info.num_kv_blocks, block_size=info.block_size,
             max_model_len=info.max_model_len,
             attention="native" if runner.native_attention is not None else "torch",
             linear="native" if runner.native_linear is not None else "torch",
             gguf_matrices=runner.model.gguf_matrices)
    metrics.kv_blocks_total.set(info.num_kv_blocks)
    await svc.set_ready(True)
    await svc.run_until_stopped(grace_s=config.drain_timeout, on_drain=servicer.drain)
