"""Preemption by recompute through the real services: a KV pool too small for
the requests in flight forces the scheduler to reclaim blocks and recompute,
and the output is still exactly the one-at-a-time output (fp32 greedy)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dspark.shared.client import Client
from dspark.shared.launcher import start_cluster

from .conftest import _free_port_block, assert_all_blocks_free, scheduler_loads

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPTS = ["The capital of France is", "def add(a, b):", "Roses are red,",
           "One, two, three,", "The sun rises in the", "My favourite food is"]


@pytest.fixture(scope="module")
def small_cluster(default_model_dir, tmp_path_factory):
    base = _free_port_block(3)
    # 20 blocks x 16 = 320 KV slots for 6 requests of ~70 tokens each.
    c = start_cluster(replicas=1, router_port=base, base_port=base + 1,
                      worker_args=["--dtype", "float32", "--num-kv-blocks", "20",
                                   "--max-model-len", "256", "--num-threads", "1"],
                      log_dir=Path(tmp_path_factory.mktemp("preempt-logs")), timeout_s=300)
    yield c
    c.stop()


def test_preempted_requests_finish_with_the_same_output(small_cluster):
    with Client(small_cluster.router, timeout=300) as client:
        def run(p):
            return client.generate(prompt=p, max_tokens=64, temperature=0, ignore_eos=True)

        alone = [run(p) for p in PROMPTS]
        assert scheduler_loads(small_cluster)[0].num_preemptions == 0
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(run, PROMPTS))
    assert scheduler_loads(small_cluster)[0].num_preemptions > 0
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 64
    assert_all_blocks_free(small_cluster)
