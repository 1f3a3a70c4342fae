"""The SDK's API key and TLS options: bad combinations are clear errors;
the key travels as `authorization: Bearer` metadata."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from dspark.shared import errors
from dspark.shared.client import AsyncClient, Client, auth_metadata
from dspark.shared.security import ApiKeys, AuthInterceptor, Gate, RateLimiter
from dspark.v1 import router_pb2, router_pb2_grpc

KEY = "sk-sdk-test-0123456789abcdef"


def test_auth_metadata():
    assert auth_metadata(None) is None
    assert auth_metadata(KEY) == (("authorization", f"Bearer {KEY}"),)
    for bad in ("", "two words", "line\nbreak"):
        with pytest.raises(ValueError, match="api_key is invalid"):
            auth_metadata(bad)


def test_client_cert_needs_its_key(tmp_path):
    with pytest.raises(ValueError, match="tls_client_cert and tls_client_key go together"):
        Client("127.0.0.1:1", tls_root_cert=b"x", tls_client_cert=b"y")


class Models(router_pb2_grpc.RouterServicer):
    async def ListModels(self, request, context):
        return router_pb2.ListModelsResponse(models=[router_pb2.ModelCard(name="m")])


def test_sync_and_async_clients_send_the_key(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"sdk {KEY}\n")

    async def main():
        server = grpc.aio.server(interceptors=[AuthInterceptor(
            Gate(ApiKeys.from_file(str(keys)), RateLimiter(0)))])
        router_pb2_grpc.add_RouterServicer_to_server(Models(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        addr = f"127.0.0.1:{port}"
        try:
            async with AsyncClient(addr, timeout=5, api_key=KEY) as c:
                assert [m.name for m in await c.list_models()] == ["m"]
            async with AsyncClient(addr, timeout=5) as c:
                with pytest.raises(errors.Unauthenticated):
                    await c.list_models()

            def sync_calls():
                with Client(addr, timeout=5, api_key=KEY) as c:
                    assert [m.name for m in c.list_models()] == ["m"]
                with Client(addr, timeout=5, api_key="sk-wrong-0000000000000") as c:
                    with pytest.raises(errors.Unauthenticated, match="invalid API key"):
                        c.list_models()

            await asyncio.get_running_loop().run_in_executor(None, sync_calls)
        finally:
            await server.stop(0)

    asyncio.run(main())
