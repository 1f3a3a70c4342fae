"""The scheduler's engine loop: drives the pure core (dspark.scheduler.core)
against one worker over gRPC and fans committed tokens out to the Submit
streams.

Everything here runs on one asyncio loop, so the core is only ever touched
from one thread. While a step is in flight, Submit/Abort keep running and
change the core; the core tolerates results for requests that left meanwhile.
"""
from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dspark.scheduler.core.errors import AdmissionError
from dspark.scheduler.core.scheduler import Scheduler
from dspark.scheduler.progress import ProgressLog
from dspark.shared import errors, pb
from dspark.shared.config import SchedulerConfig
from dspark.shared.logging import get_logger
from dspark.shared.security import aio_channel, upstream_tls
from dspark.shared.service import GRPC_OPTIONS
from dspark.shared.types import RequestOutput, SamplingParams, WorkerInfo
from dspark.v1 import worker_pb2, worker_pb2_grpc

log = get_logger(component="scheduler")
WORKER_SERVICE = "dspark.v1.Worker"


@dataclass
class _Failure:
    """Put in a stream's queue when its request fails server-side."""

    error: errors.DSparkError


class Engine:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.channel = aio_channel(config.worker, upstream_tls(config), options=GRPC_OPTIONS)
        self.worker = worker_pb2_grpc.WorkerStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.core: Scheduler | None = None
        self.info: WorkerInfo | None = None
        self._streams: dict[str, asyncio.Queue] = {}
        self._wakeup = asyncio.Event()
        self._to_release: list[str] = []
        # async scheduling: steps dispatched and not applied yet, oldest first
        self._inflight: collections.deque = collections.deque()
        self._last_dispatched: int | None = None
        self._release_gate: dict[str, int] = {}  # request -> step that must finish first
        self._task: asyncio.Task | None = None
        self.accepting = False
        self.steps = 0
        # Metrics hooks, set by the scheduler process (dspark.scheduler.ops):
        # on_step(duration_s, plan, outputs) after each step, and the
        # SchedulerMetrics set (record_spec_step per request per verify step).
        self.on_step = None
        self.metrics = None
        self._progress = ProgressLog()

    # --- lifecycle ----------------------------------------------------------

    async def wait_for_worker(self, timeout_s: float) -> WorkerInfo:
        """Poll the worker's readiness until SERVING, then read its Info."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                r = await self.health.Check(
                    health_pb2.HealthCheckRequest(service=WORKER_SERVICE), timeout=2.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return pb.info_from_pb(await self.worker.Info(worker_pb2.InfoRequest(), timeout=5.0))
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise errors.Unavailable(f"worker at {self.config.worker} not ready after {timeout_s:.0f}s")
            await asyncio.sleep(0.2)

    async def start(self, worker_timeout_s: float = 600.0) -> None:
        self.info = await self.wait_for_worker(worker_timeout_s)
        self.core = Scheduler(self.config, self.info)
        self.accepting = True
        self._task = asyncio.create_task(self._loop(), name="engine-loop")
        log.info("engine_started", worker=self.config.worker, model=self.info.model_name,
                 kv_blocks=self.info.num_kv_blocks, max_model_len=self.info.max_model_len,
                 num_speculative_tokens=self.core.num_spec,
                 verify_policy=self.core.verify_policy if self.core.num_spec else None)

    async def drain(self) -> None:
        """Stop admitting and wait until every request has finished."""
        self.accepting = False
        while self.core is not None and self.core.has_unfinished():
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        await self.channel.close()

    # --- requests -----------------------------------------------------------

    async def submit(self, request_id: str, prompt: list[int],
                     sampling: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its committed tokens until it finishes.
        Leaving the iterator early (client gone) aborts it and frees its blocks."""
        if self.core is None or not self.accepting:
            raise errors.Unavailable("scheduler is not accepting requests")
        try:
            self.core.add_request(request_id, prompt, sampling)
        except AdmissionError as e:
            raise errors.ResourceExhausted(str(e)) from e
        q: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = q
        self._wakeup.set()
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, _Failure):
                    finished = True
                    raise item.error
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> bool:
        """Abort now: blocks return to the pool at once. Idempotent."""
        if self.core is None:
            return False
        out = self.core.abort(request_id)
        if out is None:
            return False
        self._queue_release(request_id)
        q = self._streams.get(request_id)
        if q is not None:
            q.put_nowait(out)
        log.info("request_aborted", request_id=request_id)
        return True

    def load(self) -> dict:
        d = self.core.load() if self.core else {}
        d["num_preemptions"] = self.core.num_preemptions if self.core else 0
        d["accepting"] = self.accepting and self.core is not None
        return d

    # --- the loop -----------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            try:
                await self._iteration()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bug must fail requests, not hang them
                log.exception("engine_loop_error")
                self._fail_all(errors.Internal("scheduler engine error"))

    async def _iteration(self) -> None:
        """One step: release, schedule, run on the worker, commit, fan out.

        Async scheduling: step N+1 is planned and dispatched before step N's result
        is applied (the worker runs them in order: ``after_step_id``); the core
        reserves the optimistic positions of requests whose speculative step is in
        flight and corrects them when that result arrives."""
        await self._release_pending()
        plan = self.core.schedule()
        if plan is None and not self._inflight:
            self._wakeup.clear()
            await self._wakeup.wait()
            return
        if plan is not None:
            req = pb.step_to_pb(plan)
            if self._inflight:
                req.after_step_id = self._inflight[-1][0].step_id + 1
            task = asyncio.ensure_future(
                self.worker.Step(req, timeout=self.config.step_timeout_s))
            self._inflight.append((plan, task, time.monotonic()))
            self._last_dispatched = plan.step_id
        keep = 1 if (self.config.async_scheduling and plan is not None) else 0
        while len(self._inflight) > keep:
            done_plan, task, t0 = self._inflight.popleft()
            try:
                resp = await task
            except grpc.aio.AioRpcError as e:
                await self._cancel_inflight()
                await self._worker_failed(e)
                return
            self._apply(done_plan, resp, t0)

    def _apply(self, plan, resp, t0: float) -> None:
        outs = self.core.update_from_output(plan, pb.step_output_from_pb(resp))
        self.steps += 1
        if self.metrics is not None:
            for k, accepted, fallback, unverified in self.core.last_spec_events:
                self.metrics.record_spec_step(k, accepted, fallback, unverified)
        if self.on_step is not None:
            self.on_step(time.monotonic() - t0, plan, outs)
        self._maybe_log_progress()
        for o in outs:
            if o.finished:
                self._queue_release(o.request_id)
            q = self._streams.get(o.request_id)
            if q is not None:
                q.put_nowait(o)

    def _queue_release(self, request_id: str) -> None:
        """Release on the worker once every step dispatched so far has run (a step
        in flight may still name the request)."""
        self._to_release.append(request_id)
        if self._inflight:
            self._release_gate[request_id] = self._inflight[-1][0].step_id

    async def _cancel_inflight(self) -> None:
        while self._inflight:
            _, task, _ = self._inflight.popleft()
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, grpc.aio.AioRpcError):
                pass

    def _maybe_log_progress(self) -> None:
        fields = self._progress.fields(self.core, self.steps, time.monotonic())
        if fields is not None:
            log.info("progress", **fields)

    async def _release_pending(self) -> None:
        if not self._to_release:
            return
        running = {p.step_id for p, _, _ in self._inflight}
        ids = [r for r in self._to_release if self._release_gate.get(r) not in running]
        if not ids:
            return
        self._to_release = [r for r in self._to_release if r not in ids]
        for r in ids:
            self._release_gate.pop(r, None)
        try:
            await self.worker.Release(worker_pb2.ReleaseRequest(request_ids=ids), timeout=10.0)
        except grpc.aio.AioRpcError as e:
            log.warning("release_failed", error=e.code().name, request_ids=ids)

    async def _worker_failed(self, e: grpc.aio.AioRpcError) -> None:
        """A step failed. If the worker comes back, re-prefill everything
        (recompute, nothing committed is lost); otherwise fail the requests
        with UNAVAILABLE rather than hang."""
        log.error("step_failed", code=e.code().name, details=e.details())
        if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.CANCELLED):
            # The worker rejected the step: a bug, not a lost worker. Fail all.
            self._fail_all(errors.Internal(f"worker step failed: {e.details()}"))
            return
        self.core.reset_computed()
        try:
            info = await self.wait_for_worker(self.config.worker_retry_s)
        except errors.Unavailable as exc:
            self._fail_all(exc)
            return
        if info.model_id != self.info.model_id:
            self._fail_all(errors.Unavailable("worker came back with another model"))
            return
        log.info("worker_recovered", re_prefill=self.core.load().get("num_waiting"))

    def _fail_all(self, exc: errors.DSparkError) -> None:
        for _, task, _ in self._inflight:
            task.cancel()
        self._inflight.clear()
        for rid in list(self._streams):
            self.core.abort(rid)
            self._streams[rid].put_nowait(_Failure(exc))
        self.core.reset_computed()
