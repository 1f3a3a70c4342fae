"""Client SDK for the DSpark router (``dspark.v1.Router``).

Sync::

    from dspark.shared.client import Client

    with Client("127.0.0.1:50051") as client:
        out = client.generate(prompt="The capital of France is", max_tokens=16)
        print(out.text, out.finish_reason, out.usage.completion_tokens)

        for chunk in client.stream(messages=[{"role": "user", "content": "Hi!"}]):
            print(chunk.text, end="", flush=True)  # `break` cancels the RPC

Async::

    from dspark.shared.client import AsyncClient

    async with AsyncClient("127.0.0.1:50051") as client:
        async for chunk in client.stream(prompt="Once upon a time", max_tokens=32):
            print(chunk.text, end="")

TLS and API keys: ``Client("router.example:50051", api_key="...",
tls_root_cert="ca.pem")`` (``tls=True`` alone uses the system's roots;
``tls_client_cert`` / ``tls_client_key`` for mutual TLS). The key travels as
``authorization: Bearer KEY`` metadata on every call.

Errors are the typed exceptions of ``dspark.shared.errors`` (InvalidArgument,
ResourceExhausted, Unavailable, DeadlineExceeded, ...); a ``grpc.RpcError``
never escapes. ``timeout`` (seconds) is a per-call deadline: the client's
default, overridden per call.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from dspark.shared.errors import Internal, from_grpc_error
from dspark.v1 import common_pb2, router_pb2, router_pb2_grpc

__all__ = ["AsyncClient", "AsyncStream", "Chunk", "Client", "Completion", "ModelInfo",
           "Stream", "Usage"]

DEFAULT_ADDRESS = "127.0.0.1:50051"

_FINISH_REASONS = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}


@dataclass(frozen=True)
class Usage:
    """Token accounting of one request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Chunk:
    """One streamed response: new text and token ids; the last one has finish_reason + usage."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None  # "stop" | "length" | "abort" on the last chunk, else None
    usage: Usage | None
    request_id: str
    # the last chunk, when return_spec_summary=True and the server speculates:
    # verify_steps, num_draft_tokens, num_accepted_tokens, mean_accepted_length,
    # per_position_acceptance, fallback_steps, num_speculative_tokens, unverified_steps
    # (confidence-scheduled verification), verified_per_position, accepted_per_position
    spec_summary: dict | None = None


@dataclass(frozen=True)
class Completion:
    """A whole generation."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" | "length" | "abort"
    usage: Usage
    request_id: str
    spec_summary: dict | None = None  # see Chunk.spec_summary


@dataclass(frozen=True)
class ModelInfo:
    """One served model."""

    name: str
    max_model_len: int
    num_replicas: int


# -- protobuf conversions ---------------------------------------------------


def _chat_message(i: int, m: Any) -> router_pb2.ChatMessage:
    if isinstance(m, Mapping):
        role, content = m.get("role"), m.get("content")
    elif isinstance(m, (tuple, list)) and len(m) == 2:
        role, content = m
    else:
        role, content = getattr(m, "role", None), getattr(m, "content", None)
    if not isinstance(role, str) or not isinstance(content, str):
        raise TypeError(f"messages[{i}] must be a {{'role': str, 'content': str}} dict")
    return router_pb2.ChatMessage(role=role, content=content)


def build_request(prompt: str | None = None, messages: Sequence[Any] | None = None, *,
                  max_tokens: int | None = None, temperature: float | None = None,
                  top_p: float | None = None, top_k: int | None = None,
                  seed: int | None = None, stop: str | Iterable[str] | None = None,
                  stop_token_ids: Iterable[int] | None = None, ignore_eos: bool | None = None,
                  model: str = "", request_id: str = "",
                  return_spec_summary: bool = False) -> router_pb2.GenerateRequest:
    """The GenerateRequest for these arguments; None leaves a field to the server's default."""
    if (prompt is None) == (messages is None):
        raise ValueError("pass exactly one of prompt or messages")
    sp = common_pb2.SamplingParams()
    if temperature is not None:
        sp.temperature = float(temperature)
    if top_p is not None:
        sp.top_p = float(top_p)
    if top_k is not None:
        sp.top_k = int(top_k)
    if seed is not None:
        sp.seed = int(seed)
    if max_tokens is not None:
        sp.max_tokens = int(max_tokens)
    if ignore_eos is not None:
        sp.ignore_eos = bool(ignore_eos)
    if stop:
        sp.stop.extend([stop] if isinstance(stop, str) else list(stop))
    if stop_token_ids:
        sp.stop_token_ids.extend(int(t) for t in stop_token_ids)
    req = router_pb2.GenerateRequest(request_id=request_id, model=model, sampling=sp,
                                     return_spec_summary=bool(return_spec_summary))
    if prompt is not None:
        req.prompt = prompt
    else:
        req.chat.messages.extend(_chat_message(i, m) for i, m in enumerate(messages))
    return req


