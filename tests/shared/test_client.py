"""The client SDK against an in-process gRPC server with a fake Router servicer."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures

import grpc
import pytest

from dspark.shared.client import AsyncClient, Chunk, Client, Completion, ModelInfo, Usage
from dspark.shared.errors import (Cancelled, DeadlineExceeded, DSparkError, Internal,
                                  InvalidArgument, NotFound, ResourceExhausted, Unavailable,
                                  from_grpc_error)
from dspark.v1 import common_pb2, router_pb2, router_pb2_grpc

DELTAS = [("Hel", [1, 2]), ("lo", [3]), (" 中", [4, 5]), ("!", [6])]


class FakeRouter(router_pb2_grpc.RouterServicer):
    """Streams DELTAS; magic prompts: "bad", "full", "slow", "forever", "nofinish"."""

    def __init__(self) -> None:
        self.requests: list[router_pb2.GenerateRequest] = []
        self.cancelled = threading.Event()

    def Generate(self, request, context):
        self.requests.append(request)
        prompt = request.prompt
        if prompt == "bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt: bad prompt")
        if prompt == "full":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
        finished = threading.Event()
        context.add_callback(lambda: None if finished.is_set() else self.cancelled.set())
        rid = request.request_id or "gen-1"
        if prompt == "slow":
            deadline = time.monotonic() + 5
            while context.is_active() and time.monotonic() < deadline:
                time.sleep(0.02)
            return
        if prompt == "forever":
            for i in range(500):
                yield router_pb2.GenerateResponse(request_id=rid, text=f"{i} ", token_ids=[i])
                time.sleep(0.01)
            return
        for text, ids in DELTAS:
            yield router_pb2.GenerateResponse(request_id=rid, text=text, token_ids=ids)
        finished.set()
        if prompt == "nofinish":
            return
        reason = (common_pb2.FINISH_REASON_LENGTH if request.sampling.HasField("max_tokens")
                  else common_pb2.FINISH_REASON_STOP)
        yield router_pb2.GenerateResponse(
            request_id=rid, finish_reason=reason,
            usage=common_pb2.Usage(prompt_tokens=3, completion_tokens=6))

    def Abort(self, request, context):
        return router_pb2.AbortResponse(found=request.request_id == "known")

    def ListModels(self, request, context):
        return router_pb2.ListModelsResponse(models=[router_pb2.ModelCard(
            name="tiny", max_model_len=2048, num_replicas=2)])


@pytest.fixture(scope="module")
def server():
    fake = FakeRouter()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    router_pb2_grpc.add_RouterServicer_to_server(fake, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield fake, f"127.0.0.1:{port}"
    srv.stop(grace=None)


@pytest.fixture
def fake(server):
    fake, _ = server
    fake.cancelled.clear()
    fake.requests.clear()
    return fake


@pytest.fixture
def client(server):
    with Client(server[1], timeout=10) as c:
        yield c


def test_stream_sync(client, fake):
    chunks = list(client.stream(prompt="hi", request_id="r1"))
    assert [c.text for c in chunks[:-1]] == [d[0] for d in DELTAS]
    assert chunks[0] == Chunk("Hel", (1, 2), None, None, "r1")
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage == Usage(3, 6) and chunks[-1].usage.total_tokens == 9


def test_generate_aggregates_and_sends_params(client, fake):
    out = client.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                          temperature=0.5, top_k=3, seed=7, stop="END", model="tiny")
    assert out == Completion("Hello 中!", (1, 2, 3, 4, 5, 6), "length", Usage(3, 6), "gen-1")
    req = fake.requests[-1]
    assert req.WhichOneof("input") == "chat"
    assert [(m.role, m.content) for m in req.chat.messages] == [("user", "Hi")]
    sp = req.sampling
    assert (sp.max_tokens, sp.temperature, sp.top_k, sp.seed, list(sp.stop)) == \
        (5, 0.5, 3, 7, ["END"])
    assert not sp.HasField("top_p")  # unset -> server default
    assert req.model == "tiny"


def test_typed_errors(client, fake):
    with pytest.raises(InvalidArgument) as e:
        client.generate(prompt="bad")
    assert e.value.field == "prompt" and "bad prompt" in str(e.value)
    assert not isinstance(e.value, grpc.RpcError)
    with pytest.raises(ResourceExhausted, match="queue full"):
        list(client.stream(prompt="full"))
    with pytest.raises(Internal, match="without a finish reason"):
        client.generate(prompt="nofinish")
    with pytest.raises(ValueError):
        client.generate()


def test_unavailable_server():
    with Client("127.0.0.1:1", timeout=5) as c, pytest.raises(Unavailable):
        c.list_models()


def test_deadline(client, fake):
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        client.generate(prompt="slow", timeout=0.3)
    assert time.monotonic() - t0 < 3
    assert fake.cancelled.wait(3)  # the server saw the RPC end early


def test_break_cancels_rpc(client, fake):
    for chunk in client.stream(prompt="forever"):
        assert chunk.text == "0 "
        break
    assert fake.cancelled.wait(3)


def test_explicit_cancel(client, fake):
    s = client.stream(prompt="forever")
    assert next(s).text == "0 "
    s.cancel()
    assert list(s) == []  # iteration just ends
    assert fake.cancelled.wait(3)


def test_abort_and_list_models(client, fake):
    assert client.abort("known") is True
    assert client.abort("nope") is False
    assert client.list_models() == [ModelInfo("tiny", 2048, 2)]


def test_async_stream_generate_errors(server, fake):
    async def main():
        async with AsyncClient(server[1], timeout=10) as c:
            chunks = [ch async for ch in c.stream(prompt="hi")]
            assert "".join(ch.text for ch in chunks) == "Hello 中!"
            assert chunks[-1].finish_reason == "stop"
            out = await c.generate(prompt="hi", max_tokens=4)
            assert out.text == "Hello 中!" and out.finish_reason == "length"
            with pytest.raises(InvalidArgument):
                await c.generate(prompt="bad")
            with pytest.raises(DeadlineExceeded):
                await c.generate(prompt="slow", timeout=0.3)
            assert await c.abort("known") is True
            assert (await c.list_models())[0].name == "tiny"

    asyncio.run(main())


def test_async_task_cancellation_reaches_server(server, fake):
    async def main():
        async with AsyncClient(server[1]) as c:
            first = asyncio.Event()

            async def consume():
                async for _ in c.stream(prompt="forever"):
                    first.set()

            task = asyncio.create_task(consume())
            await asyncio.wait_for(first.wait(), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert fake.cancelled.wait(3)


def test_async_break_and_cancel(server, fake):
    async def main():
        async with AsyncClient(server[1]) as c:
            s = c.stream(prompt="forever")
            async for _ in s:
                break
            s.cancel()
            assert [x async for x in s] == []

    asyncio.run(main())
    assert fake.cancelled.wait(3)


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code,cls", [
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
    (grpc.StatusCode.NOT_FOUND, NotFound),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted),
    (grpc.StatusCode.UNAVAILABLE, Unavailable),
    (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
    (grpc.StatusCode.CANCELLED, Cancelled),
    (grpc.StatusCode.INTERNAL, Internal),
    (grpc.StatusCode.UNKNOWN, Internal),
])
def test_from_grpc_error_mapping(code, cls):
    err = from_grpc_error(_FakeRpcError(code, "boom"))
    assert type(err) is cls and isinstance(err, DSparkError)
    assert "boom" in str(err)
    assert cls.GRPC_CODE == code.name or code == grpc.StatusCode.UNKNOWN
