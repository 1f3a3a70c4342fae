"""OpenAI-compatible request/response shapes, as pure functions.

Requests (``/v1/completions``, ``/v1/chat/completions`` JSON bodies) become a
router ``GenerateRequest`` plus the few options that shape the HTTP answer
(:class:`HttpOptions`); router ``GenerateResponse`` values become OpenAI JSON
objects; DSpark errors become OpenAI's error JSON with an HTTP status.

Supported: ``model``, ``prompt`` (a string, or a list holding one string),
``messages`` (string content or text parts), ``max_tokens`` /
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``,
``stream``, ``stream_options.include_usage``, ``n`` = 1, ``user`` (ignored);
extras as in vLLM: ``top_k``, ``ignore_eos``, ``stop_token_ids``; and
``return_spec_summary`` (the speculation summary, returned as ``spec_summary``
in the response or the final chunk). Anything that would change the output
and is not supported (``n`` > 1, ``logprobs``, penalties, ``logit_bias``,
tools, ``echo``, ``suffix``, ...) is a 400 naming the parameter, never
silently ignored.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dspark.shared import errors
from dspark.shared.security import RequestTooLarge
from dspark.v1 import common_pb2, router_pb2

# OpenAI's default for /v1/completions; chat uses the router's default.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

_FINISH = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length",
           common_pb2.FINISH_REASON_ABORT: "abort"}

# Parameters we refuse unless they hold their neutral value.
_NEUTRAL = {
    "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
    "logprobs": (None, False), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
    "function_call": (None, "none"), "parallel_tool_calls": (None, False, True),
    "response_format": (None, {"type": "text"}), "audio": (None,), "modalities": (None, ["text"]),
    "prediction": (None,),
}


@dataclass
class HttpOptions:
    """What shapes the HTTP answer (not sent to the router core)."""

    chat: bool
    stream: bool = False
    include_usage: bool = False
    return_spec_summary: bool = False
    model: str = ""


def _bad(field: str, message: str) -> errors.InvalidArgument:
    return errors.InvalidArgument(field, message)


def _number(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(name, f"must be a number, got {v!r}")
    return float(v)


def _integer(body: dict, name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise _bad(name, f"must be an integer, got {v!r}")
    return v


def _boolean(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(name, f"must be true or false, got {v!r}")
    return v


def _text_content(i: int, content: Any) -> str:
    """A message's content: a string or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{i}].content[{j}]",
                           "only text parts ({\"type\": \"text\", \"text\": ...}) are supported")
            out.append(part["text"])
        return "".join(out)
    raise _bad(f"messages[{i}].content", "must be a string or a list of text parts")


def parse_request(body: Any, *, chat: bool, default_max_tokens: int | None = None
                  ) -> tuple[router_pb2.GenerateRequest, HttpOptions]:
    """An OpenAI request body -> (GenerateRequest, HttpOptions).

    Raises InvalidArgument naming the parameter. Range checks that the router
    core makes anyway (top_p in (0, 1], max_tokens limit, roles, sizes) are
    left to it, so the messages are the same over gRPC and HTTP.
    """
    if not isinstance(body, dict):
        raise _bad("body", "must be a JSON object")
    for name, neutral in _NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise _bad(name, f"is not supported by this server (got {body[name]!r})")
    n = _integer(body, "n")
    if n is not None and n != 1:
        raise _bad("n", f"only n=1 is supported, got {n}")
    model = body.get("model", "")
    if model is None:
        model = ""
    if not isinstance(model, str):
        raise _bad("model", f"must be a string, got {model!r}")
    stream = _boolean(body, "stream")
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not stream:
            raise _bad("stream_options", "is only allowed when stream is true")
        if not isinstance(so, dict):
            raise _bad("stream_options", "must be an object")
        include_usage = _boolean(so, "include_usage")
    opts = HttpOptions(chat=chat, stream=stream, include_usage=include_usage,
                       return_spec_summary=_boolean(body, "return_spec_summary"), model=model)

    sp = common_pb2.SamplingParams()
    max_tokens = _integer(body, "max_tokens")
    if chat:
        mct = _integer(body, "max_completion_tokens")
        if mct is not None:
            if max_tokens is not None and max_tokens != mct:
                raise _bad("max_completion_tokens", "conflicts with max_tokens; send one")
            max_tokens = mct
    elif max_tokens is None:
        max_tokens = default_max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
    if max_tokens is not None:
        if not -2**31 <= max_tokens < 2**31:
            raise _bad("max_tokens", f"must be a 32-bit integer, got {max_tokens}")
        sp.max_tokens = max_tokens
    for name in ("temperature", "top_p"):
        v = _number(body, name)
        if v is not None:
            setattr(sp, name, v)
    top_k = _integer(body, "top_k")
    if top_k is not None:
        if top_k == -1:  # vLLM's "off"
            top_k = 0
        if not -2**31 <= top_k < 2**31:
            raise _bad("top_k", f"must be a 32-bit integer, got {top_k}")
        sp.top_k = top_k
    seed = _integer(body, "seed")
    if seed is not None:
        if not 0 <= seed < 2**64:
            raise _bad("seed", f"must be in 0..2**64-1, got {seed}")
        sp.seed = seed
    if "ignore_eos" in body:
        sp.ignore_eos = _boolean(body, "ignore_eos")
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _bad("stop", "must be a string or a list of strings")
        sp.stop.extend(stop)
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in ids):
            raise _bad("stop_token_ids", "must be a list of non-negative token ids")
        sp.stop_token_ids.extend(ids)

    req = router_pb2.GenerateRequest(model=model, sampling=sp,
                                      return_spec_summary=opts.return_spec_summary)
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _bad("messages", "must be a non-empty list of {role, content} objects")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise _bad(f"messages[{i}]", "must be an object with role and content")
            role = m.get("role")
            if role == "developer":  # OpenAI's newer name for the system turn
                role = "system"
            if not isinstance(role, str):
                raise _bad(f"messages[{i}].role", "must be a string")
            req.chat.messages.add(role=role, content=_text_content(i, m.get("content")))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                raise _bad("prompt", "must be a string or a list of exactly one string "
                           "(batched prompts and token-id prompts are not supported)")
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _bad("prompt", "must be a string")
        req.prompt = prompt
    return req, opts


