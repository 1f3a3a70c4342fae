"""--drain-timeout bounds the drain: a request longer than it is ended with a
clear UNAVAILABLE, and the scheduler exits (code 0) shortly after the
timeout, not after the request."""
from __future__ import annotations

import signal
import threading
import time

import pytest

from dspark.shared import errors
from dspark.shared.client import Client
from dspark.shared.launcher import start_cluster

from .conftest import _free_port_block

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_request_longer_than_the_drain_timeout_is_cut_and_the_scheduler_exits(
        default_model_dir, tmp_path):
    base = _free_port_block(3)
    c = start_cluster(
        replicas=1, router_port=base, base_port=base + 1,
        worker_args=["--dtype", "float32", "--max-model-len", "1024", "--num-kv-blocks", "128",
                     "--num-threads", "1", "--drain-timeout", "3"],
        scheduler_args=["--drain-timeout", "2"], log_dir=tmp_path, timeout_s=300)
    try:
        got: dict = {"n": 0}
        first = threading.Event()

        def run():
            try:
                with Client(c.router, timeout=120) as cl:
                    for ch in cl.stream(prompt="Write a very long story.", max_tokens=900,
                                        temperature=0, ignore_eos=True):
                        got["n"] += len(ch.token_ids)
                        first.set()
            except errors.DSparkError as e:
                got["error"] = e
            finally:
                first.set()

        t = threading.Thread(target=run)
        t.start()
        assert first.wait(60)
        sched = c.proc("scheduler-0")
        t0 = time.monotonic()
        sched.send_signal(signal.SIGTERM)
        c.proc("worker-0").send_signal(signal.SIGTERM)
        assert sched.wait(30) == 0
        took = time.monotonic() - t0
        t.join(30)
        assert 1.5 < took < 8.0, f"scheduler took {took:.1f}s to stop with --drain-timeout 2"
        assert isinstance(got.get("error"), errors.Unavailable), got
        assert "drain timeout (2s)" in str(got["error"])
        assert 0 < got["n"] < 900
        assert c.proc("worker-0").wait(30) == 0
        log = (tmp_path / "scheduler-0.log").read_text()
        assert '"drain_timeout"' in log
    finally:
        c.stop()
