"""Request validation: a GenerateInput becomes token ids + resolved SamplingParams.

Pure functions, no protobuf: the servicer converts a ``GenerateRequest`` into
a :class:`GenerateInput` (unset ``optional`` fields -> None) and calls
:func:`validate_request`. Every rejection is an ``InvalidArgument(field,
message)`` whose message names the field and the limit, e.g.
``top_p: must be in (0, 1], got 1.5``.

Defaults for unset fields: the SamplingParams defaults (temperature 0 =
greedy, top_p 1, top_k 0 = off, ignore_eos False), max_tokens =
RouterConfig.default_max_tokens, seed = a random 63-bit integer.

Context length: the prompt must leave room for at least one generated token
(``prompt_tokens < max_model_len``). When ``prompt_tokens + max_tokens``
exceeds max_model_len, max_tokens is clipped to ``max_model_len -
prompt_tokens`` rather than rejected (as vLLM does for an unset max_tokens);
the request then ends with finish reason LENGTH. ``ValidatedRequest.clipped``
records it.

Example::

    req = validate_request(GenerateInput(prompt="Hi", max_tokens=16), tok, cfg,
                           max_model_len=2048, served_models=("SmolLM2-135M-Instruct",))
    req.prompt_token_ids, req.sampling.max_tokens
"""
from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dspark.shared.config import RouterConfig
from dspark.shared.errors import InvalidArgument, NotFound
from dspark.shared.types import SamplingParams

ALLOWED_ROLES: tuple[str, ...] = ("system", "user", "assistant")
SEED_LIMIT = 2**64  # proto seed is uint64


class TokenizerLike(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]]) -> str: ...


@dataclass
class GenerateInput:
    """A generate request as plain values (None = unset / server default)."""

    prompt: str | None = None
    messages: list[tuple[str, str]] | None = None  # (role, content), oldest first
    model: str = ""  # "" = the default (first served) model
    request_id: str = ""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool | None = None


@dataclass
class ValidatedRequest:
    """What the router sends on: resolved model, prompt ids and sampling params."""

    model: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    prompt_text: str  # the prompt as tokenized (chat template applied)
    clipped: bool = False  # max_tokens was clipped to fit max_model_len
    requested_max_tokens: int = 0  # max_tokens before clipping

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


# -- pieces ---------------------------------------------------------------


def resolve_model(model: str, served_models: Sequence[str]) -> str:
    """The served model name for ``model`` ("" = the first served model)."""
    if not served_models:
        raise NotFound("no model is being served")
    if not model:
        return served_models[0]
    if model not in served_models:
        raise InvalidArgument(
            "model", f"unknown model {model!r}; served models: {', '.join(served_models)}")
    return model


def validate_messages(messages: Sequence[Any], cfg: RouterConfig) -> list[dict[str, str]]:
    """Check count, roles and sizes of chat turns; return them as {"role", "content"} dicts."""
    if not messages:
        raise InvalidArgument("messages", "must contain at least one message")
    if len(messages) > cfg.max_messages:
        raise InvalidArgument(
            "messages", f"has {len(messages)} messages, at most {cfg.max_messages} allowed")
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, Mapping):
            role, content = m.get("role"), m.get("content")
        else:
            role, content = m
        if role not in ALLOWED_ROLES:
            raise InvalidArgument(
                f"messages[{i}].role",
                f"{role!r} is not allowed; must be one of {', '.join(ALLOWED_ROLES)}")
        if not isinstance(content, str):
            raise InvalidArgument(f"messages[{i}].content", "must be a string")
        if len(content) > cfg.max_message_chars:
            raise InvalidArgument(
                f"messages[{i}].content",
                f"has {len(content)} characters, max_message_chars is {cfg.max_message_chars}")
        out.append({"role": role, "content": content})
    return out


