"""The public gRPC API: validate, tokenize, pick a scheduler replica, stream
detokenized text back. Stateless apart from in-flight bookkeeping."""
from __future__ import annotations

import asyncio
import uuid

import grpc
import structlog

from dspark.router.detokenizer import IncrementalDetokenizer
from dspark.router.replicas import ReplicaSet
from dspark.router.tokenizer import Tokenizer
from dspark.router.validation import GenerateInput, validate_request
from dspark.shared import errors, pb
from dspark.shared.config import RouterConfig
from dspark.shared.logging import REQUEST_ID_KEY, get_logger
from dspark.shared.security import aio_channel, upstream_tls
from dspark.shared.service import GRPC_OPTIONS
from dspark.shared.types import FinishReason
from dspark.v1 import (
    common_pb2,
    router_pb2,
    router_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)

SERVICE_NAME = "dspark.v1.Router"
log = get_logger(component="router")
MAX_DISPATCH_ATTEMPTS = 3


def input_from_pb(m: router_pb2.GenerateRequest) -> GenerateInput:
    """GenerateRequest -> GenerateInput (unset optionals stay None)."""
    s = m.sampling
    which = m.WhichOneof("input")
    return GenerateInput(
        prompt=m.prompt if which == "prompt" else None,
        messages=[(x.role, x.content) for x in m.chat.messages] if which == "chat" else None,
        model=m.model,
        request_id=m.request_id,
        temperature=s.temperature if s.HasField("temperature") else None,
        top_p=s.top_p if s.HasField("top_p") else None,
        top_k=s.top_k if s.HasField("top_k") else None,
        seed=s.seed if s.HasField("seed") else None,
        max_tokens=s.max_tokens if s.HasField("max_tokens") else None,
        stop=tuple(s.stop),
        stop_token_ids=tuple(s.stop_token_ids),
        ignore_eos=s.ignore_eos if s.HasField("ignore_eos") else None,
    )


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, config: RouterConfig, tokenizer: Tokenizer):
        self.config = config
        self.tok = tokenizer
        self.replicas = ReplicaSet(config.schedulers)
        tls = upstream_tls(config)
        self._channels = {a: aio_channel(a, tls, options=GRPC_OPTIONS)
                          for a in config.schedulers}
        self._stubs = {a: scheduler_pb2_grpc.SchedulerStub(c) for a, c in self._channels.items()}
        self._loads: dict[str, scheduler_pb2.GetLoadResponse] = {}
        self._running: dict[str, str] = {}  # request id -> replica address
        self.draining = False  # after SIGTERM: no new requests

    # --- replica state ------------------------------------------------------

    async def poll_once(self) -> None:
        async def one(addr: str):
            try:
                load = await self._stubs[addr].GetLoad(scheduler_pb2.GetLoadRequest(), timeout=2.0)
            except grpc.aio.AioRpcError:
                self._loads.pop(addr, None)
                self.replicas.mark_unhealthy(addr)
                return
            self._loads[addr] = load
            self.replicas.update_load(addr, {
                "accepting": load.accepting, "num_waiting": load.num_waiting,
                "num_running": load.num_running, "outstanding_tokens": load.outstanding_tokens,
                "free_kv_blocks": load.free_kv_blocks, "total_kv_blocks": load.total_kv_blocks,
                "model_name": load.model_name, "max_model_len": load.max_model_len})

        await asyncio.gather(*(one(a) for a in self._stubs))

    def served_models(self) -> list[str]:
        names = sorted({ld.model_name for ld in self._loads.values() if ld.accepting})
        if self.config.model_name:
            return [self.config.model_name] if names else []
        return names

    def max_model_len(self) -> int:
        lens = [ld.max_model_len for ld in self._loads.values() if ld.accepting]
        return min(lens) if lens else 0

    @property
    def ready(self) -> bool:
        return bool(self.served_models())

    # --- RPCs ---------------------------------------------------------------

    async def ListModels(self, request, context):
        cards = []
        for name in self.served_models():
            n = sum(1 for ld in self._loads.values() if ld.accepting)
            cards.append(router_pb2.ModelCard(name=name, max_model_len=self.max_model_len(),
                                              num_replicas=n))
        return router_pb2.ListModelsResponse(models=cards)

    async def Abort(self, request, context):
        addr = self._running.get(request.request_id)
        if addr is None:
            return router_pb2.AbortResponse(found=False)
        r = await self._stubs[addr].Abort(
            scheduler_pb2.SchedulerAbortRequest(request_id=request.request_id), timeout=5.0)
        return router_pb2.AbortResponse(found=r.found)

    async def Generate(self, request, context):
        rid = request.request_id or uuid.uuid4().hex
        structlog.contextvars.bind_contextvars(request_id=rid)
        if rid in self._running:
            raise errors.InvalidArgument("request_id", f"{rid!r} is already running")
        if self.draining:
            raise errors.Unavailable("router is draining (shutting down); retry on another router")
        if not self.ready:
            raise errors.Unavailable("no scheduler replica is ready")
        v = validate_request(input_from_pb(request), self.tok, self.config,
                             self.max_model_len(), self.served_models())
        stop_ids = list(v.sampling.stop_token_ids)
        if not v.sampling.ignore_eos:
            stop_ids += list(self.tok.eos_token_ids)
        detok = IncrementalDetokenizer(self.tok, prompt_ids_tail=v.prompt_token_ids,
                                       stop=v.sampling.stop, stop_token_ids=stop_ids)
        log.info("request_accepted", prompt_tokens=v.num_prompt_tokens,
                 max_tokens=v.sampling.max_tokens, temperature=v.sampling.temperature)
        submit = scheduler_pb2.SubmitRequest(
            request_id=rid, prompt_token_ids=v.prompt_token_ids,
            sampling=pb.sampling_to_pb(v.sampling),
            return_spec_summary=request.return_spec_summary)
        self._running[rid] = ""
        try:
            async for resp in self._dispatch(rid, submit, v, detok):
                yield resp
        finally:
            self._running.pop(rid, None)

    async def _dispatch(self, rid, submit, v, detok):
        """Send to the least-loaded replica; retry elsewhere while nothing has
        been streamed yet; translate token batches to text deltas."""
        tried: set[str] = set()
        n_out = 0
        last_err: errors.DSparkError | None = None
        for attempt in range(MAX_DISPATCH_ATTEMPTS):
            try:
                res = self.replicas.reserve(v.num_prompt_tokens, v.sampling.max_tokens,
                                            exclude=tried)
            except errors.NoReplicaAvailable:
                if last_err is not None:  # every replica tried: report why the last refused
                    raise last_err from None
                raise
            addr = res.address
            tried.add(addr)
            self._running[rid] = addr
            call = self._stubs[addr].Submit(submit, metadata=((REQUEST_ID_KEY, rid),))
            try:
                async for r in call:
                    n_out += len(r.token_ids)
                    res.on_tokens(len(r.token_ids))
                    text, stopped = detok.add(r.token_ids)
                    finish = FinishReason(r.finish_reason)
                    if stopped and finish == FinishReason.NONE:
                        finish = FinishReason.STOP  # stop string: end it here
                    if finish != FinishReason.NONE:
                        text += detok.flush()
                        final = self._final(rid, text, r.token_ids, finish, v, n_out)
                        if r.HasField("spec_summary"):
                            final.spec_summary.CopyFrom(r.spec_summary)
                        yield final
                        log.info("request_finished", reason=finish.name, output_tokens=n_out,
                                 replica=addr)
                        return
                    if text or r.token_ids:
                        yield router_pb2.GenerateResponse(request_id=rid, text=text,
                                                          token_ids=r.token_ids)
                raise errors.Unavailable(f"scheduler {addr} closed the stream without finishing")
            except grpc.aio.AioRpcError as e:
                err = errors.from_grpc_error(e)
                retry = (n_out == 0 and attempt + 1 < MAX_DISPATCH_ATTEMPTS
                         and isinstance(err, (errors.Unavailable, errors.ResourceExhausted)))
                if not retry:
                    raise err from None
                # Nothing streamed yet: another replica may take it (a full
                # replica stays healthy; a lost one leaves the rotation).
                last_err = err
                log.warning("replica_refused_retrying", replica=addr, error=str(err))
                if isinstance(err, errors.Unavailable):
                    self.replicas.mark_unhealthy(addr, str(err))
            finally:
                call.cancel()  # no-op when done; aborts the request when we leave early
                res.finish()
        raise last_err or errors.Unavailable("no scheduler replica could take the request")

    def _final(self, rid, text, token_ids, finish, v, n_out):
        return router_pb2.GenerateResponse(
            request_id=rid, text=text, token_ids=token_ids, finish_reason=int(finish),
            usage=common_pb2.Usage(prompt_tokens=v.num_prompt_tokens, completion_tokens=n_out))


async def serve(config: RouterConfig) -> None:
    """Run the router (gRPC API, and the HTTP API and metrics when configured)."""
    from dspark.router.app import serve as serve_app

    await serve_app(config)
