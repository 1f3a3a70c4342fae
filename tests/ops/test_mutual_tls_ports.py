"""Every port follows the service's TLS settings: the --metrics-port server
(shared/metrics_server.py) is plain, TLS only, or mutual with
--tls-client-ca (a scrape without a client certificate that CA signed is
refused), through ``Service`` too; the router's HTTP API is mutual under
--tls-client-ca as well (README "Security")."""
from __future__ import annotations

import asyncio
import socket
import ssl
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dspark.router.http_api import OpenAIApi
from dspark.shared.metrics import RouterMetrics, WorkerMetrics
from dspark.shared.metrics_server import start_metrics_server
from dspark.shared.security import ClientTLS, Gate, RateLimiter, ServerTLS, aio_channel
from dspark.shared.service import Service

from .certs import make_pki
from .test_http_api_unit import FakeRouter


def scrape(url: str, ctx: ssl.SSLContext | None = None) -> str:
    with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_plain_http_without_tls_settings():
    srv = start_metrics_server(WorkerMetrics(), "127.0.0.1", 0)
    try:
        assert "dspark_worker_ready 0.0" in scrape(f"http://127.0.0.1:{srv.port}/metrics")
    finally:
        srv.stop()


def test_tls_only_needs_no_client_certificate(pki):
    srv = start_metrics_server(WorkerMetrics(), "127.0.0.1", 0,
                               tls=ServerTLS(pki.server_cert, pki.server_key))
    url = f"https://127.0.0.1:{srv.port}/metrics"
    try:
        assert "dspark_worker_ready" in scrape(url, ClientTLS(pki.ca).ssl_context())
        with pytest.raises(OSError):  # plaintext against the TLS port
            scrape(url.replace("https", "http"))
    finally:
        srv.stop()


def test_mutual_tls_refuses_a_scrape_without_the_right_client_certificate(pki):
    srv = start_metrics_server(WorkerMetrics(), "127.0.0.1", 0,
                               tls=ServerTLS(pki.server_cert, pki.server_key, pki.ca))
    url = f"https://127.0.0.1:{srv.port}/metrics"
    try:
        for bad in (ClientTLS(pki.ca),  # no client certificate
                    ClientTLS(pki.ca, pki.rogue_client_cert, pki.rogue_client_key)):  # other CA
            with pytest.raises(OSError):  # the handshake is refused
                scrape(url, bad.ssl_context())
        good = ClientTLS(pki.ca, pki.client_cert, pki.client_key).ssl_context()
        assert "dspark_worker_ready" in scrape(url, good)
    finally:
        srv.stop()


def test_a_silent_connection_holds_up_no_other_scrape(pki):
    """The handshake runs on the connection's own thread, not the accept loop."""
    srv = start_metrics_server(WorkerMetrics(), "127.0.0.1", 0,
                               tls=ServerTLS(pki.server_cert, pki.server_key, pki.ca))
    silent = socket.create_connection(("127.0.0.1", srv.port))
    try:
        time.sleep(0.2)  # the server has accepted it and waits for a ClientHello
        t0 = time.monotonic()
        good = ClientTLS(pki.ca, pki.client_cert, pki.client_key).ssl_context()
        assert "dspark_worker_ready" in scrape(f"https://127.0.0.1:{srv.port}/metrics", good)
        assert time.monotonic() - t0 < 5.0
    finally:
        silent.close()
        srv.stop()


def test_service_metrics_port_follows_the_grpc_port_mutual_tls(pki):
    """A Service with --tls-client-ca: its gRPC port and its metrics port
    both want a client certificate of that CA."""
    good = ClientTLS(pki.ca, pki.client_cert, pki.client_key)

    async def main():
        grpc_port, metrics_port = free_port(), free_port()
        svc = Service("dspark.v1.Worker", "127.0.0.1", grpc_port,
                      tls=ServerTLS(pki.server_cert, pki.server_key, pki.ca),
                      metrics=WorkerMetrics(), metrics_port=metrics_port)
        await svc.start()
        await svc.set_ready(True)
        try:
            url = f"https://127.0.0.1:{metrics_port}/metrics"
            with pytest.raises(OSError):
                await asyncio.to_thread(scrape, url, ClientTLS(pki.ca).ssl_context())
            text = await asyncio.to_thread(scrape, url, good.ssl_context())
            assert "dspark_worker_ready 1.0" in text
            async with aio_channel(f"127.0.0.1:{grpc_port}", good) as ch:  # same certificate
                resp = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service="dspark.v1.Worker"), timeout=10)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            async with aio_channel(f"127.0.0.1:{grpc_port}", ClientTLS(pki.ca)) as ch:
                with pytest.raises(grpc.aio.AioRpcError):
                    await health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(), timeout=5)
        finally:
            svc.request_stop()
            await svc.run_until_stopped(grace_s=0)

    asyncio.run(main())


def test_router_http_api_is_mutual_under_tls_client_ca(pki):
    """The same ServerTLS.ssl_context() as the metrics port: with a client
    CA, no client certificate (or one of another CA) = no HTTP at all."""

    async def main():
        api = OpenAIApi(FakeRouter(), Gate(None, RateLimiter(0)), RouterMetrics())
        port = free_port()
        await api.start("127.0.0.1", port,
                        ssl_context=ServerTLS(pki.server_cert, pki.server_key, pki.ca)
                        .ssl_context())
        url = f"https://127.0.0.1:{port}/health"
        try:
            for bad in (ClientTLS(pki.ca),
                        ClientTLS(pki.ca, pki.rogue_client_cert, pki.rogue_client_key)):
                with pytest.raises(OSError):
                    await asyncio.to_thread(scrape, url, bad.ssl_context())
            good = ClientTLS(pki.ca, pki.client_cert, pki.client_key).ssl_context()
            assert await asyncio.to_thread(scrape, url, good) == '{"status": "ok"}'
        finally:
            await api.stop()

    asyncio.run(main())
