"""The scheduler's engine loop against a fake worker over real gRPC: tokens
stream, aborts and disconnects free blocks, a lost worker is retried by
re-prefill when it comes back and fails requests with UNAVAILABLE when it
does not (never hangs)."""
from __future__ import annotations

import asyncio
import socket

import pytest

from dspark.scheduler.engine import Engine
from dspark.shared import errors, pb
from dspark.shared.config import SchedulerConfig
from dspark.shared.service import Service
from dspark.shared.types import FinishReason, SamplingParams, WorkerInfo
from dspark.v1 import worker_pb2, worker_pb2_grpc

INFO = WorkerInfo("fake", "fake-id", 1000, 8, 2, num_kv_blocks=32, block_size=4,
                  max_model_len=128, eos_token_ids=(2,), dtype="float32", device="cpu")


def token_at(position: int) -> int:
    """The fake model's deterministic next token for a position."""
    return 10 + position % 50


class FakeWorker(worker_pb2_grpc.WorkerServicer):
    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.steps = 0
        self.released: list[str] = []
        self.last: dict[str, tuple[int, int]] = {}  # request -> (sampled token, position)

    async def Info(self, request, context):
        return pb.info_to_pb(INFO)

    async def Step(self, request, context):
        self.steps += 1
        await asyncio.sleep(self.delay_s)
        outs = []
        for s in request.seqs:
            start, n = s.start_position, len(s.token_ids)
            anchor = {}
            if s.deferred_anchor:  # async: the anchor is this worker's own last sample
                tok, start = self.last[s.request_id]
                n = 1
                anchor = dict(anchor_token=tok, anchor_position=start)
            end = start + n
            assert len(s.block_ids) * INFO.block_size >= end
            if s.sample:
                self.last[s.request_id] = (token_at(end), end)
            outs.append(worker_pb2.SeqOutput(request_id=s.request_id,
                                             token_id=token_at(end) if s.sample else -1,
                                             **anchor))
        return worker_pb2.StepResponse(step_id=request.step_id, outputs=outs)

    async def Release(self, request, context):
        self.released += list(request.request_ids)
        return worker_pb2.ReleaseResponse()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_worker(port: int, fake: FakeWorker) -> Service:
    svc = Service("dspark.v1.Worker", "127.0.0.1", port)
    svc.add(worker_pb2_grpc.add_WorkerServicer_to_server, fake, ["dspark.v1.Worker"])
    await svc.start()
    await svc.set_ready(True)
    return svc


async def collect(engine, rid, prompt, max_tokens):
    toks, reason = [], None
    async for out in engine.submit(rid, prompt, SamplingParams(max_tokens=max_tokens)):
        toks += out.new_token_ids
        reason = out.finish_reason
    return toks, reason


def expected(prompt_len: int, n: int) -> list[int]:
    return [token_at(prompt_len + i) for i in range(n)]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def make_engine(port: int, **kw) -> Engine:
    return Engine(SchedulerConfig(worker=f"127.0.0.1:{port}", max_num_batched_tokens=8, **kw))


def test_concurrent_requests_stream_and_free_blocks():
    async def main():
        port = free_port()
        fake = FakeWorker()
        w = await start_worker(port, fake)
        eng = make_engine(port)
        await eng.start(worker_timeout_s=10)
        results = await asyncio.gather(
            collect(eng, "a", [1] * 5, 7), collect(eng, "b", [1] * 11, 3), collect(eng, "c", [1] * 2, 9))
        assert results[0] == (expected(5, 7), FinishReason.LENGTH)
        assert results[1] == (expected(11, 3), FinishReason.LENGTH)
        assert results[2] == (expected(2, 9), FinishReason.LENGTH)
        await asyncio.sleep(0.05)
        load = eng.load()
        assert load["free_kv_blocks"] == load["total_kv_blocks"] == 32
        await eng._release_pending()
        assert sorted(fake.released) == ["a", "b", "c"]
        await eng.close()
        await w.server.stop(0)

    run(main())


def test_abort_and_disconnect_free_blocks_at_once():
    async def main():
        port = free_port()
        w = await start_worker(port, FakeWorker(delay_s=0.01))
        eng = make_engine(port)
        await eng.start(worker_timeout_s=10)
        gen = eng.submit("gone", [1] * 6, SamplingParams(max_tokens=100, ignore_eos=True))
        await gen.__anext__()  # first token: blocks are held
        assert eng.load()["free_kv_blocks"] < 32
        await gen.aclose()  # the consumer disappears (client disconnect)
        assert eng.load()["free_kv_blocks"] == 32

        task = asyncio.create_task(collect(eng, "ab", [1] * 6, 100))
        await asyncio.sleep(0.1)
        assert eng.abort("ab") is True
        toks, reason = await task
        assert reason == FinishReason.ABORT and 0 < len(toks) < 100
        assert eng.load()["free_kv_blocks"] == 32
        assert eng.abort("ab") is False
        await eng.close()
        await w.server.stop(0)

    run(main())


def test_queue_full_is_resource_exhausted():
    async def main():
        port = free_port()
        w = await start_worker(port, FakeWorker(delay_s=0.05))
        eng = make_engine(port, max_waiting=1, max_num_seqs=1)
        await eng.start(worker_timeout_s=10)
        t1 = asyncio.create_task(collect(eng, "r1", [1] * 3, 20))
        await asyncio.sleep(0.1)  # r1 running
        t2 = asyncio.create_task(collect(eng, "r2", [1] * 3, 2))  # waits
        await asyncio.sleep(0.01)
        with pytest.raises(errors.ResourceExhausted):
            await collect(eng, "r3", [1] * 3, 2)
        assert (await t1)[1] == FinishReason.LENGTH and (await t2)[1] == FinishReason.LENGTH
        await eng.close()
        await w.server.stop(0)

    run(main())


def test_lost_worker_fails_requests_with_unavailable():
    async def main():
        port = free_port()
        w = await start_worker(port, FakeWorker(delay_s=0.02))
        eng = make_engine(port, worker_retry_s=1.0)
        await eng.start(worker_timeout_s=10)
        task = asyncio.create_task(collect(eng, "x", [1] * 4, 200))
        await asyncio.sleep(0.2)
        await w.server.stop(0)
        with pytest.raises(errors.Unavailable):
            await task
        assert eng.load()["free_kv_blocks"] == 32
        await eng.close()

    run(main())


def test_restarted_worker_resumes_by_re_prefill_with_same_output():
    async def main():
        port = free_port()
        w = await start_worker(port, FakeWorker(delay_s=0.02))
        eng = make_engine(port, worker_retry_s=10.0)
        await eng.start(worker_timeout_s=10)
        task = asyncio.create_task(collect(eng, "y", [1] * 4, 40))
        await asyncio.sleep(0.3)
        await w.server.stop(0)
        await asyncio.sleep(0.3)
        fresh = FakeWorker()
        w2 = await start_worker(port, fresh)
        toks, reason = await task
        assert (toks, reason) == (expected(4, 40), FinishReason.LENGTH)
        assert fresh.steps > 0  # the rest ran on the restarted worker
        await eng.close()
        await w2.server.stop(0)

    run(main())