def _finite(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(name, f"must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise InvalidArgument(name, f"must be finite, got {v}")
    return v


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise InvalidArgument(name, f"must be an integer, got {value!r}")
    return value


def resolve_sampling(inp: GenerateInput, cfg: RouterConfig,
                     vocab_size: int | None = None) -> SamplingParams:
    """SamplingParams from the request's fields and the server defaults.

    max_tokens here is the requested one (checked against max_tokens_limit);
    :func:`fit_context` clips it to the context length.
    """
    d = SamplingParams()
    temperature = d.temperature
    if inp.temperature is not None:
        temperature = _finite("temperature", inp.temperature)
        if temperature < 0:
            raise InvalidArgument("temperature", f"must be >= 0, got {temperature}")
    top_p = d.top_p
    if inp.top_p is not None:
        top_p = _finite("top_p", inp.top_p)
        if not 0.0 < top_p <= 1.0:
            raise InvalidArgument("top_p", f"must be in (0, 1], got {top_p}")
    top_k = d.top_k
    if inp.top_k is not None:
        top_k = _int("top_k", inp.top_k)
        if top_k < 0:
            raise InvalidArgument("top_k", f"must be >= 0 (0 disables), got {top_k}")
    max_tokens = cfg.default_max_tokens
    if inp.max_tokens is not None:
        max_tokens = _int("max_tokens", inp.max_tokens)
        if not 1 <= max_tokens <= cfg.max_tokens_limit:
            raise InvalidArgument(
                "max_tokens",
                f"must be in 1..{cfg.max_tokens_limit} (max_tokens_limit), got {max_tokens}")
    if inp.seed is None:
        seed = secrets.randbits(63)
    else:
        seed = _int("seed", inp.seed)
        if not 0 <= seed < SEED_LIMIT:
            raise InvalidArgument("seed", f"must be in 0..2**64-1, got {seed}")
    return SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, max_tokens=max_tokens,
        stop=validate_stop(inp.stop, cfg),
        stop_token_ids=validate_stop_token_ids(inp.stop_token_ids, cfg, vocab_size),
        ignore_eos=bool(inp.ignore_eos) if inp.ignore_eos is not None else d.ignore_eos)


def validate_stop(stop: Sequence[str] | str | None, cfg: RouterConfig) -> tuple[str, ...]:
    """Stop strings: at most max_stop_strings, each non-empty and <= max_stop_chars."""
    if not stop:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    stop = tuple(stop)
    if len(stop) > cfg.max_stop_strings:
        raise InvalidArgument(
            "stop", f"has {len(stop)} stop strings, at most {cfg.max_stop_strings} allowed")
    for i, s in enumerate(stop):
        if not isinstance(s, str) or not s:
            raise InvalidArgument(f"stop[{i}]", "must be a non-empty string")
        if len(s) > cfg.max_stop_chars:
            raise InvalidArgument(
                f"stop[{i}]", f"has {len(s)} characters, max_stop_chars is {cfg.max_stop_chars}")
    return tuple(dict.fromkeys(stop))  # drop duplicates, keep order


def validate_stop_token_ids(ids: Sequence[int] | None, cfg: RouterConfig,
                            vocab_size: int | None = None) -> tuple[int, ...]:
    """Stop token ids: at most max_stop_token_ids, each in [0, vocab_size)."""
    if not ids:
        return ()
    ids = tuple(ids)
    if len(ids) > cfg.max_stop_token_ids:
        raise InvalidArgument(
            "stop_token_ids",
            f"has {len(ids)} ids, at most {cfg.max_stop_token_ids} allowed")
    for i, t in enumerate(ids):
        t = _int(f"stop_token_ids[{i}]", t)
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            limit = f"0..{vocab_size - 1}" if vocab_size is not None else ">= 0"
            raise InvalidArgument(f"stop_token_ids[{i}]", f"must be in {limit}, got {t}")
    return tuple(dict.fromkeys(int(t) for t in ids))


def fit_context(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """max_tokens clipped so prompt + output fit max_model_len; rejects a too-long prompt."""
    if num_prompt_tokens == 0:
        raise InvalidArgument("prompt", "tokenizes to 0 tokens")
    if num_prompt_tokens >= max_model_len:
        raise InvalidArgument(
            "prompt", f"prompt has {num_prompt_tokens} tokens, max_model_len is {max_model_len} "
                      "(at least one token must be left for the output)")
    return min(max_tokens, max_model_len - num_prompt_tokens)


# -- the whole request ----------------------------------------------------


def validate_request(inp: GenerateInput, tokenizer: TokenizerLike, cfg: RouterConfig,
                     max_model_len: int, served_models: Sequence[str]) -> ValidatedRequest:
    """Validate ``inp``, render and tokenize its prompt, resolve its sampling params.

    Cheap checks run before tokenization. Raises InvalidArgument (naming the
    field) or NotFound (nothing served).
    """
    model = resolve_model(inp.model, served_models)
    has_prompt = inp.prompt is not None
    has_messages = inp.messages is not None
    if has_prompt and has_messages:
        raise InvalidArgument("input", "set exactly one of prompt or messages, not both")
    if not has_prompt and not has_messages:
        raise InvalidArgument("input", "set one of prompt or messages")
    if has_prompt:
        if not isinstance(inp.prompt, str) or not inp.prompt:
            raise InvalidArgument("prompt", "must not be empty")
        if len(inp.prompt) > cfg.max_message_chars:
            raise InvalidArgument(
                "prompt", f"has {len(inp.prompt)} characters, "
                          f"max_message_chars is {cfg.max_message_chars}")
        messages = None
    else:
        messages = validate_messages(inp.messages, cfg)
    vocab_size = getattr(tokenizer, "vocab_size", None)
    sampling = resolve_sampling(inp, cfg, vocab_size)
    if max_model_len <= 0:
        raise ValueError(f"max_model_len={max_model_len!r} is invalid: must be >= 1")

    text = inp.prompt if messages is None else tokenizer.apply_chat_template(messages)
    ids = list(tokenizer.encode(text))
    if messages is not None and not ids:
        raise InvalidArgument("messages", "render to an empty prompt")
    max_tokens = fit_context(len(ids), sampling.max_tokens, max_model_len)
    clipped = max_tokens < sampling.max_tokens
    requested = sampling.max_tokens
    if clipped:
        sampling = replace(sampling, max_tokens=max_tokens)
    return ValidatedRequest(model=model, prompt_token_ids=ids, sampling=sampling,
                            prompt_text=text, clipped=clipped, requested_max_tokens=requested)
