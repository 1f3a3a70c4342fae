"""A hardened cluster of real processes (2 replicas): TLS on every gRPC hop
and on the HTTP API, mutual TLS between router, scheduler and worker, API
keys and a per-key rate limit on the public API; certificates made at test
time. Then graceful drain with SIGTERM (the last tests: they stop the
processes).

Public side: the router serves TLS with a server certificate (clients verify
it with the CA) and wants an API key. Internal side: schedulers and workers
require a client certificate signed by the CA (mutual TLS).
"""
from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx2 as httpx
import openai
import pytest

from dspark.shared import errors
from dspark.shared.client import Client
from dspark.shared.launcher import start_cluster
from dspark.shared.security import ClientTLS, sync_channel
from dspark.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc
from ops.certs import make_pki

from .conftest import _free_port_block

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

KEY = "sk-dspark-e2e-0123456789abcdef"
LIMITED_KEY = "sk-dspark-e2e-limited-00000000"
SMALL_KEY = "sk-dspark-e2e-small-0000000000"
DRAIN_TIMEOUT = 60.0  # ample: the requests below must finish by themselves
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def secure(default_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("secure")
    pki = make_pki(d / "pki")
    keys = d / "api-keys.txt"
    keys.write_text(f"# e2e\nci {KEY}\nlimited {LIMITED_KEY}\n"
                    f"small {SMALL_KEY} max_request_bytes=2048 rps=50 burst=50\n")
    server = ["--tls-cert", pki.server_cert, "--tls-key", pki.server_key,
              "--drain-timeout", str(DRAIN_TIMEOUT)]
    mutual = [*server, "--tls-client-ca", pki.ca]
    upstream = ["--tls-ca", pki.ca, "--tls-client-cert", pki.client_cert,
                "--tls-client-key", pki.client_key]
    base = _free_port_block(11)
    c = start_cluster(
        replicas=2, router_port=base, base_port=base + 1, http_port=base + 5,
        metrics_base_port=base + 6,
        worker_args=["--dtype", "float32", "--max-model-len", "1024", "--num-kv-blocks", "256",
                     "--num-threads", "1", *mutual],
        scheduler_args=["--max-num-seqs", "8", *mutual, *upstream],
        router_args=[*server, *upstream, "--api-keys-file", str(keys),
                     "--rate-limit-rps", "2", "--rate-limit-burst", "5"],
        log_dir=d / "logs", timeout_s=300,
        tls=ClientTLS(pki.ca, pki.client_cert, pki.client_key), api_key=KEY)
    c.pki = pki
    c.log_dir = d / "logs"
    yield c
    c.stop()


def sdk(c, **kw) -> Client:
    args = dict(timeout=120, api_key=KEY, tls_root_cert=c.pki.ca)
    args.update(kw)
    return Client(c.router, **args)


# -- TLS on the public gRPC API ------------------------------------------------


def test_tls_client_with_ca_and_key_succeeds(secure):
    with sdk(secure) as cl:
        out = cl.generate(prompt="The capital of France is", max_tokens=5, temperature=0,
                          ignore_eos=True)
        assert out.usage.completion_tokens == 5 and out.text
        assert [m.num_replicas for m in cl.list_models()] == [2]


def test_plaintext_client_is_refused(secure):
    with Client(secure.router, timeout=10, api_key=KEY) as cl:
        with pytest.raises(errors.Unavailable):
            cl.generate(prompt="Hi", max_tokens=2)


def test_client_trusting_another_ca_is_refused(secure):
    with sdk(secure, tls_root_cert=secure.pki.rogue_ca, timeout=10) as cl:
        with pytest.raises(errors.Unavailable):
            cl.generate(prompt="Hi", max_tokens=2)


def test_api_key_missing_or_wrong_is_unauthenticated(secure, caplog):
    with sdk(secure, api_key=None) as cl:
        with pytest.raises(errors.Unauthenticated, match="missing API key"):
            cl.generate(prompt="Hi", max_tokens=2)
    with sdk(secure, api_key="sk-wrong-key-000000000000") as cl:
        with pytest.raises(errors.Unauthenticated, match="invalid API key"):
            cl.generate(prompt="Hi", max_tokens=2)
        with pytest.raises(errors.Unauthenticated):
            cl.list_models()
    # Keys never reach the logs.
    log = (secure.log_dir / "router.log").read_text()
    assert "rpc_unauthenticated" in log
    assert KEY not in log and "sk-wrong-key" not in log


# -- mutual TLS inside -----------------------------------------------------------


def _get_load(addr, tls):
    with sync_channel(addr, tls) as ch:
        return scheduler_pb2_grpc.SchedulerStub(ch).GetLoad(scheduler_pb2.GetLoadRequest(),
                                                            timeout=5)


def test_scheduler_and_worker_require_a_client_certificate(secure):
    pki = secure.pki
    sched, worker = secure.schedulers[0], secure.workers[0]
    good = ClientTLS(pki.ca, pki.client_cert, pki.client_key)
    assert _get_load(sched, good).total_kv_blocks == 256
    for bad in (ClientTLS(pki.ca),  # no client certificate
                ClientTLS(pki.ca, pki.rogue_client_cert, pki.rogue_client_key),  # untrusted
                None):  # plaintext
        with pytest.raises(grpc.RpcError) as e:
            _get_load(sched, bad)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    with sync_channel(worker, good) as ch:
        assert worker_pb2_grpc.WorkerStub(ch).Info(worker_pb2.InfoRequest(), timeout=5) \
            .num_kv_blocks == 256
    with sync_channel(worker, ClientTLS(pki.ca, pki.rogue_client_cert,
                                        pki.rogue_client_key)) as ch:
        with pytest.raises(grpc.RpcError):
            worker_pb2_grpc.WorkerStub(ch).Info(worker_pb2.InfoRequest(), timeout=5)


def test_health_command_speaks_tls(secure):
    pki = secure.pki

    def health(*extra):
        return subprocess.run(
            [sys.executable, "-m", "dspark.shared.cli", "health", "--address", secure.workers[1],
             "--service", "dspark.v1.Worker", *extra], capture_output=True, text=True, timeout=60)

    ok = health("--tls-ca", pki.ca, "--tls-client-cert", pki.client_cert,
                "--tls-client-key", pki.client_key)
    assert ok.returncode == 0 and "SERVING" in ok.stdout
    assert health().returncode == 1  # plaintext against a TLS port
    named = ["--tls-ca", pki.ca, "--tls-client-cert", pki.client_cert,
             "--tls-client-key", pki.client_key, "--tls-server-name"]
    assert health(*named, "localhost").returncode == 0  # a name the certificate has
    assert health(*named, "dspark-worker-9").returncode == 1  # one it has not


# -- the HTTP API over TLS ------------------------------------------------------


def _https(c, **kw):
    return httpx.Client(base_url=f"https://{c.http}", verify=ssl.create_default_context(
        cafile=c.pki.ca), timeout=120, **kw)


def test_openai_client_over_https_with_key(secure):
    with _https(secure) as http_client, openai.OpenAI(
            base_url=f"https://{secure.http}/v1", api_key=KEY, http_client=http_client,
            max_retries=0) as oai:
        out = oai.chat.completions.create(model=MODEL, max_tokens=6, temperature=0,
                                          messages=[{"role": "user", "content": "Hi!"}])
        assert out.choices[0].message.content and out.usage.completion_tokens <= 6
        chunks = list(oai.completions.create(model=MODEL, prompt="Once", max_tokens=4,
                                             stream=True, extra_body={"ignore_eos": True}))
        assert chunks[-1].choices[0].finish_reason == "length"
    with _https(secure) as http_client, openai.OpenAI(
            base_url=f"https://{secure.http}/v1", api_key="sk-not-a-real-key-0000",
            http_client=http_client, max_retries=0) as oai:
        with pytest.raises(openai.AuthenticationError) as e:
            oai.models.list()
        assert e.value.status_code == 401


def test_http_refuses_plaintext_and_unknown_ca(secure):
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{secure.http}/health", timeout=5)
    with pytest.raises(httpx.HTTPError):  # the system roots do not know our CA
        httpx.get(f"https://{secure.http}/health", timeout=5)
    with _https(secure) as h:
        assert h.get("/health").json() == {"status": "ok"}
        r = h.post("/v1/completions", json={"model": MODEL, "prompt": "Hi"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_metrics_served_over_tls(secure):
    """Every metrics port serves TLS; those of the schedulers and workers
    (mutual TLS, --tls-client-ca) refuse a scrape without a client
    certificate of the CA, as their gRPC ports do; the router's (server TLS
    only) does not ask for one."""
    pki = secure.pki
    good = ClientTLS(pki.ca, pki.client_cert, pki.client_key).ssl_context()
    anonymous = ClientTLS(pki.ca).ssl_context()
    rogue = ClientTLS(pki.ca, pki.rogue_client_cert, pki.rogue_client_key).ssl_context()
    assert set(secure.metrics) == {"router", "scheduler-0", "worker-0", "scheduler-1",
                                   "worker-1"}
    for name, addr in secure.metrics.items():
        with httpx.Client(verify=good) as h:
            r = h.get(f"https://{addr}/metrics", timeout=10)
            assert r.status_code == 200 and "_ready 1.0" in r.text, name
        if name == "router":
            with httpx.Client(verify=anonymous) as h:
                assert h.get(f"https://{addr}/metrics", timeout=10).status_code == 200
            continue
        for bad in (anonymous, rogue):
            with httpx.Client(verify=bad) as h:
                with pytest.raises(httpx.HTTPError):
                    h.get(f"https://{addr}/metrics", timeout=10)


def test_rate_limit_per_key(secure):
    """Burst 5, 2/s: the 6th quick request of one key is refused (HTTP 429,
    gRPC RESOURCE_EXHAUSTED), while another key is not affected."""
    bad = {"model": MODEL, "prompt": "Hi", "top_p": 2.0}  # fast: 400 after admission
    auth = {"Authorization": f"Bearer {LIMITED_KEY}"}
    with _https(secure) as h:
        codes = [h.post("/v1/completions", json=bad, headers=auth).status_code
                 for _ in range(8)]
        assert codes[:5] == [400] * 5 and 429 in codes[5:], codes
        r = h.post("/v1/completions", json=bad, headers=auth)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert "rate_limit_rps" in r.json()["error"]["message"]
        ok = h.post("/v1/completions", json=bad, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 400  # the other key still has its burst
    with sdk(secure, api_key=LIMITED_KEY) as cl:
        with pytest.raises(errors.ResourceExhausted, match="rate limit exceeded"):
            cl.generate(prompt="Hi", max_tokens=1)


def test_request_size_limit_per_key(secure):
    """The 'small' key has max_request_bytes=2048: a 2.5 kB prompt is refused
    for it (gRPC INVALID_ARGUMENT, HTTP 413) and served for the other key."""
    prompt = "hello world " * 210
    with sdk(secure, api_key=SMALL_KEY) as cl:
        with pytest.raises(errors.InvalidArgument, match="over max_request_bytes=2048") as e:
            cl.generate(prompt=prompt, max_tokens=1)
        assert e.value.field == "request"
        assert cl.generate(prompt="Hi", max_tokens=1).usage.completion_tokens == 1
    with sdk(secure) as cl:
        assert cl.generate(prompt=prompt, max_tokens=1).usage.completion_tokens == 1
    with _https(secure) as h:
        r = h.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1},
                   headers={"Authorization": f"Bearer {SMALL_KEY}"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_no_key_ever_reaches_the_logs(secure):
    """After every test above (good, wrong and rate-limited keys over gRPC
    and HTTP): no key, right or wrong, is in any service's log."""
    logs = "".join(p.read_text() for p in secure.log_dir.glob("*.log"))
    assert "unauthenticated" in logs  # the refusals were logged, by method/path only
    for secret in (KEY, LIMITED_KEY, SMALL_KEY, "sk-wrong-key", "sk-not-a-real-key"):
        assert secret not in logs, secret


# -- graceful drain (these stop processes: keep them last) ----------------------------


def _wait(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Streamer(threading.Thread):
    """One long streaming request in the background."""

    def __init__(self, c, max_tokens: int):
        super().__init__(daemon=True)
        self.c, self.max_tokens = c, max_tokens
        self.chunks, self.error, self.first = [], None, threading.Event()
        self.done_at = None

    def run(self):
        try:
            with sdk(self.c) as cl:
                for ch in cl.stream(prompt="Write a long story about a lighthouse.",
                                    max_tokens=self.max_tokens, temperature=0, ignore_eos=True):
                    self.chunks.append(ch)
                    self.first.set()
        except Exception as e:  # noqa: BLE001 - inspected by the test
            self.error = e
        finally:
            self.done_at = time.monotonic()
            self.first.set()


def test_sigterm_on_a_replica_lets_its_request_finish_and_stops_routing_to_it(secure):
    good = ClientTLS(secure.pki.ca, secure.pki.client_cert, secure.pki.client_key)
    s = Streamer(secure, max_tokens=80)
    s.start()
    assert s.first.wait(60) and s.error is None
    busy = [i for i, a in enumerate(secure.schedulers) if _get_load(a, good).num_running == 1]
    assert len(busy) == 1
    i = busy[0]
    sched, worker = secure.proc(f"scheduler-{i}"), secure.proc(f"worker-{i}")
    t_term = time.monotonic()
    sched.send_signal(signal.SIGTERM)
    worker.send_signal(signal.SIGTERM)
    # The router sees the replica stop accepting and takes it out of rotation.
    with sdk(secure) as cl:
        _wait(lambda: [m.num_replicas for m in cl.list_models()] == [1], 5, "1 replica left")
        # New work goes to the other replica meanwhile.
        out = cl.generate(prompt="Water boils at", max_tokens=4, temperature=0, ignore_eos=True)
        assert out.usage.completion_tokens == 4
    assert sched.poll() is None and worker.poll() is None  # still finishing the request
    s.join(120)
    assert s.error is None, s.error
    assert s.chunks[-1].finish_reason == "length"
    assert s.chunks[-1].usage.completion_tokens == 80
    assert sched.wait(30) == 0 and worker.wait(30) == 0
    assert s.done_at - t_term < DRAIN_TIMEOUT  # it finished by itself, not by the timeout
    log = (secure.log_dir / f"scheduler-{i}.log").read_text()
    assert '"drained"' in log and "drain_timeout" not in log.split('"stopping"')[-1]


def test_sigterm_on_the_router_refuses_new_work_and_finishes_in_flight(secure):
    s = Streamer(secure, max_tokens=40)
    s.start()
    assert s.first.wait(60) and s.error is None
    router = secure.proc("router")
    router.send_signal(signal.SIGTERM)
    with sdk(secure, timeout=10) as cl:
        _wait(lambda: _refused(cl), 5, "the router to refuse new requests")
    with _https(secure) as h:
        r = h.get("/health")
        assert r.status_code == 503 and r.json() == {"status": "draining"}
        r = h.post("/v1/completions", json={"model": MODEL, "prompt": "Hi"},
                   headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 503 and "draining" in r.json()["error"]["message"]
    assert router.poll() is None  # still streaming the request in flight
    s.join(120)
    assert s.error is None, s.error
    assert s.chunks[-1].usage.completion_tokens == 40
    assert router.wait(30) == 0


def _refused(cl) -> bool:
    try:
        cl.generate(prompt="Hi", max_tokens=1)
    except errors.Unavailable as e:
        return "router is draining" in str(e)
    return False
