"""The HTTP API over a fake router servicer: status codes and OpenAI error
shapes for every failure class, keys, rate limits, sizes, the spec summary."""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dspark.router.http_api import OpenAIApi
from dspark.shared import errors
from dspark.shared.metrics import RouterMetrics
from dspark.shared.security import ApiKeys, Gate, RateLimiter
from dspark.v1 import common_pb2, router_pb2

KEY = "sk-unit-0123456789abcdef"


class FakeRouter:
    """Streams 'Hello' ' world' or raises ``fail``."""

    def __init__(self, fail=None, ready=True, spec=None):
        self.fail, self.ready, self.spec = fail, ready, spec
        self.draining = False
        self.requests = []

    def served_models(self):
        return ["tiny"] if self.ready else []

    async def ListModels(self, request, context):
        return router_pb2.ListModelsResponse(models=[
            router_pb2.ModelCard(name="tiny", max_model_len=128, num_replicas=1)])

    async def Generate(self, request, context):
        self.requests.append(request)
        if self.fail is not None:
            raise self.fail
        yield router_pb2.GenerateResponse(request_id=request.request_id, text="Hello",
                                          token_ids=[1])
        last = router_pb2.GenerateResponse(
            request_id=request.request_id, text=" world", token_ids=[2],
            finish_reason=common_pb2.FINISH_REASON_LENGTH,
            usage=common_pb2.Usage(prompt_tokens=3, completion_tokens=2))
        if request.return_spec_summary and self.spec is not None:
            last.spec_summary.CopyFrom(self.spec)
        yield last


def run(fake, fn, keys=None, rate=0.0, max_bytes=4096):
    async def go():
        api = OpenAIApi(fake, Gate(keys, RateLimiter(rate, 1)), RouterMetrics(),
                        max_request_bytes=max_bytes)
        async with TestClient(TestServer(api.app)) as c:
            return await fn(c)

    return asyncio.run(go())


async def post(c, path, body, **kw):
    r = await c.post(path, data=json.dumps(body) if not isinstance(body, bytes) else body,
                     headers={"Content-Type": "application/json", **kw.pop("headers", {})}, **kw)
    return r.status, r.headers, await r.text()


BODY = {"model": "tiny", "prompt": "Hi", "max_tokens": 2}


def err_of(text):
    e = json.loads(text)["error"]
    assert set(e) == {"message", "type", "param", "code"}
    return e


@pytest.mark.parametrize("exc,status,code", [
    (errors.InvalidArgument("top_p", "must be in (0, 1], got 2.0"), 400, None),
    (errors.NotFound("no model is being served"), 404, "model_not_found"),
    (errors.ResourceExhausted("queue is full (max_waiting=4)"), 429, "overloaded"),
    (errors.Unavailable("no scheduler replica is ready"), 503, "not_ready"),
    (errors.Internal("boom"), 500, None),
])
def test_errors_map_to_status_and_openai_shape(exc, status, code):
    st, _, text = run(FakeRouter(fail=exc), lambda c: post(c, "/v1/completions", BODY))
    assert st == status
    e = err_of(text)
    assert e["code"] == code
    if status == 400:
        assert e["param"] == "top_p" and "(0, 1]" in e["message"]
    if status == 500:
        assert e["message"] == "internal server error"  # no internals leak


def test_api_key_required_on_v1_but_not_on_health_and_metrics(tmp_path):
    p = tmp_path / "k"
    p.write_text(f"ci {KEY}\n")
    keys = ApiKeys.from_file(str(p))

    async def go(c):
        out = {}
        out["none"] = await post(c, "/v1/completions", BODY)
        out["bad"] = await post(c, "/v1/completions", BODY,
                                headers={"Authorization": "Bearer sk-wrong-000000000000"})
        out["good"] = await post(c, "/v1/completions", BODY,
                                 headers={"Authorization": f"Bearer {KEY}"})
        out["models"] = (await c.get("/v1/models")).status
        out["health"] = (await c.get("/health")).status
        out["metrics"] = (await c.get("/metrics")).status
        return out

    out = run(FakeRouter(), go, keys=keys)
    assert out["none"][0] == 401 and err_of(out["none"][2])["code"] == "invalid_api_key"
    assert out["bad"][0] == 401 and "sk-wrong" not in out["bad"][2]
    assert out["good"][0] == 200
    assert out["models"] == 401
    assert out["health"] == 200 and out["metrics"] == 200


