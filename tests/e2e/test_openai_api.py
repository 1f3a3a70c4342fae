"""The router's OpenAI-compatible HTTP API against the running services: the
official `openai` client (streaming and not), and a plain HTTP client for
the error cases."""
from __future__ import annotations

import json

import httpx2 as httpx  # the HTTP client the openai package ships with
import openai
import pytest

from .conftest import MAX_MODEL_LEN, assert_all_blocks_free

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture
def oai(cluster):
    with openai.OpenAI(base_url=f"http://{cluster.http}/v1", api_key="unused",
                       timeout=120, max_retries=0) as c:
        yield c


@pytest.fixture
def http(cluster):
    with httpx.Client(base_url=f"http://{cluster.http}", timeout=120) as c:
        yield c


def test_models(oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "dspark"
    assert models.data[0].max_model_len == MAX_MODEL_LEN  # extra field kept by the client


def test_completion_equals_grpc_greedy(oai, client):
    """Same prompt, greedy: the HTTP text equals the gRPC SDK's text."""
    prompt = "The capital of France is"
    ref = client.generate(prompt=prompt, max_tokens=12, temperature=0, ignore_eos=True)
    out = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert out.choices[0].text == ref.text
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens == ref.usage.prompt_tokens
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12


def test_completion_default_max_tokens_is_openais_16(oai):
    out = oai.completions.create(model=MODEL, prompt="Once upon a time", temperature=0,
                                 extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 16


def test_chat_non_streaming(oai, client):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a fruit."}]
    ref = client.generate(messages=msgs, max_tokens=20, temperature=0)
    out = oai.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    msg = out.choices[0].message
    assert msg.role == "assistant"
    assert msg.content == ref.text and msg.content.strip()
    assert out.choices[0].finish_reason == ref.finish_reason
    assert out.usage.prompt_tokens == ref.usage.prompt_tokens > 10  # chat template applied


def test_chat_streaming_with_usage(oai, client):
    msgs = [{"role": "user", "content": "Count from one to five."}]
    ref = client.generate(messages=msgs, max_tokens=24, temperature=0)
    chunks = list(oai.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(text_chunks) >= 3  # incremental, not one blob
    assert "".join(c.choices[0].delta.content for c in text_chunks) == ref.text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == ref.finish_reason
    # include_usage: a last chunk with no choices and the usage; null before it
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == ref.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == ref.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_streaming_without_usage(oai):
    chunks = list(oai.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=10,
                                         temperature=0, stream=True,
                                         extra_body={"ignore_eos": True}))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert "".join(c.choices[0].text for c in chunks).strip()


def test_stop_string_and_seed(oai):
    a = oai.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20,
                               temperature=0.8, seed=7)
    b = oai.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20,
                               temperature=0.8, seed=7)
    assert a.choices[0].text == b.choices[0].text  # seeded sampling reproduces
    out = oai.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=30,
                                 temperature=0, stop=[" 7"])
    assert " 7" not in out.choices[0].text and out.choices[0].finish_reason == "stop"


def test_spec_summary_on_request(http):
    """return_spec_summary: the response carries a spec_summary field (the
    scheduler's summary, or null while this replica runs without
    speculation); without it, the field is absent."""
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    r = http.post("/v1/completions", json={**body, "return_spec_summary": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert "spec_summary" in out
    s = out["spec_summary"]
    if s is not None:
        assert set(s) >= {"verify_steps", "num_draft_tokens", "num_accepted_tokens",
                          "mean_accepted_length", "per_position_acceptance", "fallback_steps"}
    assert "spec_summary" not in http.post("/v1/completions", json=body).json()
    lines = [ln for ln in http.post("/v1/completions", json={
        **body, "stream": True, "return_spec_summary": True}).text.splitlines()
        if ln.startswith("data: ") and ln != "data: [DONE]"]
    last = json.loads(lines[-1][6:])
    assert last["choices"][0]["finish_reason"] and "spec_summary" in last


def _error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


@pytest.mark.parametrize("patch,param,words", [
    ({"n": 2}, "n", "n=1"),
    ({"top_p": 1.5}, "top_p", "(0, 1]"),
    ({"temperature": -1}, "temperature", ">= 0"),
    ({"max_tokens": 0}, "max_tokens", "1..4096"),
    ({"max_tokens": "ten"}, "max_tokens", "integer"),
    ({"logprobs": 3}, "logprobs", "not supported"),
    ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ({"prompt": ["a", "b"]}, "prompt", "exactly one"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream is true"),
])
def test_bad_completion_input_is_400_naming_the_field(http, patch, param, words):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, **patch}
    err = _error(http.post("/v1/completions", json=body), 400, param=param)
    assert err["type"] == "invalid_request_error"
    assert words in err["message"], err["message"]


def test_bad_chat_input_is_400(http):
    err = _error(http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}), 400,
        param="messages[0].role")
    assert "system, user, assistant" in err["message"]
    _error(http.post("/v1/chat/completions", json={"model": MODEL, "messages": []}), 400,
           param="messages")
    _error(http.post("/v1/chat/completions", content=b"{not json",
                     headers={"Content-Type": "application/json"}), 400, param="body")


def test_prompt_longer_than_context_is_400(http):
    err = _error(http.post("/v1/completions", json={
        "model": MODEL, "prompt": "word " * (MAX_MODEL_LEN + 10)}), 400, param="prompt")
    assert f"max_model_len is {MAX_MODEL_LEN}" in err["message"]


def test_unknown_model_is_404(http):
    err = _error(http.post("/v1/completions", json={"model": "gpt-9", "prompt": "Hi"}), 404,
                 code="model_not_found")
    assert "gpt-9" in err["message"] and MODEL in err["message"]


def test_unknown_route_and_health(http):
    _error(http.get("/v1/nope"), 404)
    r = http.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_openai_client_raises_typed_errors(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model=MODEL, prompt="Hi", n=3)
    assert e.value.status_code == 400 and "n=1" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_client_disconnect_mid_stream_frees_blocks(cluster, http):
    with http.stream("POST", "/v1/completions", json={
            "model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 400,
            "stream": True, "ignore_eos": True}) as r:
        assert r.status_code == 200
        n = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                n += 1
            if n >= 3:
                break  # closes the connection mid-stream
    assert_all_blocks_free(cluster)
