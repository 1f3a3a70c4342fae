"""`dspark serve`: one command starts the three services, prints where to
connect, serves, and stops every process cleanly on Ctrl-C."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx2 as httpx
import psutil
import pytest

from dspark.shared.client import Client

from .conftest import _free_port_block

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_serve_prints_endpoints_serves_and_stops_cleanly(default_model_dir, tmp_path):
    base = _free_port_block(7)
    p = subprocess.Popen(
        [sys.executable, "-m", "dspark.shared.cli", "serve", "--router-port", str(base),
         "--base-port", str(base + 1), "--num-kv-blocks", "256", "--max-model-len", "512",
         "--http-port", str(base + 3), "--metrics-port", str(base + 4),
         "--drain-timeout", "10", "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            assert line, f"serve exited early: {p.stderr.read()}"
            lines.append(line)
            if line.startswith("Stop:"):
                break
        out = "".join(lines)
        assert f"router (public gRPC API): 127.0.0.1:{base}" in out
        assert f"scheduler: 127.0.0.1:{base + 1}" in out and f"worker: 127.0.0.1:{base + 2}" in out
        assert f"OpenAI-compatible HTTP API: http://127.0.0.1:{base + 3}/v1" in out
        assert f"metrics (worker-0): http://127.0.0.1:{base + 6}/metrics" in out
        children = psutil.Process(p.pid).children(recursive=True)
        assert len(children) == 3
        with Client(f"127.0.0.1:{base}", timeout=60) as c:
            assert "Paris" in c.generate(prompt="The capital of France is", max_tokens=6,
                                         temperature=0).text
        models = httpx.get(f"http://127.0.0.1:{base + 3}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"
        assert "dspark_worker_steps_total" in httpx.get(
            f"http://127.0.0.1:{base + 6}/metrics", timeout=10).text
        p.send_signal(signal.SIGINT)
        assert p.wait(60) == 0
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"still running after stop: {alive}"
        for name in ("router", "scheduler-0", "worker-0"):  # each stopped gracefully
            assert '"event": "stopped"' in (tmp_path / f"{name}.log").read_text(), name
    finally:
        if p.poll() is None:  # a failed test: the services go with serve, not orphaned
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
            p.kill()
