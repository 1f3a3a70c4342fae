"""OpenAI request bodies -> GenerateRequest: what is mapped, what is refused
(and named), defaults."""
from __future__ import annotations

import pytest

from dspark.router.openai_protocol import parse_request
from dspark.shared.errors import InvalidArgument


def test_completion_mapping_and_openai_default_max_tokens():
    req, opts = parse_request({"model": "m", "prompt": ["Hello"], "temperature": 0.5,
                               "top_p": 0.9, "seed": 3, "stop": "\n", "top_k": -1,
                               "ignore_eos": True, "stop_token_ids": [2, 7], "n": 1,
                               "user": "someone", "logprobs": None}, chat=False)
    assert req.prompt == "Hello" and req.model == "m"
    sp = req.sampling
    assert sp.max_tokens == 16 and sp.temperature == 0.5 and sp.seed == 3
    assert list(sp.stop) == ["\n"] and list(sp.stop_token_ids) == [2, 7]
    assert sp.top_k == 0 and sp.ignore_eos  # vLLM's -1 = off
    assert not opts.stream and not opts.chat and not req.return_spec_summary


def test_chat_mapping():
    req, opts = parse_request({
        "messages": [{"role": "developer", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                  {"type": "text", "text": "there"}]}],
        "max_completion_tokens": 5, "stream": True, "stream_options": {"include_usage": True},
        "return_spec_summary": True}, chat=True)
    assert [(m.role, m.content) for m in req.chat.messages] == [
        ("system", "Be brief."), ("user", "Hi there")]
    assert req.sampling.max_tokens == 5 and not req.sampling.HasField("temperature")
    assert opts.stream and opts.include_usage and req.return_spec_summary
    # chat without max_tokens leaves it to the router's default
    req, _ = parse_request({"messages": [{"role": "user", "content": "x"}]}, chat=True)
    assert not req.sampling.HasField("max_tokens")


@pytest.mark.parametrize("body,field", [
    ([], "body"),
    ({"prompt": "x", "n": 4}, "n"),
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
    ({"prompt": "x", "frequency_penalty": 1}, "frequency_penalty"),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": "x", "stop_token_ids": [-3]}, "stop_token_ids"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "model": 3}, "model"),
    ({"prompt": "x", "return_spec_summary": "please"}, "return_spec_summary"),
])
def test_completion_refusals_name_the_field(body, field):
    with pytest.raises(InvalidArgument) as e:
        parse_request(body, chat=False)
    assert e.value.field == field


@pytest.mark.parametrize("body,field", [
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
      "max_completion_tokens": 6}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_object"}}, "response_format"),
])
def test_chat_refusals_name_the_field(body, field):
    with pytest.raises(InvalidArgument) as e:
        parse_request(body, chat=True)
    assert e.value.field == field
