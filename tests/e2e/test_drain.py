"""One replica with a one-request batch and a one-request queue: a third
concurrent request is refused as overloaded (HTTP 429, gRPC
RESOURCE_EXHAUSTED); SIGTERM on the worker alone drains the replica and a
restarted worker brings it back; then --drain-timeout bounds the drain: a
request longer than it is ended with a clear UNAVAILABLE, and the scheduler
exits (code 0) shortly after the timeout, not after the request (last: it
stops processes)."""
from __future__ import annotations

import signal
import subprocess
import threading
import time

import httpx2 as httpx
import pytest

from dspark.shared import errors
from dspark.shared.client import Client
from dspark.shared.launcher import start_cluster

from .conftest import _free_port_block, scheduler_loads

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def small(default_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("drain-logs")
    base = _free_port_block(4)
    c = start_cluster(
        replicas=1, router_port=base, base_port=base + 1, http_port=base + 3,
        worker_args=["--dtype", "float32", "--max-model-len", "1024", "--num-kv-blocks", "128",
                     "--num-threads", "1", "--drain-timeout", "30"],
        scheduler_args=["--drain-timeout", "2", "--max-num-seqs", "1", "--max-waiting", "1"],
        log_dir=log_dir, timeout_s=300)
    c.log_dir = log_dir
    yield c
    c.stop()


class Streamer(threading.Thread):
    def __init__(self, c, max_tokens: int):
        super().__init__(daemon=True)
        self.c, self.max_tokens = c, max_tokens
        self.n, self.error, self.first = 0, None, threading.Event()

    def run(self):
        try:
            with Client(self.c.router, timeout=120) as cl:
                for ch in cl.stream(prompt="Write a very long story.", max_tokens=self.max_tokens,
                                    temperature=0, ignore_eos=True):
                    self.n += len(ch.token_ids)
                    self.first.set()
        except errors.DSparkError as e:
            self.error = e
        finally:
            self.first.set()


def test_full_queue_is_429_overloaded(small):
    running, queued = Streamer(small, 60), None
    running.start()
    assert running.first.wait(60)
    queued = Streamer(small, 4)
    queued.start()
    # now one runs and one waits: the queue is full (polled, not slept: on a
    # loaded machine the second request may take a while to reach the queue)
    deadline = time.monotonic() + 30
    while not any(ld.num_waiting == 1 for ld in scheduler_loads(small)):
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.05)
    r = httpx.post(f"http://{small.http}/v1/completions", timeout=30,
                   json={"model": "SmolLM2-135M-Instruct", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 429, r.text
    err = r.json()["error"]
    assert err["code"] == "overloaded" and "max_waiting=1" in err["message"]
    with Client(small.router, timeout=30) as cl:
        with pytest.raises(errors.ResourceExhausted, match="waiting queue is full"):
            cl.generate(prompt="Hi", max_tokens=2)
    running.join(120)
    queued.join(120)
    assert running.error is None and running.n == 60
    assert queued.error is None and queued.n == 4


def _replicas(c) -> int:
    with Client(c.router, timeout=10) as cl:
        return sum(m.num_replicas for m in cl.list_models())


def _wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_sigterm_on_the_worker_alone_drains_the_replica_and_a_new_worker_resumes_it(small):
    """The worker's readiness goes NOT_SERVING: its scheduler stops admitting
    (the router sees no accepting replica and answers 503), the request in
    flight still completes, the worker exits 0 once idle; a worker started
    again brings the replica back."""
    s = Streamer(small, 50)
    s.start()
    assert s.first.wait(60)
    worker = small.proc("worker-0")
    worker.send_signal(signal.SIGTERM)
    _wait(lambda: _replicas(small) == 0, 10, "the replica to stop accepting")
    r = httpx.post(f"http://{small.http}/v1/completions", timeout=30,
                   json={"model": "SmolLM2-135M-Instruct", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 503, r.text
    s.join(120)
    assert s.error is None and s.n == 50  # finished on the draining worker
    assert worker.wait(30) == 0
    assert small.proc("scheduler-0").poll() is None  # the scheduler waits for a worker
    # a new worker (same flags) brings the replica back
    log = open(small.log_dir / "worker-0.log", "ab")
    new = subprocess.Popen(worker.args, stdout=log, stderr=log, start_new_session=True)
    small.procs[[n for n, _ in small.procs].index("worker-0")] = ("worker-0", new)
    _wait(lambda: _replicas(small) == 1, 120, "the replica to come back")
    with Client(small.router, timeout=60) as cl:
        out = cl.generate(prompt="Water boils at", max_tokens=4, temperature=0, ignore_eos=True)
    assert out.usage.completion_tokens == 4
    sched_log = (small.log_dir / "scheduler-0.log").read_text()
    assert '"worker_not_ready"' in sched_log and '"worker_ready"' in sched_log


def test_request_longer_than_the_drain_timeout_is_cut_and_the_scheduler_exits(small):
    s = Streamer(small, 900)
    s.start()
    assert s.first.wait(60)
    sched = small.proc("scheduler-0")
    t0 = time.monotonic()
    sched.send_signal(signal.SIGTERM)
    small.proc("worker-0").send_signal(signal.SIGTERM)
    assert sched.wait(30) == 0
    took = time.monotonic() - t0
    s.join(30)
    assert 1.5 < took < 8.0, f"scheduler took {took:.1f}s to stop with --drain-timeout 2"
    assert isinstance(s.error, errors.Unavailable), s.error
    assert "drain timeout (2s)" in str(s.error)
    assert 0 < s.n < 900
    assert small.proc("worker-0").wait(30) == 0
    assert '"drain_timeout"' in (small.log_dir / "scheduler-0.log").read_text()
