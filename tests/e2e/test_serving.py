"""The three services end to end on the real default model (fp32)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dspark.shared import errors

from .conftest import MAX_MODEL_LEN, assert_all_blocks_free, scheduler_loads

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three laws of thermodynamics are",
    "Water boils at",
    "import numpy as np\n\n",
    "List three primary colors:",
    "Speculative decoding works by",
]


def test_every_service_reports_ready(cluster):
    targets = [(cluster.router, "dspark.v1.Router")]
    targets += [(a, "dspark.v1.Scheduler") for a in cluster.schedulers]
    targets += [(a, "dspark.v1.Worker") for a in cluster.workers]
    for addr, name in targets:
        with grpc.insecure_channel(addr) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for service in ("", name):
                r = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert r.status == health_pb2.HealthCheckResponse.SERVING, (addr, service)


def test_list_models(client):
    models = client.list_models()
    assert [m.name for m in models] == ["SmolLM2-135M-Instruct"]
    assert models[0].max_model_len == MAX_MODEL_LEN
    assert models[0].num_replicas == 2


def test_streaming_chat_delivers_text_incrementally(client):
    chunks = list(client.stream(messages=[{"role": "user", "content": "Name a fruit."}],
                                max_tokens=24, temperature=0))
    assert len(chunks) >= 3  # tokens arrive as they commit, not all at the end
    final = chunks[-1]
    assert final.finish_reason in ("stop", "length")
    assert final.usage.completion_tokens == sum(len(c.token_ids) for c in chunks)
    assert final.usage.prompt_tokens > 10  # chat template applied
    text = "".join(c.text for c in chunks)
    assert text.strip() and "<|im" not in text
    assert all(c.finish_reason is None for c in chunks[:-1])


def _greedy(client, prompt, n=64):
    return client.generate(prompt=prompt, max_tokens=n, temperature=0, ignore_eos=True)


def test_concurrent_greedy_equals_one_at_a_time(client, cluster):
    """fp32 greedy text of 8 requests in flight together (batched decode,
    prefill chunks mixed with decode rows, two replicas) equals the text of
    the same requests run one at a time."""
    alone = [_greedy(client, p) for p in PROMPTS]
    seen_busy = set()
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            for addr, ld in zip(cluster.schedulers, scheduler_loads(cluster)):
                if ld.num_running >= 2:
                    seen_busy.add(addr)
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: _greedy(client, p), PROMPTS))
    stop.set()
    t.join()
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert a.text == b.text
        assert len(a.token_ids) == 64 and a.finish_reason == "length"
    # Routing spread the load over both replicas, and each batched requests.
    assert seen_busy == set(cluster.schedulers)
    assert_all_blocks_free(cluster)


def test_seeded_sampling_is_reproducible(client):
    kw = dict(prompt="Write a haiku about the sea.", max_tokens=32, temperature=1.0,
              top_p=0.95, ignore_eos=True)
    a = client.generate(seed=1234, **kw)
    b = client.generate(seed=1234, **kw)
    c = client.generate(seed=999, **kw)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_stop_string_truncates_text(client):
    base = _greedy(client, "Count: 1, 2, 3, 4, 5,", n=24).text
    assert ", 8" in base, base  # the model counts on
    out = client.generate(prompt="Count: 1, 2, 3, 4, 5,", max_tokens=24, temperature=0,
                          stop=[", 8"])
    assert out.finish_reason == "stop"
    assert out.text == base[: base.index(", 8")]


def test_abort_ends_stream_and_frees_blocks(client, cluster):
    stream = client.stream(prompt="Tell me a very long story.", max_tokens=400,
                           temperature=0, ignore_eos=True, request_id="abort-me")
    it = iter(stream)
    first = next(it)
    assert first.request_id == "abort-me"
    assert client.abort("abort-me") is True
    rest = list(it)
    assert rest and rest[-1].finish_reason == "abort"
    assert sum(len(c.token_ids) for c in [first, *rest]) < 400
    assert_all_blocks_free(cluster)
    assert client.abort("abort-me") is False  # idempotent: gone now


def test_client_disconnect_frees_blocks(client, cluster):
    stream = client.stream(prompt="Tell me a very long story.", max_tokens=400,
                           temperature=0, ignore_eos=True)
    it = iter(stream)
    next(it)
    next(it)
    # Mid-request, blocks are held ...
    assert any(ld.free_kv_blocks < ld.total_kv_blocks for ld in scheduler_loads(cluster))
    stream.cancel()  # ... the client goes away ...
    assert_all_blocks_free(cluster)  # ... and they all come back.


def test_disconnect_of_a_killed_client_process_frees_blocks(cluster):
    code = (
        "import sys; from dspark.shared.client import Client\n"
        f"c = Client({cluster.router!r})\n"
        "for i, ch in enumerate(c.stream(prompt='Tell me a story.', max_tokens=500, ignore_eos=True)):\n"
        "    print(i, flush=True)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    for _ in range(3):
        assert p.stdout.readline()
    p.kill()
    p.wait()
    assert_all_blocks_free(cluster)


BAD = [
    (dict(prompt=""), "prompt"),
    (dict(prompt="x " * 1500), "max_model_len"),
    (dict(prompt="hi", max_tokens=0), "max_tokens"),
    (dict(prompt="hi", max_tokens=-5), "max_tokens"),
    (dict(prompt="hi", max_tokens=10**6), "max_tokens"),
    (dict(prompt="hi", temperature=-0.5), "temperature"),
    (dict(prompt="hi", top_p=0.0), "top_p"),
    (dict(prompt="hi", top_p=1.5), "top_p"),
    (dict(prompt="hi", top_k=-1), "top_k"),
    (dict(prompt="hi", model="no-such-model"), "model"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), "role"),
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "user", "content": "y" * 200_001}]), "content"),
    (dict(prompt="y" * 200_001), "prompt"),
]


def test_bad_input_is_rejected_without_harming_requests_in_flight(client, cluster):
    reference = _greedy(client, PROMPTS[2], n=96)
    result = {}

    def long_request():
        result["out"] = _greedy(client, PROMPTS[2], n=96)

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.5)
    for kwargs, field in BAD:
        kwargs.setdefault("max_tokens", 8)
        with pytest.raises(errors.InvalidArgument) as ei:
            client.generate(**kwargs)
        assert field in str(ei.value), (kwargs, str(ei.value))
    t.join()
    assert result["out"].token_ids == reference.token_ids
    assert_all_blocks_free(cluster)


def test_limit_messages_name_the_limit(client):
    with pytest.raises(errors.InvalidArgument) as ei:
        client.generate(prompt="hi", max_tokens=10**6)
    assert "4096" in str(ei.value)
    with pytest.raises(errors.InvalidArgument) as ei:
        client.generate(prompt="x " * 1500)
    assert str(MAX_MODEL_LEN) in str(ei.value)


def test_cli_generate_prints_text(cluster):
    out = subprocess.run(
        [sys.executable, "-m", "dspark.shared.cli", "generate", "--prompt", "The capital of France is",
         "--max-tokens", "8", "--temperature", "0", "--router", cluster.router],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


def test_cli_generate_reports_bad_input(cluster):
    out = subprocess.run(
        [sys.executable, "-m", "dspark.shared.cli", "generate", "--prompt", "hi",
         "--temperature", "-1", "--router", cluster.router],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "temperature" in out.stderr


def test_logs_carry_request_id_from_router_to_worker(client, cluster):
    client.generate(prompt="Hello", max_tokens=4, request_id="trace-me-42")
    time.sleep(0.3)
    router_log = (cluster.log_dir / "router.log").read_text()
    sched_logs = "".join((cluster.log_dir / f"scheduler-{i}.log").read_text() for i in range(2))
    assert '"request_id": "trace-me-42"' in router_log
    assert '"request_id": "trace-me-42"' in sched_logs
    worker_logs = "".join((cluster.log_dir / f"worker-{i}.log").read_text() for i in range(2))
    assert '"request_id": "trace-me-42"' in worker_logs


def test_async_client_streams_and_cancels(cluster):
    import asyncio

    from dspark.shared.client import AsyncClient

    async def main():
        async with AsyncClient(cluster.router, timeout=120) as client:
            out = await client.generate(prompt="The capital of France is", max_tokens=8,
                                        temperature=0)
            assert "Paris" in out.text
            n = 0
            async for chunk in client.stream(prompt="Tell me a long story.", max_tokens=300,
                                             ignore_eos=True):
                n += len(chunk.token_ids)
                if n >= 3:
                    break  # leaving the loop cancels the RPC
            return n

    assert asyncio.run(main()) >= 3
    assert_all_blocks_free(cluster)
