"""The asyncio client SDK (``AsyncClient``); shares its request building,
chunks and error mapping with the sync client in ``dspark.shared.client``."""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
import grpc.aio

from dspark.shared.client import (
    _GEN_DOC,
    DEFAULT_ADDRESS,
    Chunk,
    Completion,
    ModelInfo,
    _Aggregate,
    _chunk,
    _timeout,
    auth_metadata,
    build_request,
    channel_credentials,
)
from dspark.shared.errors import from_grpc_error
from dspark.v1 import router_pb2, router_pb2_grpc

class AsyncStream:
    """A running async Generate call: ``async for`` it for Chunks.

    Cancelling the task that iterates it, leaving an ``async with`` block,
    or calling :meth:`cancel` cancels the RPC. After ``cancel()`` iteration
    just ends.
    """

    def __init__(self, call) -> None:
        self._call = call
        self._done = False
        self._cancelled = False

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> Chunk:
        if self._done:
            raise StopAsyncIteration
        try:
            resp = await self._call.read()
        except asyncio.CancelledError:
            self.cancel()
            raise
        except grpc.RpcError as e:
            self._done = True
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                raise StopAsyncIteration from None
            raise from_grpc_error(e) from e
        if resp is grpc.aio.EOF:
            self._done = True
            raise StopAsyncIteration
        return _chunk(resp)

    def cancel(self) -> None:
        """Cancel the RPC; idempotent."""
        if not self._done:
            self._cancelled = self._done = True
            self._call.cancel()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc) -> None:
        self.cancel()

    def __del__(self) -> None:
        try:
            self.cancel()
        except Exception:  # noqa: BLE001 - loop already closed
            pass


class AsyncClient:
    """asyncio client of the router (grpc.aio); same arguments as :class:`Client`.

    The channel is created on first use, inside the running event loop.

    Example::

        async with AsyncClient() as c:
            out = await c.generate(prompt="Hello", max_tokens=8)
    """

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout: float | None = None, *,
                 wait_for_ready: bool = False,
                 options: Sequence[tuple[str, Any]] = (), api_key: str | None = None,
                 tls: bool = False, tls_root_cert: str | bytes | None = None,
                 tls_client_cert: str | bytes | None = None,
                 tls_client_key: str | bytes | None = None) -> None:
        self.address = address
        self.timeout = _timeout(timeout)
        self._wait_for_ready = wait_for_ready
        self._options = list(options)
        self._md = auth_metadata(api_key)
        self._creds = channel_credentials(tls, tls_root_cert, tls_client_cert, tls_client_key)
        self._channel: grpc.aio.Channel | None = None
        self._stub_obj: router_pb2_grpc.RouterStub | None = None

    @property
    def _stub(self) -> router_pb2_grpc.RouterStub:
        if self._stub_obj is None:
            if self._creds is None:
                self._channel = grpc.aio.insecure_channel(self.address, options=self._options)
            else:
                self._channel = grpc.aio.secure_channel(self.address, self._creds,
                                                        options=self._options)
            self._stub_obj = router_pb2_grpc.RouterStub(self._channel)
        return self._stub_obj

    def stream(self, prompt: str | None = None, messages: Sequence[Any] | None = None,
               max_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, top_k: int | None = None, seed: int | None = None,
               stop: str | Iterable[str] | None = None, model: str = "",
               request_id: str = "", timeout: float | None = None, *,
               stop_token_ids: Iterable[int] | None = None,
               ignore_eos: bool | None = None, return_spec_summary: bool = False
               ) -> AsyncStream:
        """Start a Generate call (inside a running loop); ``async for`` the result."""
        req = build_request(prompt, messages, max_tokens=max_tokens, temperature=temperature,
                            top_p=top_p, top_k=top_k, seed=seed, stop=stop,
                            stop_token_ids=stop_token_ids, ignore_eos=ignore_eos,
                            model=model, request_id=request_id,
                            return_spec_summary=return_spec_summary)
        t = _timeout(timeout) if timeout is not None else self.timeout
        return AsyncStream(self._stub.Generate(req, timeout=t,
                                               wait_for_ready=self._wait_for_ready,
                                               metadata=self._md))

    async def generate(self, prompt: str | None = None, messages: Sequence[Any] | None = None,
                       max_tokens: int | None = None, temperature: float | None = None,
                       top_p: float | None = None, top_k: int | None = None,
                       seed: int | None = None, stop: str | Iterable[str] | None = None,
                       model: str = "", request_id: str = "", timeout: float | None = None, *,
                       stop_token_ids: Iterable[int] | None = None,
                       ignore_eos: bool | None = None, return_spec_summary: bool = False
                       ) -> Completion:
        """Generate and wait for the whole Completion."""
        agg = _Aggregate()
        async with self.stream(prompt, messages, max_tokens, temperature, top_p, top_k, seed,
                               stop, model, request_id, timeout,
                               stop_token_ids=stop_token_ids, ignore_eos=ignore_eos,
                               return_spec_summary=return_spec_summary) as s:
            async for c in s:
                agg.add(c)
        return agg.result()

    async def abort(self, request_id: str, timeout: float | None = None) -> bool:
        """Abort a running request by id; True when it was found."""
        try:
            resp = await self._stub.Abort(
                router_pb2.AbortRequest(request_id=request_id),
                timeout=timeout if timeout is not None else self.timeout,
                wait_for_ready=self._wait_for_ready, metadata=self._md)
        except grpc.RpcError as e:
            raise from_grpc_error(e) from e
        return resp.found

    async def list_models(self, timeout: float | None = None) -> list[ModelInfo]:
        """The models the router serves."""
        try:
            resp = await self._stub.ListModels(
                router_pb2.ListModelsRequest(),
                timeout=timeout if timeout is not None else self.timeout,
                wait_for_ready=self._wait_for_ready, metadata=self._md)
        except grpc.RpcError as e:
            raise from_grpc_error(e) from e
        return [ModelInfo(m.name, m.max_model_len, m.num_replicas) for m in resp.models]

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub_obj = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


AsyncClient.stream.__doc__ += _GEN_DOC  # type: ignore[operator]
AsyncClient.generate.__doc__ += _GEN_DOC  # type: ignore[operator]