# -- responses -----------------------------------------------------------------


def finish_reason(resp: router_pb2.GenerateResponse) -> str | None:
    return _FINISH.get(resp.finish_reason)


def spec_summary_json(s: common_pb2.SpecSummary) -> dict:
    return {
        "verify_steps": s.verify_steps,
        "num_draft_tokens": s.num_draft_tokens,
        "num_accepted_tokens": s.num_accepted_tokens,
        "mean_accepted_length": round(float(s.mean_accepted_length), 6),
        "per_position_acceptance": [round(float(x), 6) for x in s.per_position_acceptance],
        "fallback_steps": s.fallback_steps,
        "num_speculative_tokens": s.num_speculative_tokens,
        # confidence-scheduled verification: steps the budget left without drafts,
        # and how many drafts were judged / accepted at each position
        "unverified_steps": s.unverified_steps,
        "verified_per_position": list(s.verified_per_position),
        "accepted_per_position": list(s.accepted_per_position),
    }


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_id(opts: HttpOptions, request_id: str) -> str:
    return ("chatcmpl-" if opts.chat else "cmpl-") + request_id


def completion_json(opts: HttpOptions, model: str, request_id: str, text: str,
                    last: router_pb2.GenerateResponse, created: int | None = None) -> dict:
    """The whole (non-streaming) answer."""
    created = int(time.time()) if created is None else created
    fr = finish_reason(last)
    if opts.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": fr, "logprobs": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": fr, "logprobs": None}
        obj = "text_completion"
    out = {"id": response_id(opts, request_id), "object": obj, "created": created,
           "model": model, "choices": [choice],
           "usage": usage_json(last.usage.prompt_tokens, last.usage.completion_tokens)}
    if opts.return_spec_summary:
        out["spec_summary"] = (spec_summary_json(last.spec_summary)
                               if last.HasField("spec_summary") else None)
    return out


def chunk_json(opts: HttpOptions, model: str, request_id: str, created: int, *,
               text: str | None = None, role: bool = False,
               last: router_pb2.GenerateResponse | None = None) -> dict:
    """One streamed chunk: a text delta, the opening role delta (chat), or
    the final one with finish_reason (and spec_summary when asked for)."""
    fr = finish_reason(last) if last is not None else None
    if opts.chat:
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
            delta["content"] = ""
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": fr, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": fr, "logprobs": None}
        obj = "text_completion"
    out = {"id": response_id(opts, request_id), "object": obj, "created": created,
           "model": model, "choices": [choice]}
    if opts.include_usage:
        out["usage"] = None
    if last is not None and opts.return_spec_summary:
        out["spec_summary"] = (spec_summary_json(last.spec_summary)
                               if last.HasField("spec_summary") else None)
    return out


def usage_chunk_json(opts: HttpOptions, model: str, request_id: str, created: int,
                     last: router_pb2.GenerateResponse) -> dict:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
    return {"id": response_id(opts, request_id),
            "object": "chat.completion.chunk" if opts.chat else "text_completion",
            "created": created, "model": model, "choices": [],
            "usage": usage_json(last.usage.prompt_tokens, last.usage.completion_tokens)}


def models_json(cards, created: int = 0) -> dict:
    return {"object": "list", "data": [
        {"id": c.name, "object": "model", "created": created, "owned_by": "dspark",
         "max_model_len": c.max_model_len, "num_replicas": c.num_replicas} for c in cards]}


# -- errors --------------------------------------------------------------------

# DSpark error -> (HTTP status, OpenAI error type, code)
_ERRORS: list[tuple[type, int, str, str | None]] = [
    (RequestTooLarge, 413, "invalid_request_error", "request_too_large"),
    (errors.InvalidArgument, 400, "invalid_request_error", None),
    (errors.Unauthenticated, 401, "invalid_request_error", "invalid_api_key"),
    (errors.NotFound, 404, "invalid_request_error", "model_not_found"),
    (errors.ResourceExhausted, 429, "rate_limit_error", "overloaded"),
    (errors.Unavailable, 503, "service_unavailable", "not_ready"),
    (errors.DeadlineExceeded, 504, "timeout", None),
    (errors.Cancelled, 499, "cancelled", None),
]


def error_json(status: int, message: str, type_: str, param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_for(exc: BaseException) -> tuple[int, dict]:
    """(HTTP status, OpenAI error JSON) for a DSpark error (others: 500)."""
    for cls, status, type_, code in _ERRORS:
        if isinstance(exc, cls):
            param = getattr(exc, "field", None) or None
            if getattr(exc, "retry_after", None) is not None:
                code = "rate_limit_exceeded"
            return status, error_json(status, str(exc), type_, param, code)
    return 500, error_json(500, "internal server error", "internal_error", None, None)
