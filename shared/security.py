"""TLS credentials, API keys and the rate limit of the public API.

- :class:`ServerTLS` / :class:`ClientTLS`: certificate files -> gRPC
  credentials and ``ssl.SSLContext`` (server side: optional mutual TLS, i.e.
  client certificates required and checked against ``client_ca``).
- :class:`ApiKeys`: the keys of the public API, loaded from a file (one key
  per line, ``# comments``; ``NAME KEY`` gives a key a name for logs and
  metrics). A presented key is compared with every configured key in constant
  time (``hmac.compare_digest``), and keys are never logged: a key is named by
  its NAME or by ``key-<first 8 hex of its sha256>``.
- :class:`Gate`: key check, rate limit (``dspark.shared.ratelimit``: a token
  bucket per key, or per client address without keys) and per-key request
  size, shared by the gRPC and HTTP front doors.
- :class:`AuthInterceptor`: API key and rate limit on the router's gRPC API
  (``authorization: Bearer KEY`` metadata); health and reflection stay open.
"""
from __future__ import annotations

import hashlib
import hmac
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from dspark.shared.errors import InvalidArgument, Unauthenticated
from dspark.shared.logging import get_logger
from dspark.shared.ratelimit import (  # RateLimiter, RateLimited: importable from here too
    ANONYMOUS,
    RateLimited,
    RateLimiter,
    bucket_of,
    grpc_peer_address,
)

log = get_logger(component="security")


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
        """For the HTTP API (and metrics): TLS 1.2+, client certs when mutual.
        A file that is not valid PEM is a ValueError naming the field."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"tls_cert={self.cert!r} / tls_key={self.key!r} is invalid: not a "
                             f"matching PEM certificate and private key ({e})") from None
        if self.client_ca:
            try:
                ctx.load_verify_locations(self.client_ca)
            except (ssl.SSLError, OSError) as e:
                raise ValueError(f"tls_client_ca={self.client_ca!r} is invalid: not a PEM "
                                 f"CA certificate ({e})") from None
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


@dataclass(frozen=True)
class KeyLimits:
    """One key's own limits; None = the router's defaults (--rate-limit-rps,
    --rate-limit-burst, --max-request-bytes)."""

    rps: float | None = None
    burst: int | None = None
    max_request_bytes: int | None = None


_LIMIT_OPTIONS = {"rps": float, "burst": int, "max_request_bytes": int}


class ApiKeys:
    """The accepted API keys, with optional per-key limits.

    ``ApiKeys.from_file(path)``, one key per line::

        # comment
        KEY
        NAME KEY
        NAME KEY rps=5 burst=10 max_request_bytes=65536

    A NAME names the key in logs and metrics (otherwise a hash prefix); the
    options override the router's rate limit and request size for that key.
    Keys are at least 16 characters.
    """

    MIN_KEY_CHARS = 16

    def __init__(self, keys: dict[str, str], limits: dict[str, KeyLimits] | None = None) -> None:
        if not keys:
            raise ValueError("api_keys_file is invalid: it holds no key")
        self._keys = [(n, k.encode()) for n, k in keys.items()]  # name -> key
        self.limits = limits or {}

    @classmethod
    def from_file(cls, path: str) -> "ApiKeys":
        keys: dict[str, str] = {}
        limits: dict[str, KeyLimits] = {}
        text = _read(path, "api_keys_file").decode()
        for i, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            where = f"api_keys_file={path!r} line {i} is invalid"
            words = [w for w in line.split() if "=" not in w]
            opts = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if not 1 <= len(words) <= 2:
                raise ValueError(f"{where}: must be KEY or NAME KEY, then options "
                                 "rps=R burst=B max_request_bytes=N")
            key = words[-1]
            if len(key) < cls.MIN_KEY_CHARS:
                raise ValueError(f"{where}: key must be at least {cls.MIN_KEY_CHARS} characters")
            kw = {}
            for opt, val in opts.items():
                conv = _LIMIT_OPTIONS.get(opt)
                if conv is None:
                    raise ValueError(f"{where}: unknown option {opt!r}; allowed: "
                                     f"{', '.join(_LIMIT_OPTIONS)}")
                try:
                    kw[opt] = conv(val)
                except ValueError:
                    raise ValueError(f"{where}: {opt}={val!r} must be a number") from None
                if kw[opt] < (0 if opt != "max_request_bytes" else 1024):
                    raise ValueError(f"{where}: {opt}={val} must be "
                                     + (">= 1024" if opt == "max_request_bytes" else ">= 0"))
            name = words[0] if len(words) == 2 else key_name(key)
            keys[name] = key
            if kw:
                limits[name] = KeyLimits(**kw)
        return cls(keys, limits)

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


class Gate:
    """API key check + rate limit + per-key request size, shared by the gRPC
    and HTTP front doors. The rate limit is per key with API keys, per client
    address (``peer``) without."""

    def __init__(self, keys: ApiKeys | None, limiter: RateLimiter,
                 max_request_bytes: int = 0) -> None:
        self.keys = keys
        self.limiter = limiter
        self.max_request_bytes = max_request_bytes  # the default; 0 = no check here

    def limits(self, name: str) -> KeyLimits:
        return self.keys.limits.get(name, KeyLimits()) if self.keys is not None else KeyLimits()

    def authenticate(self, presented: str | None) -> str:
        """The caller's key name (ANONYMOUS without keys); raises Unauthenticated."""
        if self.keys is None:
            return ANONYMOUS
        name = self.keys.match(presented)
        if name is None:
            raise Unauthenticated("missing API key (send 'Authorization: Bearer KEY')"
                                  if not presented else "invalid API key")
        return name

    def throttle(self, name: str, peer: str = "") -> None:
        """Take one request from the caller's bucket (its key ``name``, or
        its client address ``peer`` without keys); raises RateLimited."""
        lim = self.limits(name)
        keyed = self.keys is not None
        wait = self.limiter.acquire(bucket_of(name, keyed, peer), rate=lim.rps, burst=lim.burst)
        if wait > 0:
            raise RateLimited(name, self.limiter.rate if lim.rps is None else lim.rps, wait,
                              per="API key" if keyed else "client address")

    def admit(self, presented: str | None, *, limited: bool = True, peer: str = "") -> str:
        """The caller's key name; raises Unauthenticated / RateLimited."""
        name = self.authenticate(presented)
        if limited:
            self.throttle(name, peer)
        return name

    def max_bytes(self, name: str) -> int:
        """The request size limit of this key (0 = none beyond the server's)."""
        own = self.limits(name).max_request_bytes
        return own if own is not None else self.max_request_bytes

    def check_size(self, name: str, size: int) -> None:
        """RequestTooLarge when ``size`` bytes is over this key's limit."""
        limit = self.max_bytes(name)
        if limit and size > limit:
            raise RequestTooLarge(size, limit)


