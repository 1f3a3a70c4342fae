"""The router servicer over real gRPC against fake schedulers: streaming and
text deltas, retry on another replica before the first token (full or lost),
RESOURCE_EXHAUSTED when every replica is full, stop strings cancel the
scheduler's stream, client cancellation reaches the scheduler."""
from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from dspark.router.servicer import RouterServicer
from dspark.shared import errors
from dspark.shared.client_async import AsyncClient
from dspark.shared.config import RouterConfig
from dspark.shared.service import Service
from dspark.v1 import router_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Streams the given token ids one per message; or refuses with `refuse`."""

    def __init__(self, tokens: list[int], refuse: grpc.StatusCode | None = None,
                 delay_s: float = 0.0):
        self.tokens, self.refuse, self.delay_s = tokens, refuse, delay_s
        self.submitted: list[str] = []
        self.cancelled: list[str] = []

    async def Submit(self, request, context):
        self.submitted.append(request.request_id)
        if self.refuse is not None:
            await context.abort(self.refuse, "full" if self.refuse.name == "RESOURCE_EXHAUSTED"
                                else "down")
        try:
            for i, t in enumerate(self.tokens):
                await asyncio.sleep(self.delay_s)
                last = i == len(self.tokens) - 1
                yield scheduler_pb2.SubmitResponse(token_ids=[t], finish_reason=2 if last else 0)
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise

    async def GetLoad(self, request, context):
        return scheduler_pb2.GetLoadResponse(model_name="tiny", max_model_len=256,
                                             accepting=True, total_kv_blocks=8, free_kv_blocks=8)


async def start(fakes, tok, **cfg):
    servers, addrs = [], []
    for f in fakes:
        port = free_port()
        svc = Service("dspark.v1.Scheduler", "127.0.0.1", port)
        svc.add(scheduler_pb2_grpc.add_SchedulerServicer_to_server, f, ["dspark.v1.Scheduler"])
        await svc.start()
        servers.append(svc)
        addrs.append(svc.address)
    rport = free_port()
    config = RouterConfig(schedulers=tuple(addrs), port=rport, **cfg)
    rsvc = Service("dspark.v1.Router", "127.0.0.1", rport)
    servicer = RouterServicer(config, tok)
    rsvc.add(router_pb2_grpc.add_RouterServicer_to_server, servicer, ["dspark.v1.Router"])
    await rsvc.start()
    await servicer.poll_once()
    return servicer, rsvc, servers


async def stop(rsvc, servers):
    await rsvc.server.stop(0)
    for s in servers:
        await s.server.stop(0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_streams_text_deltas(tok):
    ids = tok.encode("hello world")

    async def main():
        fake = FakeScheduler(ids)
        servicer, rsvc, servers = await start([fake], tok)
        async with AsyncClient(rsvc.address) as c:
            chunks = [ch async for ch in c.stream(prompt="hi", max_tokens=20)]
        await stop(rsvc, servers)
        return chunks

    chunks = run(main())
    assert "".join(ch.text for ch in chunks) == "hello world"
    assert [t for ch in chunks for t in ch.token_ids] == ids
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == len(ids)


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE])
def test_refused_before_first_token_is_retried_on_another_replica(tok, code):
    ids = tok.encode("hello")

    async def main():
        bad, good = FakeScheduler(ids, refuse=code), FakeScheduler(ids)
        servicer, rsvc, servers = await start([bad, good], tok)
        # Make the refusing replica the first pick (less outstanding load).
        servicer.replicas.add_outstanding(servers[1].address, 1000)
        async with AsyncClient(rsvc.address) as c:
            out = await c.generate(prompt="hi", max_tokens=10)
        still_picked = servicer.replicas.get(servers[0].address).healthy
        await stop(rsvc, servers)
        return out, bad, good, still_picked

    out, bad, good, healthy = run(main())
    assert out.text == "hello" and len(bad.submitted) == 1 and len(good.submitted) == 1
    # A full replica stays in rotation; an unreachable one leaves it.
    assert healthy == (code == grpc.StatusCode.RESOURCE_EXHAUSTED)


def test_every_replica_full_is_resource_exhausted(tok):
    async def main():
        fakes = [FakeScheduler([5], refuse=grpc.StatusCode.RESOURCE_EXHAUSTED) for _ in range(2)]
        servicer, rsvc, servers = await start(fakes, tok)
        try:
            async with AsyncClient(rsvc.address) as c:
                with pytest.raises(errors.ResourceExhausted):
                    await c.generate(prompt="hi", max_tokens=10)
        finally:
            await stop(rsvc, servers)
        return fakes

    fakes = run(main())
    assert all(len(f.submitted) == 1 for f in fakes)


def test_stop_string_ends_request_and_cancels_scheduler_stream(tok):
    ids = tok.encode("hello STOP the end world world world")

    async def main():
        fake = FakeScheduler(ids, delay_s=0.01)
        servicer, rsvc, servers = await start([fake], tok)
        async with AsyncClient(rsvc.address) as c:
            out = await c.generate(prompt="hi", max_tokens=50, stop=[" STOP"])
        await asyncio.sleep(0.2)
        await stop(rsvc, servers)
        return out, fake

    out, fake = run(main())
    assert out.text == "hello" and out.finish_reason == "stop"
    assert fake.cancelled == fake.submitted  # the scheduler was told to stop


def test_client_cancel_reaches_scheduler(tok):
    ids = tok.encode("hello world " * 20)

    async def main():
        fake = FakeScheduler(ids, delay_s=0.02)
        servicer, rsvc, servers = await start([fake], tok)
        async with AsyncClient(rsvc.address) as c:
            async for _ in c.stream(prompt="hi", max_tokens=100):
                break
        await asyncio.sleep(0.3)
        running = dict(servicer._running)
        await stop(rsvc, servers)
        return fake, running

    fake, running = run(main())
    assert fake.cancelled == fake.submitted and running == {}


def test_unknown_model_and_no_replica(tok):
    async def main():
        fake = FakeScheduler([5])
        servicer, rsvc, servers = await start([fake], tok)
        async with AsyncClient(rsvc.address) as c:
            with pytest.raises(errors.InvalidArgument, match="model"):
                await c.generate(prompt="hi", model="other")
            assert [m.name for m in await c.list_models()] == ["tiny"]
            await servers[0].server.stop(0)
            await servicer.poll_once()
            with pytest.raises(errors.Unavailable):
                await c.generate(prompt="hi")
        await stop(rsvc, servers)

    run(main())