def test_rate_limit_is_429_with_retry_after():
    async def go(c):
        return [await post(c, "/v1/completions", BODY) for _ in range(2)]

    (s1, _, _), (s2, h2, t2) = run(FakeRouter(), go, rate=0.5)
    assert s1 == 200 and s2 == 429
    assert err_of(t2)["code"] == "rate_limit_exceeded" and int(h2["Retry-After"]) >= 1


def test_body_over_max_request_bytes_is_413():
    big = dict(BODY, prompt="x" * 5000)
    st, _, text = run(FakeRouter(), lambda c: post(c, "/v1/completions", big), max_bytes=4096)
    assert st == 413 and "at most 4096 bytes" in err_of(text)["message"]


def test_not_ready_and_draining_health():
    async def health(c):
        r = await c.get("/health")
        return r.status, await r.json()

    assert run(FakeRouter(ready=False), health) == (503, {"status": "not_ready"})
    f = FakeRouter()
    f.draining = True
    assert run(f, health) == (503, {"status": "draining"})


def test_unknown_model_is_404_before_generating():
    f = FakeRouter()
    st, _, text = run(f, lambda c: post(c, "/v1/completions", dict(BODY, model="gpt-9")))
    assert st == 404 and "gpt-9" in err_of(text)["message"] and f.requests == []


SPEC = common_pb2.SpecSummary(verify_steps=2, num_draft_tokens=8, num_accepted_tokens=5,
                              mean_accepted_length=3.5, per_position_acceptance=[1.0, 0.75],
                              fallback_steps=1, num_speculative_tokens=4,
                              unverified_steps=3, verified_per_position=[2, 2],
                              accepted_per_position=[2, 1])


def test_spec_summary_non_streaming_and_streaming():
    f = FakeRouter(spec=SPEC)
    body = dict(BODY, return_spec_summary=True)
    st, _, text = run(f, lambda c: post(c, "/v1/completions", body))
    assert st == 200 and f.requests[0].return_spec_summary
    out = json.loads(text)
    assert out["choices"][0]["text"] == "Hello world"
    assert out["spec_summary"] == {
        "verify_steps": 2, "num_draft_tokens": 8, "num_accepted_tokens": 5,
        "mean_accepted_length": 3.5, "per_position_acceptance": [1.0, 0.75],
        "fallback_steps": 1, "num_speculative_tokens": 4, "unverified_steps": 3,
        "verified_per_position": [2, 2], "accepted_per_position": [2, 1]}
    st, h, text = run(f, lambda c: post(c, "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "stream": True,
        "return_spec_summary": True, "stream_options": {"include_usage": True}}))
    assert h["Content-Type"].startswith("text/event-stream")
    events = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert final[0]["spec_summary"]["num_accepted_tokens"] == 5
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 5


def test_error_after_stream_started_is_an_error_event():
    class MidFail(FakeRouter):
        async def Generate(self, request, context):
            yield router_pb2.GenerateResponse(text="Hel", token_ids=[1])
            raise errors.Unavailable("scheduler lost")

    st, _, text = run(MidFail(), lambda c: post(c, "/v1/completions", dict(BODY, stream=True)))
    assert st == 200
    events = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["text"] == "Hel"
    assert json.loads(events[1])["error"]["message"] == "scheduler lost"
    assert events[-1] == "[DONE]"


def test_per_key_request_size_is_413(tmp_path):
    p = tmp_path / "k"
    p.write_text(f"small {KEY} max_request_bytes=1024\n")
    keys = ApiKeys.from_file(str(p))
    auth = {"Authorization": f"Bearer {KEY}"}

    async def go(c):
        small = await post(c, "/v1/completions", BODY, headers=auth)
        big = await post(c, "/v1/completions", dict(BODY, prompt="x" * 1500), headers=auth)
        return small, big

    (s1, _, _), (s2, _, text) = run(FakeRouter(), go, keys=keys)
    assert s1 == 200 and s2 == 413
    e = err_of(text)
    assert e["param"] == "request" and "max_request_bytes=1024" in e["message"]
