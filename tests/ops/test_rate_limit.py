"""shared/ratelimit.py and the Gate: without API keys one token bucket per
client address (gRPC peer, HTTP remote address), with keys one per key as
before; idle buckets are evicted and the table is bounded. Real gRPC and
HTTP servers on loopback, each with two distinct peers."""
from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import grpc
import pytest
from aiohttp.test_utils import TestServer

from dspark.router.http_api import OpenAIApi
from dspark.shared.metrics import RouterMetrics
from dspark.shared.ratelimit import client_address, grpc_peer_address
from dspark.shared.security import ApiKeys, AuthInterceptor, Gate, RateLimited, RateLimiter
from dspark.v1 import router_pb2, router_pb2_grpc

from .test_http_api_unit import BODY, FakeRouter

KEY = "sk-rate-0123456789abcdef"


@pytest.mark.parametrize("peer,address", [
    ("ipv4:10.1.2.3:50123", "10.1.2.3"),
    ("ipv6:[2001:db8::7]:50123", "2001:db8::7"),
    ("ipv6:%5B::1%5D:50123", "::1"),  # URI-escaped, as some gRPC versions write it
    ("ipv6:[::ffff:10.1.2.3]:50123", "10.1.2.3"),  # dual-stack: the same client as IPv4
    ("unix:/run/dspark.sock", "unix:/run/dspark.sock"),
    ("", ""), (None, ""),
])
def test_grpc_peer_address(peer, address):
    assert grpc_peer_address(peer) == address


def test_client_address_is_one_spelling_per_ip():
    assert client_address("::ffff:127.0.0.1") == "127.0.0.1"
    assert client_address("2001:db8:0:0::1") == "2001:db8::1"
    assert client_address(None) == "" and client_address("host.local") == "host.local"


def test_without_keys_each_peer_has_its_own_bucket():
    gate = Gate(None, RateLimiter(rate=0.5, burst=2))
    assert [gate.admit(None, peer="10.0.0.1") for _ in range(2)] == ["anonymous"] * 2
    with pytest.raises(RateLimited, match=r"at most 0.5 requests/s per client address "
                                          r"\(rate_limit_rps\); retry in") as e:
        gate.admit(None, peer="10.0.0.1")
    assert e.value.retry_after > 0
    assert [gate.admit(None, peer="10.0.0.2") for _ in range(2)] == ["anonymous"] * 2
    assert gate.admit(None, peer="10.0.0.1", limited=False) == "anonymous"  # e.g. /v1/models
    with pytest.raises(RateLimited):
        gate.admit(None, peer="10.0.0.1")  # still empty


def test_with_keys_the_bucket_is_the_key_whatever_the_peer(tmp_path):
    p = tmp_path / "keys"
    p.write_text(f"alice {KEY}\n")
    gate = Gate(ApiKeys.from_file(str(p)), RateLimiter(rate=0.5, burst=1))
    assert gate.admit(KEY, peer="10.0.0.1") == "alice"
    with pytest.raises(RateLimited, match="at most 0.5 requests/s per API key"):
        gate.admit(KEY, peer="10.0.0.2")  # another address, the same key: the same bucket


def test_idle_buckets_are_evicted_and_busy_ones_kept():
    rl = RateLimiter(rate=1.0, burst=2, sweep_every_s=10.0)
    for i in range(100):
        assert rl.acquire(f"peer:10.0.0.{i}", now=0.0) == 0.0  # full again at t=1
    assert [rl.acquire("peer:busy", now=9.5) for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]
    assert len(rl) == 101
    assert rl.acquire("peer:new", now=10.0) == 0.0  # the sweep is due: idle buckets go
    assert len(rl) == 2  # busy (full again at 11.5) and new
    assert rl.acquire("peer:busy", now=10.0) == pytest.approx(0.5)  # kept its state
    assert rl.acquire("peer:10.0.0.1", now=10.0) == 0.0  # evicted = a full bucket


