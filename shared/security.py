"""TLS credentials, API keys and per-key rate limits.

- :class:`ServerTLS` / :class:`ClientTLS`: certificate files -> gRPC
  credentials and ``ssl.SSLContext`` (server side: optional mutual TLS, i.e.
  client certificates required and checked against ``client_ca``).
- :class:`ApiKeys`: the keys of the public API, loaded from a file (one key
  per line, ``# comments``; ``NAME KEY`` gives a key a name for logs and
  metrics). A presented key is compared with every configured key in constant
  time (``hmac.compare_digest``), and keys are never logged: a key is named by
  its NAME or by ``key-<first 8 hex of its sha256>``.
- :class:`RateLimiter`: a token bucket per key name.
- :class:`AuthInterceptor`: API key and rate limit on the router's gRPC API
  (``authorization: Bearer KEY`` metadata); health and reflection stay open.
"""
from __future__ import annotations

import hashlib
import hmac
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from dspark.shared.errors import ResourceExhausted, Unauthenticated
from dspark.shared.logging import get_logger

log = get_logger(component="security")

ANONYMOUS = "anonymous"


def _read(path: str, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{field}={path!r} is invalid: cannot read it ({e.strerror})") from None


# -- TLS -----------------------------------------------------------------------


@dataclass(frozen=True)
class ServerTLS:
    """This service's certificate and key; ``client_ca`` set = mutual TLS."""

    cert: str
    key: str
    client_ca: str = ""

    def grpc_credentials(self) -> grpc.ServerCredentials:
        pair = (_read(self.key, "tls_key"), _read(self.cert, "tls_cert"))
        if self.client_ca:
            return grpc.ssl_server_credentials(
                [pair], root_certificates=_read(self.client_ca, "tls_client_ca"),
                require_client_auth=True)
        return grpc.ssl_server_credentials([pair])

    def ssl_context(self) -> ssl.SSLContext:
        """For the HTTP API (and metrics): TLS 1.2+, client certs when mutual."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca:
            ctx.load_verify_locations(self.client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


@dataclass(frozen=True)
class ClientTLS:
    """How to reach a TLS server: the CA that signed it, and for mutual TLS
    our own certificate and key."""

    ca: str = ""  # "" = the system's roots
    cert: str = ""
    key: str = ""

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "tls_ca") if self.ca else None,
            private_key=_read(self.key, "tls_client_key") if self.key else None,
            certificate_chain=_read(self.cert, "tls_client_cert") if self.cert else None)

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca or None)
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


def server_tls(config) -> ServerTLS | None:
    """The ServerTLS of a service config (None when tls_cert is unset)."""
    if not getattr(config, "tls_cert", ""):
        return None
    return ServerTLS(config.tls_cert, config.tls_key, config.tls_client_ca)


def upstream_tls(config) -> ClientTLS | None:
    """How a service reaches the next hop (None = plaintext)."""
    if not getattr(config, "tls_ca", ""):
        return None
    return ClientTLS(config.tls_ca, config.tls_client_cert, config.tls_client_key)


def aio_channel(address: str, tls: ClientTLS | None, options=None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.grpc_credentials(), options=options)


def sync_channel(address: str, tls: ClientTLS | None, options=None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.grpc_credentials(), options=options)


# -- API keys -------------------------------------------------------------------


def key_name(key: str) -> str:
    """A loggable name for a key that has none: never the key itself."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


class ApiKeys:
    """The accepted API keys.

    ``ApiKeys.from_file(path)``: one key per line; ``NAME KEY`` names it;
    blank lines and ``#`` comments are skipped; keys are at least 16
    characters.
    """

    MIN_KEY_CHARS = 16

    def __init__(self, keys: dict[str, str]) -> None:  # name -> key
        if not keys:
            raise ValueError("api_keys_file is invalid: it holds no key")
        self._keys = [(n, k.encode()) for n, k in keys.items()]

    @classmethod
    def from_file(cls, path: str) -> "ApiKeys":
        keys: dict[str, str] = {}
        text = _read(path, "api_keys_file").decode()
        for i, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) > 2:
                raise ValueError(f"api_keys_file={path!r} line {i} is invalid: "
                                 "must be KEY or NAME KEY")
            key = parts[-1]
            if len(key) < cls.MIN_KEY_CHARS:
                raise ValueError(f"api_keys_file={path!r} line {i} is invalid: key must be "
                                 f"at least {cls.MIN_KEY_CHARS} characters")
            keys[parts[0] if len(parts) == 2 else key_name(key)] = key
        return cls(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, presented: str | None) -> str | None:
        """The name of the key ``presented`` equals, or None. Constant time in
        the key's content: every configured key is compared, no early exit."""
        if not presented:
            return None
        p = presented.encode()
        found = None
        for name, key in self._keys:
            if hmac.compare_digest(p, key):
                found = name
        return found


