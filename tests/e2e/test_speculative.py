"""Speculative serving through router, scheduler and worker (real processes, fp32).

The session cluster speculates with K = 7 when the shipped drafter is present
(``speculative_config`` "auto": confidence-scheduled verification, on the pinned
cost profile of conftest.SPS_PROFILE) and schedules asynchronously (the default);
a sync K = 7 deployment with a fixed K (every draft verified) and a K = 0
deployment started here complete the picture, K = 0 being the reference: greedy
output must be identical token for token, one at a time and 8 at once.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dspark.shared.launcher import start_cluster

from .conftest import (MAX_MODEL_LEN, SPS_PROFILE, _free_port_block, assert_all_blocks_free,
                       scheduler_loads)

pytestmark = pytest.mark.e2e


def eval_prompts(n_per_set: int = 2) -> list[str]:
    from dspark.shared.bench import datasets_dir

    out = []
    for name in ("mt-bench", "humaneval", "mbpp", "gsm8k"):
        lines = (datasets_dir() / "eval" / f"{name}.jsonl").read_text().split("\n")
        out += [json.loads(x)["turns"][0] for x in lines if x.strip()][:n_per_set]
    return out


@pytest.fixture(scope="module")
def speculating(cluster):
    loads = scheduler_loads(cluster)
    if not all(ld.total_leases > 0 for ld in loads):
        pytest.skip("the session cluster does not speculate: no shipped drafter found "
                    "(drafters/<model>/drafter_config.json)")
    return cluster


@pytest.fixture(scope="module")
def plain_cluster(default_model_dir, tmp_path_factory, speculating):
    base = _free_port_block(3)
    c = start_cluster(
        replicas=1, router_port=base, base_port=base + 1,
        worker_args=["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
                     "--num-kv-blocks", "256", "--num-threads", "1", "--speculative-config",
                     json.dumps({"method": "dspark", "num_speculative_tokens": 0})],
        log_dir=Path(tmp_path_factory.mktemp("e2e-k0")), timeout_s=300)
    yield c
    c.stop()


def _gen(addr, prompt, **kw):
    from dspark.shared.client import Client

    with Client(addr, timeout=300) as c:
        return c.generate(messages=[{"role": "user", "content": prompt}], temperature=0,
                          max_tokens=kw.pop("max_tokens", 40), ignore_eos=True, **kw)


def test_k0_deployment_has_no_drafter(plain_cluster):
    loads = scheduler_loads(plain_cluster)
    assert all(ld.total_leases == 0 for ld in loads)
    out = _gen(plain_cluster.router, "Hi", max_tokens=4, return_spec_summary=True)
    assert out.spec_summary is None  # nothing speculates, nothing to summarise


def test_session_workers_verify_by_confidence(speculating):
    import grpc

    from dspark.shared import pb
    from dspark.v1 import worker_pb2, worker_pb2_grpc

    for addr in speculating.workers:
        with grpc.insecure_channel(addr) as ch:
            info = pb.info_from_pb(worker_pb2_grpc.WorkerStub(ch).Info(
                worker_pb2.InfoRequest(), timeout=5))
        assert info.num_speculative_tokens == 7 and info.verify_policy == "confidence"
        assert info.sps_profile.rows == (1, 8, 9, 256)  # the pinned one
    assert json.loads(SPS_PROFILE)["forward_ms"][1] == info.sps_profile.forward(8)


def test_greedy_k7_equals_k0_one_at_a_time_and_concurrently(speculating, plain_cluster):
    """Confidence-scheduled verification (the session cluster): alone, a request
    verifies every draft; 8 at once, steps verify few or none (l_r in 0..7 through
    the async path); greedy output equals K = 0 either way."""
    prompts = eval_prompts(2)
    want = [_gen(plain_cluster.router, p).token_ids for p in prompts]
    one = [_gen(speculating.router, p, return_spec_summary=True) for p in prompts]
    assert [o.token_ids for o in one] == want
    for o in one:
        s = o.spec_summary
        assert s is not None and s["num_speculative_tokens"] == 7 and s["verify_steps"] > 0
        assert 1.0 <= s["mean_accepted_length"] <= 8.0
        assert len(s["per_position_acceptance"]) == 7
        # every step after the first token (prefill) is counted once
        steps = s["verify_steps"] + s["fallback_steps"] + s["unverified_steps"]
        assert steps <= len(o.token_ids) - 1
        assert s["verified_per_position"][0] == s["verify_steps"]
    with ThreadPoolExecutor(8) as pool:
        many = list(pool.map(lambda p: _gen(speculating.router, p, return_spec_summary=True),
                             prompts))
    assert [o.token_ids for o in many] == want
    # several decoding at once (~4 per replica) share the profile's cheap 8 rows: the
    # verify budgets cut requests short of their 7 drafts, or to none
    assert any(s["unverified_steps"] > 0 or s["num_draft_tokens"] < 7 * s["verify_steps"]
               for s in (o.spec_summary for o in many))
    assert_all_blocks_free(speculating)


def test_mixed_run_returns_every_lease_and_block(speculating):
    """Finishes, a stop string, aborts (cancelled streams) and sampled requests at
    once, under confidence-scheduled verification (verify budgets of every size as
    the load changes); afterwards every KV block and drafter lease is free on every
    replica."""
    from dspark.shared.client import Client

    prompts = eval_prompts(2)

    def finish(p):
        return _gen(speculating.router, p, max_tokens=24).finish_reason

    def sampled(i):
        with Client(speculating.router, timeout=300) as c:
            return c.generate(prompt=prompts[i % len(prompts)], temperature=0.8, top_p=0.9,
                              seed=i, max_tokens=20).finish_reason

    def cancelled(p):
        with Client(speculating.router, timeout=300) as c:
            s = c.stream(messages=[{"role": "user", "content": p}], max_tokens=200,
                         ignore_eos=True)
            for n, _ in enumerate(s):
                if n >= 3:
                    s.cancel()
                    break
        return "cancelled"

    def stopped(p):
        with Client(speculating.router, timeout=300) as c:
            return c.generate(messages=[{"role": "user", "content": p}], max_tokens=60,
                              stop=[" the", "."], temperature=0).finish_reason

    with ThreadPoolExecutor(10) as pool:
        futs = [pool.submit(finish, p) for p in prompts[:3]]
        futs += [pool.submit(sampled, i) for i in range(3)]
        futs += [pool.submit(cancelled, p) for p in prompts[3:6]]
        futs += [pool.submit(stopped, p) for p in prompts[6:8]]
        results = [f.result() for f in futs]
    assert results.count("cancelled") == 3
    assert_all_blocks_free(speculating)


@pytest.fixture(scope="module")
def sync_cluster(default_model_dir, tmp_path_factory, speculating):
    base = _free_port_block(3)
    c = start_cluster(
        replicas=1, router_port=base, base_port=base + 1,
        worker_args=["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
                     "--num-kv-blocks", "256", "--num-threads", "1", "--speculative-config",
                     json.dumps({"method": "dspark", "num_speculative_tokens": 7,
                                 "verify": "fixed"})],
        scheduler_args=["--no-async-scheduling", "--max-num-seqs", "16"],
        log_dir=Path(tmp_path_factory.mktemp("e2e-sync")), timeout_s=300)
    yield c
    c.stop()


def test_sync_scheduling_k7_equals_k0(sync_cluster, plain_cluster):
    """The session cluster schedules asynchronously (the default: step N+1 dispatched
    before step N returns, positions corrected when it does); sync mode with a fixed
    K (every draft verified) gives the same greedy output too, one at a time and 8 at
    once."""
    prompts = eval_prompts(2)
    want = [_gen(plain_cluster.router, p).token_ids for p in prompts]
    one = [_gen(sync_cluster.router, p, return_spec_summary=True) for p in prompts]
    assert [o.token_ids for o in one] == want
    assert all(o.spec_summary["verify_steps"] > 0 for o in one)
    assert all(o.spec_summary["unverified_steps"] == 0 for o in one)
    assert all(o.spec_summary["num_draft_tokens"] == 7 * o.spec_summary["verify_steps"]
               for o in one)
    with ThreadPoolExecutor(8) as pool:
        many = list(pool.map(lambda p: _gen(sync_cluster.router, p).token_ids, prompts))
    assert many == want
    assert_all_blocks_free(sync_cluster)