def test_the_table_is_bounded_least_recently_used_first():
    rl = RateLimiter(rate=1.0, burst=1, max_buckets=3)
    for name in ("a", "b", "c"):
        assert rl.acquire(name, now=0.0) == 0.0
    assert rl.acquire("a", now=0.5) == pytest.approx(0.5)  # a is now the most recent
    assert rl.acquire("d", now=0.5) == 0.0  # b, the least recently used, goes
    assert len(rl) == 3
    assert rl.acquire("b", now=0.5) == 0.0  # a fresh bucket (c goes now)
    assert rl.acquire("a", now=0.5) > 0 and rl.acquire("d", now=0.5) > 0
    with pytest.raises(ValueError, match="max_buckets=0 is invalid"):
        RateLimiter(1.0, max_buckets=0)


# -- gRPC: the peer of the call ------------------------------------------------


class Echo(router_pb2_grpc.RouterServicer):
    async def Generate(self, request, context):
        yield router_pb2.GenerateResponse(request_id="r", text="ok")


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("second", ["unix", "ipv6"])
def test_grpc_buckets_per_peer(tmp_path, second):
    """Peer A (127.0.0.1) spends its burst of 2 and is refused with
    RESOURCE_EXHAUSTED naming the limit; peer B (a unix socket, or ::1) is not."""
    if second == "ipv6" and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    rejected = []

    async def main():
        gate = Gate(None, RateLimiter(rate=0.01, burst=2))
        server = grpc.aio.server(interceptors=[AuthInterceptor(gate, on_reject=rejected.append)])
        router_pb2_grpc.add_RouterServicer_to_server(Echo(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        b = f"unix:{tmp_path}/router.sock"
        if second == "ipv6":
            b = f"[::1]:{server.add_insecure_port('[::1]:0')}"
        else:
            server.add_insecure_port(b)
        await server.start()

        async def generate(addr):
            async with grpc.aio.insecure_channel(addr) as ch:
                call = router_pb2_grpc.RouterStub(ch).Generate(
                    router_pb2.GenerateRequest(prompt="hi"), timeout=10)
                return [r.text async for r in call]

        try:
            a = f"127.0.0.1:{port}"
            assert [await generate(a) for _ in range(2)] == [["ok"], ["ok"]]
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await generate(a)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "at most 0.01 requests/s per client address (rate_limit_rps)" \
                in e.value.details()
            assert [await generate(b) for _ in range(2)] == [["ok"], ["ok"]]  # its own bucket
            with pytest.raises(grpc.aio.AioRpcError):
                await generate(a)
            assert len(gate.limiter) == 2
        finally:
            await server.stop(0)

    asyncio.run(main())
    assert rejected == ["rate_limited", "rate_limited"]


# -- HTTP: the remote address of the connection ---------------------------------


def test_http_buckets_per_remote_address():
    """Two clients, 127.0.0.1 and 127.0.0.2 (both loopback on Linux): the
    first is refused with 429 after its burst, the second still served."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
    except OSError:
        pytest.skip("127.0.0.2 is not a local address here")

    async def main():
        api = OpenAIApi(FakeRouter(), Gate(None, RateLimiter(0.01, 2)), RouterMetrics())
        async with TestServer(api.app, host="127.0.0.1") as server:
            url = str(server.make_url("/v1/completions"))

            async def post(local: str):
                conn = aiohttp.TCPConnector(local_addr=(local, 0))
                async with aiohttp.ClientSession(connector=conn) as s:
                    async with s.post(url, data=json.dumps(BODY),
                                      headers={"Content-Type": "application/json"}) as r:
                        return r.status, await r.json(), r.headers

            a = [await post("127.0.0.1") for _ in range(3)]
            b = [await post("127.0.0.2") for _ in range(2)]
            return a, b

    a, b = asyncio.run(main())
    assert [s for s, _, _ in a] == [200, 200, 429]
    status, body, headers = a[2]
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert "at most 0.01 requests/s per client address (rate_limit_rps)" \
        in body["error"]["message"]
    assert int(headers["Retry-After"]) >= 1
    assert [s for s, _, _ in b] == [200, 200]