def _chunk(resp: router_pb2.GenerateResponse) -> Chunk:
    finish = _FINISH_REASONS.get(resp.finish_reason)
    usage = None
    if resp.HasField("usage") or finish is not None:
        usage = Usage(resp.usage.prompt_tokens, resp.usage.completion_tokens)
    spec = None
    if resp.HasField("spec_summary"):
        m = resp.spec_summary
        spec = {"verify_steps": m.verify_steps, "num_draft_tokens": m.num_draft_tokens,
                "num_accepted_tokens": m.num_accepted_tokens,
                "mean_accepted_length": m.mean_accepted_length,
                "per_position_acceptance": list(m.per_position_acceptance),
                "fallback_steps": m.fallback_steps,
                "num_speculative_tokens": m.num_speculative_tokens,
                "unverified_steps": m.unverified_steps,
                "verified_per_position": list(m.verified_per_position),
                "accepted_per_position": list(m.accepted_per_position)}
    return Chunk(text=resp.text, token_ids=tuple(resp.token_ids), finish_reason=finish,
                 usage=usage, request_id=resp.request_id, spec_summary=spec)


class _Aggregate:
    """Concatenates chunks into a Completion."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.ids: list[int] = []
        self.last: Chunk | None = None

    def add(self, c: Chunk) -> None:
        self.text.append(c.text)
        self.ids.extend(c.token_ids)
        self.last = c

    def result(self) -> Completion:
        last = self.last
        if last is None or last.finish_reason is None:
            raise Internal("the router's stream ended without a finish reason")
        return Completion(text="".join(self.text), token_ids=tuple(self.ids),
                          finish_reason=last.finish_reason, usage=last.usage or Usage(),
                          request_id=last.request_id, spec_summary=last.spec_summary)


def _pem(value: str | bytes | None) -> bytes | None:
    """PEM bytes from bytes or a file path."""
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


def channel_credentials(tls: bool, root_cert, client_cert, client_key):
    """grpc.ChannelCredentials, or None for plaintext."""
    if not (tls or root_cert or client_cert):
        return None
    if bool(client_cert) != bool(client_key):
        raise ValueError("tls_client_cert and tls_client_key go together")
    return grpc.ssl_channel_credentials(root_certificates=_pem(root_cert),
                                        private_key=_pem(client_key),
                                        certificate_chain=_pem(client_cert))


def auth_metadata(api_key: str | None) -> tuple[tuple[str, str], ...] | None:
    if api_key is None:
        return None
    if not isinstance(api_key, str) or not api_key or any(c in api_key for c in "\r\n "):
        raise ValueError("api_key is invalid: must be a non-empty string without spaces")
    return (("authorization", f"Bearer {api_key}"),)


def _timeout(value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise ValueError(f"timeout={value!r} is invalid: must be > 0 seconds or None")
    return value


_GEN_DOC = """
        Args: prompt (raw text) or messages (list of {"role", "content"}
        dicts; roles system/user/assistant), sampling parameters (None = the
        server's default), stop (a string or strings), model ("" = default),
        request_id ("" = the router chooses), timeout (seconds; None = the
        client's default).
"""


# -- sync -------------------------------------------------------------------


class Stream:
    """A running Generate call: iterate it for Chunks.

    Leaving the iteration early (``break``, an exception, ``with`` block exit,
    garbage collection) or calling :meth:`cancel` cancels the RPC. After
    ``cancel()`` iteration just ends.
    """

    def __init__(self, call) -> None:
        self._call = call
        self._done = False
        self._cancelled = False

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> Chunk:
        if self._done:
            raise StopIteration
        try:
            resp = next(self._call)
        except StopIteration:
            self._done = True
            raise
        except grpc.RpcError as e:
            self._done = True
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise from_grpc_error(e) from e
        return _chunk(resp)

    def cancel(self) -> None:
        """Cancel the RPC (the router aborts the request); idempotent."""
        if not self._done:
            self._cancelled = self._done = True
            self._call.cancel()

    close = cancel

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()

    def __del__(self) -> None:
        try:
            self.cancel()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Client:
    """Synchronous client of the router.

    ``Client(address="127.0.0.1:50051", timeout=None, *, api_key=None,
    tls=False, tls_root_cert=None, tls_client_cert=None, tls_client_key=None)``
    (certificates as file paths or PEM bytes); use as a context manager or
    call :meth:`close`. ``wait_for_ready`` makes calls wait for the
    channel to connect (within the deadline) instead of failing fast with
    Unavailable.

    Example::

        with Client() as c:
            print(c.generate(prompt="Hello", max_tokens=8).text)
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
        self._md = auth_metadata(api_key)
        creds = channel_credentials(tls, tls_root_cert, tls_client_cert, tls_client_key)
        if creds is None:
            self._channel = grpc.insecure_channel(address, options=list(options))
        else:
            self._channel = grpc.secure_channel(address, creds, options=list(options))
        self._stub = router_pb2_grpc.RouterStub(self._channel)

    def stream(self, prompt: str | None = None, messages: Sequence[Any] | None = None,
               max_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, top_k: int | None = None, seed: int | None = None,
               stop: str | Iterable[str] | None = None, model: str = "",
               request_id: str = "", timeout: float | None = None, *,
               stop_token_ids: Iterable[int] | None = None,
               ignore_eos: bool | None = None, return_spec_summary: bool = False) -> Stream:
        """Start a Generate call; iterate the returned Stream for Chunks."""
        req = build_request(prompt, messages, max_tokens=max_tokens, temperature=temperature,
                            top_p=top_p, top_k=top_k, seed=seed, stop=stop,
                            stop_token_ids=stop_token_ids, ignore_eos=ignore_eos,
                            model=model, request_id=request_id,
                            return_spec_summary=return_spec_summary)
        t = _timeout(timeout) if timeout is not None else self.timeout
        return Stream(self._stub.Generate(req, timeout=t, wait_for_ready=self._wait_for_ready,
                                          metadata=self._md))

    def generate(self, prompt: str | None = None, messages: Sequence[Any] | None = None,
                 max_tokens: int | None = None, temperature: float | None = None,
                 top_p: float | None = None, top_k: int | None = None, seed: int | None = None,
                 stop: str | Iterable[str] | None = None, model: str = "",
                 request_id: str = "", timeout: float | None = None, *,
                 stop_token_ids: Iterable[int] | None = None,
                 ignore_eos: bool | None = None, return_spec_summary: bool = False
                 ) -> Completion:
        """Generate and wait for the whole Completion."""
        agg = _Aggregate()
        with self.stream(prompt, messages, max_tokens, temperature, top_p, top_k, seed, stop,
                         model, request_id, timeout, stop_token_ids=stop_token_ids,
                         ignore_eos=ignore_eos, return_spec_summary=return_spec_summary) as s:
            for c in s:
                agg.add(c)
        return agg.result()

    def abort(self, request_id: str, timeout: float | None = None) -> bool:
        """Abort a running request by id; True when it was found."""
        try:
            resp = self._stub.Abort(router_pb2.AbortRequest(request_id=request_id),
                                    timeout=timeout if timeout is not None else self.timeout,
                                    wait_for_ready=self._wait_for_ready, metadata=self._md)
        except grpc.RpcError as e:
            raise from_grpc_error(e) from e
        return resp.found

    def list_models(self, timeout: float | None = None) -> list[ModelInfo]:
        """The models the router serves."""
        try:
            resp = self._stub.ListModels(router_pb2.ListModelsRequest(),
                                         timeout=timeout if timeout is not None else self.timeout,
                                         wait_for_ready=self._wait_for_ready, metadata=self._md)
        except grpc.RpcError as e:
            raise from_grpc_error(e) from e
        return [ModelInfo(m.name, m.max_model_len, m.num_replicas) for m in resp.models]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


Client.stream.__doc__ += _GEN_DOC  # type: ignore[operator]
Client.generate.__doc__ += _GEN_DOC  # type: ignore[operator]


def __getattr__(name: str):
    """The asyncio client lives in dspark.shared.client_async; importable from
    here too (lazily, so that either module can be imported first)."""
    if name in ("AsyncClient", "AsyncStream"):
        from dspark.shared import client_async

        return getattr(client_async, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
