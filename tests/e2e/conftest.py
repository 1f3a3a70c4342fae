"""End-to-end fixtures: the three real services as separate processes on
loopback, serving the real default model in fp32 (so that batched and
one-at-a-time greedy outputs must agree exactly)."""
from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

import grpc
import pytest

from dspark.shared.launcher import start_cluster
from dspark.v1 import scheduler_pb2, scheduler_pb2_grpc

# Small enough that 8-way concurrency and preemption paths are exercised,
# large enough for every test's prompts.
MAX_MODEL_LEN = 1024
# The session cluster speculates with the shipped drafter ("auto": K = 7, verify
# "confidence") on this pinned cost profile instead of a measured one (faster start,
# the same decisions on both replicas): a step's first 8 rows cost the same and a
# 9th doubles it, so a request alone verifies all 7 drafts (seeded sampling
# reproduces), 2..7 decoding requests share the rows left by confidence, and 8 or
# more verify none (plain one-token steps).
SPS_PROFILE = json.dumps({"rows": [1, 8, 9, 256], "forward_ms": [30.0, 30.0, 60.0, 180.0]})


def _free_port_block(n: int) -> int:
    """A base port with n consecutive free ports (the scan starts at a random
    point, so that test runs started together rarely pick the same block)."""
    start = 41000 + 97 * random.randrange(0, 150)
    for base in [*range(start, 60000, 97), *range(41000, start, 97)]:
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


@pytest.fixture(scope="session")
def cluster(default_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("e2e-logs")
    base = _free_port_block(11)
    # router gRPC, 2 x (scheduler, worker), router HTTP, 5 metrics ports
    c = start_cluster(
        replicas=2, router_port=base, base_port=base + 1, http_port=base + 5,
        metrics_base_port=base + 6,
        worker_args=["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
                     "--num-kv-blocks", "512", "--num-threads", "1",
                     "--sps-profile", SPS_PROFILE],
        scheduler_args=["--max-num-seqs", "16", "--max-num-batched-tokens", "256"],
        log_dir=Path(log_dir), timeout_s=300)
    c.log_dir = Path(log_dir)
    yield c
    c.stop()
    for name, p in c.procs:
        assert p.returncode == 0, f"{name} did not stop cleanly (exit {p.returncode}); logs in {log_dir}"


@pytest.fixture
def client(cluster):
    from dspark.shared.client import Client

    with Client(cluster.router, timeout=120) as c:
        yield c


def scheduler_loads(cluster) -> list[scheduler_pb2.GetLoadResponse]:
    out = []
    for addr in cluster.schedulers:
        with grpc.insecure_channel(addr) as ch:
            out.append(scheduler_pb2_grpc.SchedulerStub(ch).GetLoad(
                scheduler_pb2.GetLoadRequest(), timeout=5))
    return out


def wait_idle(cluster, timeout_s: float = 30.0) -> list[scheduler_pb2.GetLoadResponse]:
    """Wait until no scheduler has waiting or running requests."""
    deadline = time.monotonic() + timeout_s
    while True:
        loads = scheduler_loads(cluster)
        if all(ld.num_running == 0 and ld.num_waiting == 0 for ld in loads):
            return loads
        if time.monotonic() > deadline:
            return loads
        time.sleep(0.1)


def assert_all_blocks_free(cluster) -> None:
    loads = wait_idle(cluster)
    for ld in loads:
        assert ld.num_running == 0 and ld.num_waiting == 0, ld
        assert ld.free_kv_blocks == ld.total_kv_blocks, (
            f"{ld.total_kv_blocks - ld.free_kv_blocks} KV blocks still held")
        assert ld.free_leases == ld.total_leases, (
            f"{ld.total_leases - ld.free_leases} drafter leases still held")