class RequestTooLarge(InvalidArgument):
    """A request over its key's max_request_bytes (HTTP 413)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__("request", f"{size} bytes is over max_request_bytes={limit} "
                                    "for this API key")
        self.limit = limit


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
            name = self.gate.authenticate(token)
        except Unauthenticated as e:
            log.info("rpc_unauthenticated", method=method)  # never the key
            if self.on_reject:
                self.on_reject("unauthenticated")
            return _abort_handler(handler, grpc.StatusCode.UNAUTHENTICATED, str(e))
        limited = method in self.limited
        sized = self.gate.keys is not None and self.gate.limits(name).max_request_bytes is not None
        if not (limited or sized):
            return handler
        return _admitted(handler, self.gate, name, limited=limited, sized=sized,
                         on_reject=self.on_reject)


def _admitted(handler, gate: Gate, name: str, *, limited: bool, sized: bool, on_reject=None):
    """The handler behind the rate limit (the bucket of the key, or of the
    peer's address: known only here, from the call's context) and the key's
    own max_request_bytes (the server-wide limit is gRPC's
    max_receive_message_length)."""
    kw = dict(request_deserializer=handler.request_deserializer,
              response_serializer=handler.response_serializer)

    async def check(req, ctx) -> None:
        if limited:
            try:
                gate.throttle(name, grpc_peer_address(ctx.peer()))
            except RateLimited as e:
                if on_reject:
                    on_reject("rate_limited")
                await ctx.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        if sized:
            try:
                gate.check_size(name, req.ByteSize())
            except RequestTooLarge as e:
                await ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    if handler.unary_stream:
        inner_s = handler.unary_stream

        async def stream(req, ctx):
            await check(req, ctx)
            async for r in inner_s(req, ctx):
                yield r

        return grpc.unary_stream_rpc_method_handler(stream, **kw)
    if handler.unary_unary:
        inner = handler.unary_unary

        async def unary(req, ctx):
            await check(req, ctx)
            return await inner(req, ctx)

        return grpc.unary_unary_rpc_method_handler(unary, **kw)
    return handler