def bearer_token(header: str | None) -> str | None:
    """``KEY`` from ``Bearer KEY`` (case-insensitive scheme); None otherwise."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


# -- rate limits ------------------------------------------------------------------


class RateLimiter:
    """A token bucket per key name: ``rate`` requests/s, bursts of ``burst``.
    ``rate`` 0 disables it. Thread-safe."""

    def __init__(self, rate: float, burst: int = 0) -> None:
        self.rate = float(rate)
        self.burst = float(burst or max(1, int(rate)))
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, at)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def acquire(self, name: str, now: float | None = None) -> float:
        """Take one request from ``name``'s bucket: 0.0 when allowed, else the
        seconds until one would be."""
        if not self.enabled:
            return 0.0
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, at = self._buckets.get(name, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[name] = (tokens - 1.0, now)
                return 0.0
            self._buckets[name] = (tokens, now)
            return (1.0 - tokens) / self.rate


class RateLimited(ResourceExhausted):
    """Too many requests for one key; ``retry_after`` seconds."""

    def __init__(self, name: str, rate: float, retry_after: float) -> None:
        super().__init__(f"rate limit exceeded: at most {rate:g} requests/s per API key "
                         f"(rate_limit_rps); retry in {retry_after:.2f}s")
        self.retry_after = retry_after


class Gate:
    """API key check + rate limit, shared by the gRPC and HTTP front doors."""

    def __init__(self, keys: ApiKeys | None, limiter: RateLimiter) -> None:
        self.keys = keys
        self.limiter = limiter

    def admit(self, presented: str | None, *, limited: bool = True) -> str:
        """The caller's key name; raises Unauthenticated / RateLimited."""
        if self.keys is None:
            name = ANONYMOUS
        else:
            name = self.keys.match(presented)
            if name is None:
                raise Unauthenticated("missing API key (send 'Authorization: Bearer KEY')"
                                      if not presented else "invalid API key")
        if limited:
            wait = self.limiter.acquire(name)
            if wait > 0:
                raise RateLimited(name, self.limiter.rate, wait)
        return name


def _abort_handler(handler, code: grpc.StatusCode, message: str):
    async def abort(req, ctx):
        await ctx.abort(code, message)

    kw = dict(request_deserializer=handler.request_deserializer,
              response_serializer=handler.response_serializer)
    if handler.unary_stream:
        async def abort_stream(req, ctx):
            await ctx.abort(code, message)
            yield  # pragma: no cover - makes this an async generator

        return grpc.unary_stream_rpc_method_handler(abort_stream, **kw)
    return grpc.unary_unary_rpc_method_handler(abort, **kw)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """API key (``authorization: Bearer KEY`` metadata) and rate limit for the
    methods under ``prefix``; other services (health, reflection) pass.
    ``on_reject(outcome)`` is called for each refused call (metrics)."""

    def __init__(self, gate: Gate, prefix: str = "/dspark.v1.Router/",
                 limited_methods: tuple[str, ...] = ("Generate",), on_reject=None) -> None:
        self.gate = gate
        self.prefix = prefix
        self.limited = limited_methods
        self.on_reject = on_reject

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self.prefix):
            return handler
        md = {k: v for k, v in (details.invocation_metadata or ())}
        token = bearer_token(md.get("authorization"))
        method = details.method.rsplit("/", 1)[-1]
        try:
            self.gate.admit(token, limited=method in self.limited)
        except Unauthenticated as e:
            log.info("rpc_unauthenticated", method=method)  # never the key
            if self.on_reject:
                self.on_reject("unauthenticated")
            return _abort_handler(handler, grpc.StatusCode.UNAUTHENTICATED, str(e))
        except RateLimited as e:
            if self.on_reject:
                self.on_reject("rate_limited")
            return _abort_handler(handler, grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        return handler
