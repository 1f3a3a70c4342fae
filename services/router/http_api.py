"""The OpenAI-compatible HTTP API of the router (aiohttp, on the router's
event loop, calling the same ``RouterServicer.Generate`` as the gRPC API).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON, or
server-sent events with ``"stream": true``), ``GET /v1/models``, ``GET
/health`` (200 when ready, 503 otherwise), ``GET /metrics`` (Prometheus).
``/v1/*`` need ``Authorization: Bearer KEY`` when API keys are configured;
``/health`` and ``/metrics`` are open (probes, scrapers). The rate limit is
per API key, or per client address (the TCP peer, never a forwarded-for
header) without keys. Errors use OpenAI's
error JSON with the HTTP status of the error (400, 401, 404, 413, 429, 503).
"""
from __future__ import annotations

import json
import time
import uuid

from aiohttp import web

from dspark.router import openai_protocol as oa
from dspark.shared import errors
from dspark.shared.logging import get_logger
from dspark.shared.ratelimit import client_address
from dspark.shared.security import Gate, bearer_token

log = get_logger(component="router.http")


def _json(status: int, obj: dict, headers: dict | None = None) -> web.Response:
    return web.json_response(obj, status=status, headers=headers)


def _error_response(exc: BaseException) -> web.Response:
    status, body = oa.error_for(exc)
    headers = None
    retry = getattr(exc, "retry_after", None)
    if retry is not None:
        headers = {"Retry-After": str(max(1, int(retry + 0.999)))}
    return _json(status, body, headers)


class OpenAIApi:
    """The aiohttp application over a router servicer.

    Args:
      servicer: the router's servicer (``Generate``, ``ListModels``,
        ``served_models()``, ``ready``, ``draining``).
      gate: API keys and rate limits (``dspark.shared.security.Gate``).
      metrics: the router's ``RouterMetrics`` (served at /metrics, HTTP counts).
      max_request_bytes: bodies above it are refused with 413.
    """

    def __init__(self, servicer, gate: Gate, metrics=None,
                 max_request_bytes: int = 4 * 1024 * 1024,
                 default_max_tokens: int | None = None) -> None:
        self.servicer = servicer
        self.gate = gate
        self.metrics = metrics
        self.default_max_tokens = default_max_tokens
        self.max_request_bytes = max_request_bytes
        self.app = web.Application(client_max_size=max_request_bytes,
                                   middlewares=[self._errors_mw])
        self.app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/health", self.health),
            web.get("/metrics", self.metrics_endpoint),
        ])
        self._runner: web.AppRunner | None = None
        self.inflight = 0

    # -- lifecycle ------------------------------------------------------------

    async def start(self, host: str, port: int, ssl_context=None) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=ssl_context,
                           shutdown_timeout=1.0)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            raise RuntimeError(f"cannot bind HTTP API {host}:{port}: {e.strerror}") from None
        log.info("http_listening", address=f"{host}:{port}", tls=ssl_context is not None)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- middleware -----------------------------------------------------------

    @web.middleware
    async def _errors_mw(self, request: web.Request, handler):
        try:
            resp = await handler(request)
        except web.HTTPRequestEntityTooLarge:
            resp = _json(413, oa.error_json(
                413, f"request body too large: at most {self.max_request_bytes} bytes "
                     "(max_request_bytes)", "invalid_request_error", "body",
                "request_too_large"))
        except web.HTTPException as e:  # 404 / 405 of unknown routes
            resp = _json(e.status, oa.error_json(e.status, e.reason, "invalid_request_error"))
        except errors.DSparkError as e:
            resp = _error_response(e)
        except Exception:  # noqa: BLE001 - the boundary
            log.exception("http_request_failed", path=request.path)
            resp = _json(500, oa.error_json(500, "internal server error", "internal_error"))
        if self.metrics is not None:
            path = request.match_info.route.resource.canonical \
                if request.match_info.route.resource is not None else "other"
            self.metrics.http_requests.labels(path=path, status=str(resp.status)).inc()
        return resp

    def _admit(self, request: web.Request, limited: bool) -> str:
        token = bearer_token(request.headers.get("Authorization"))
        try:  # without API keys the rate limit is per client address (the TCP peer's)
            return self.gate.admit(token, limited=limited, peer=client_address(request.remote))
        except errors.DSparkError as e:
            if self.metrics is not None:
                outcome = ("unauthenticated" if isinstance(e, errors.Unauthenticated)
                           else "rate_limited")
                self.metrics.requests.labels(outcome=outcome).inc()
            if isinstance(e, errors.Unauthenticated):
                log.info("http_unauthenticated", path=request.path)  # never the key
            raise

    # -- routes ---------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        ready = self.servicer.ready and not self.servicer.draining
        status = "ok" if ready else ("draining" if self.servicer.draining else "not_ready")
        return _json(200 if ready else 503, {"status": status})

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        from dspark.shared.metrics import CONTENT_TYPE_LATEST

        if self.metrics is None:
            raise web.HTTPNotFound()
        return web.Response(body=self.metrics.exposition(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        self._admit(request, limited=False)
        resp = await self.servicer.ListModels(None, None)
        return _json(200, oa.models_json(resp.models, created=int(time.time())))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        name = self._admit(request, limited=True)
        raw = await request.read()
        self.gate.check_size(name, len(raw))  # the key's own limit, when it has one
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise errors.InvalidArgument("body", f"is not valid JSON ({e})") from None
        req, opts = oa.parse_request(
            body, chat=chat, default_max_tokens=None if chat else self.default_max_tokens)
        served = self.servicer.served_models()
        if opts.model and served and opts.model not in served:
            raise errors.NotFound(f"model {opts.model!r} does not exist; "
                                  f"served models: {', '.join(served)}")
        model = opts.model or (served[0] if served else "")
        req.request_id = uuid.uuid4().hex
        gen = self.servicer.Generate(req, None)
        self.inflight += 1
        try:
            # The first response (or the error) before any header goes out, so
            # that validation and admission errors get their HTTP status.
            try:
                first = await gen.__anext__()
            except StopAsyncIteration:
                raise errors.Internal("the router ended the request without a response") \
                    from None
            if opts.stream:
                return await self._stream(request, gen, first, opts, model, req.request_id)
            texts, last = [first.text], first
            async for r in gen:
                texts.append(r.text)
                last = r
            return _json(200, oa.completion_json(opts, model, req.request_id, "".join(texts),
                                                 last))
        finally:
            self.inflight -= 1
            await gen.aclose()  # client gone or error: cancels the scheduler request

    async def _stream(self, request, gen, first, opts, model, rid) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())

        async def send(obj) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        try:
            if opts.chat:
                await send(oa.chunk_json(opts, model, rid, created, role=True))
            r = first
            while True:
                done = oa.finish_reason(r) is not None
                if r.text or done:
                    await send(oa.chunk_json(opts, model, rid, created, text=r.text,
                                             last=r if done else None))
                if done:
                    if opts.include_usage:
                        await send(oa.usage_chunk_json(opts, model, rid, created, r))
                    break
                r = await gen.__anext__()
        except errors.DSparkError as e:  # after the headers: an error event, then the end
            _, body = oa.error_for(e)
            await send(body)
        except (StopAsyncIteration, ValueError, RuntimeError, KeyError, TypeError) as e:
            log.exception("http_stream_failed", error=type(e).__name__)
            await send(oa.error_json(500, "internal server error", "internal_error"))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
