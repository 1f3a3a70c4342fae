from __future__ import annotations

import math

import pytest

from dspark.router.validation import (GenerateInput, fit_context, resolve_sampling,
                                      validate_request)
from dspark.shared.config import RouterConfig
from dspark.shared.errors import InvalidArgument, NotFound
from dspark.shared.types import SamplingParams

MODELS = ("tiny", "other")
CFG = RouterConfig(default_max_tokens=16, max_tokens_limit=100, max_message_chars=50,
                   max_messages=3, max_stop_strings=2, max_stop_chars=8,
                   max_stop_token_ids=2)


def validate(tok, max_model_len=64, **kw):
    return validate_request(GenerateInput(**kw), tok, CFG, max_model_len, MODELS)


def test_prompt_defaults(tok):
    r = validate(tok, prompt="hello world")
    assert r.model == "tiny"
    assert r.prompt_token_ids == tok.encode("hello world")
    s = r.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.stop, s.ignore_eos) == \
        (0.0, 1.0, 0, 16, (), False)
    assert 0 <= s.seed < 2**63 and not r.clipped


def test_random_seed_when_unset_and_kept_when_set(tok):
    seeds = {validate(tok, prompt="hi").sampling.seed for _ in range(4)}
    assert len(seeds) > 1
    assert validate(tok, prompt="hi", seed=0).sampling.seed == 0
    assert validate(tok, prompt="hi", seed=2**64 - 1).sampling.seed == 2**64 - 1


def test_explicit_sampling(tok):
    r = validate(tok, prompt="hi", model="other", temperature=0.7, top_p=0.9, top_k=5,
                 max_tokens=7, stop=["\n", "\n"], stop_token_ids=[3], ignore_eos=True)
    assert r.model == "other"
    assert r.sampling == SamplingParams(temperature=pytest.approx(0.7), top_p=pytest.approx(0.9),
                                        top_k=5, seed=r.sampling.seed, max_tokens=7,
                                        stop_token_ids=(3,), stop=("\n",), ignore_eos=True)


def test_chat_messages_rendered(tok):
    r = validate(tok, messages=[("user", "Hi")])
    assert r.prompt_text.endswith("<|im_start|>assistant\n")
    assert r.prompt_token_ids == tok.encode(r.prompt_text)


def test_max_tokens_clipped_to_context(tok):
    n = len(tok.encode("hello world"))
    r = validate(tok, max_model_len=n + 5, prompt="hello world", max_tokens=50)
    assert r.clipped and r.sampling.max_tokens == 5 and r.requested_max_tokens == 50
    assert fit_context(10, 3, 64) == 3


def test_prompt_too_long_message(tok):
    n = len(tok.encode("hello world"))
    with pytest.raises(InvalidArgument) as e:
        validate(tok, max_model_len=n, prompt="hello world")
    assert e.value.field == "prompt"
    assert f"prompt has {n} tokens, max_model_len is {n}" in str(e.value)


BAD = [
    (dict(), "input", "one of prompt or messages"),
    (dict(prompt="x", messages=[("user", "x")]), "input", "not both"),
    (dict(prompt=""), "prompt", "empty"),
    (dict(prompt="x" * 51), "prompt", "max_message_chars is 50"),
    (dict(prompt="x", model="nope"), "model", "served models: tiny, other"),
    (dict(messages=[]), "messages", "at least one"),
    (dict(messages=[("user", "a")] * 4), "messages", "at most 3"),
    (dict(messages=[("user", "a"), ("tool", "b")]), "messages[1].role",
     "system, user, assistant"),
    (dict(messages=[("user", "x" * 51)]), "messages[0].content", "max_message_chars is 50"),
    (dict(prompt="x", max_tokens=0), "max_tokens", "1..100"),
    (dict(prompt="x", max_tokens=-3), "max_tokens", "1..100"),
    (dict(prompt="x", max_tokens=101), "max_tokens", "max_tokens_limit"),
    (dict(prompt="x", temperature=-0.1), "temperature", ">= 0"),
    (dict(prompt="x", temperature=math.nan), "temperature", "finite"),
    (dict(prompt="x", temperature=math.inf), "temperature", "finite"),
    (dict(prompt="x", top_p=0.0), "top_p", "(0, 1]"),
    (dict(prompt="x", top_p=1.01), "top_p", "(0, 1]"),
    (dict(prompt="x", top_p=math.nan), "top_p", "finite"),
    (dict(prompt="x", top_k=-1), "top_k", ">= 0"),
    (dict(prompt="x", seed=-1), "seed", "2**64"),
    (dict(prompt="x", stop=["a", "b", "c"]), "stop", "at most 2"),
    (dict(prompt="x", stop=["a", ""]), "stop[1]", "non-empty"),
    (dict(prompt="x", stop=["123456789"]), "stop[0]", "max_stop_chars is 8"),
    (dict(prompt="x", stop_token_ids=[1, 2, 3]), "stop_token_ids", "at most 2"),
    (dict(prompt="x", stop_token_ids=[10**6]), "stop_token_ids[0]", "must be in 0.."),
]


@pytest.mark.parametrize("kw,field,text", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_every_error_names_its_field(tok, kw, field, text):
    with pytest.raises(InvalidArgument) as e:
        validate(tok, **kw)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}: ")
    assert text in str(e.value)
    assert isinstance(e.value, ValueError)


def test_no_served_model(tok):
    with pytest.raises(NotFound):
        validate_request(GenerateInput(prompt="x"), tok, CFG, 64, ())


def test_resolve_sampling_without_tokenizer():
    s = resolve_sampling(GenerateInput(prompt="x", stop="END", stop_token_ids=[7]), CFG)
    assert s.stop == ("END",) and s.stop_token_ids == (7,) and s.max_tokens == 16
