"""Speculative decoding in the worker runner (tiny random Llama + random drafter, fp32).

Drives the real scheduler core and ModelRunner in process (OfflineEngine): drafting
from lease rings, verify rows in the batched forward, acceptance by the scheduler.
"""
from __future__ import annotations

import json
import random

import pytest
import torch

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SamplingParams, SeqStep, StepPlan
from dspark.worker.model.drafter import DrafterConfig, DSparkDrafter
from dspark.worker.model.drafter_ckpt import save_drafter
from dspark.worker.runner import ModelRunner, model_fingerprint
from dspark.worker.sampler import RowParams
from dspark.worker.spec import LeasePool
from dspark.worker.training.engine import OfflineEngine

from .reference import two_token_fit

pytestmark = pytest.mark.usefixtures("one_thread")
K = 7


@pytest.fixture(scope="module")
def drafter_dir(tiny_model_dir, target, tmp_path_factory):
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(target.args, model_fingerprint(tiny_model_dir),
                                   target_layer_ids=(0, 1, 2), block_size=K,
                                   context_window=16, markov_rank=8)
    dr = DSparkDrafter(cfg)
    dr.init_from_target(target)
    with torch.no_grad():
        dr.markov_w2.normal_(0, 0.5)
    return save_drafter(tmp_path_factory.mktemp("drafter") / "tiny-drafter", dr)


def runner(tiny_model_dir, drafter_dir, k: int, dtype="float32", **kw) -> ModelRunner:
    return ModelRunner(WorkerConfig(
        model=str(tiny_model_dir), dtype=dtype, num_kv_blocks=96, block_size=8,
        tap_layer_ids=(0, 1, 2), drafter=str(drafter_dir), num_leases=4,
        speculative_config=json.dumps({"method": "dspark", "num_speculative_tokens": k}), **kw))


def prompts(n=6, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 97) for _ in range(rng.randrange(3, 30))] for _ in range(n)]


def generate(r, items, max_num_seqs=4):
    eng = OfflineEngine(r, max_num_seqs=max_num_seqs, max_num_batched_tokens=64)
    out = {rid: ids for rid, ids, _ in eng.generate(items)}
    return out, eng.core


@pytest.fixture(scope="module")
def runners(tiny_model_dir, drafter_dir):
    return runner(tiny_model_dir, drafter_dir, 0), runner(tiny_model_dir, drafter_dir, K)


def test_k0_loads_nothing_of_the_drafter(runners):
    r0, r7 = runners
    assert r0.drafter is None and r0.leases is None
    assert r0.info().num_speculative_tokens == 0 and r0.info().num_leases == 0
    assert r7.info().num_speculative_tokens == K and r7.info().num_leases == 4
    assert r7.info().drafter_id.startswith("tiny-drafter@")
    # the leases' memory comes out of the KV budget, not on top of it
    assert LeasePool.bytes_needed(r7.drafter.config, 4, K, torch.float32) > 0


def test_greedy_speculation_equals_plain_greedy(runners):
    r0, r7 = runners
    items = [(f"r{i}", p, SamplingParams(max_tokens=24 + i, ignore_eos=True))
             for i, p in enumerate(prompts())]
    plain, _ = generate(r0, items)
    spec, core = generate(r7, items)
    assert spec == plain
    assert core.spec_totals.verify_steps > 0
    assert core.load()["free_leases"] == 4 and core.load()["free_kv_blocks"] == 96


def test_oracle_drafts_are_accepted_and_output_unchanged(runners, monkeypatch):
    """Drafts = the target's true greedy continuation with every 4th slot corrupted:
    long accepted runs, so committed drafts' KV and positions are exercised."""
    r0, r7 = runners
    items = [(f"r{i}", p, SamplingParams(max_tokens=30, ignore_eos=True))
             for i, p in enumerate(prompts(3, seed=1))]
    plain, _ = generate(r0, items)
    full = {rid: p + plain[rid] for rid, p, _ in items}
    real = r7.leases.draft

    def oracle(leases, anchors, anchor_pos, params, use_markov=True, depth=None):
        out = real(leases, anchors, anchor_pos, params, use_markov, depth)
        for j, (a, pos) in enumerate(zip(anchors, anchor_pos)):
            owner = r7.leases.owner[leases[j]]
            seq = full[owner]
            for s in range(out.tokens.shape[1]):
                p = pos + 1 + s
                tok = seq[p] if p < len(seq) else 5
                out.tokens[j, s] = tok if (pos + s) % 4 else (tok + 1) % 97
        return out

    monkeypatch.setattr(r7.leases, "draft", oracle)
    spec, core = generate(r7, items, max_num_seqs=3)
    assert spec == plain
    st = core.spec_totals
    assert st.mean_accepted_length > 2.0 and st.num_accepted_tokens > 0


def test_draft_depth_is_a_prefix_of_full_drafting(runners):
    """Drafting only the first d positions (all a verify budget can use) gives the
    same first d drafts, draft probabilities, distributions and confidences."""
    from dspark.worker.sampler import RowParams

    _, r7 = runners
    pool = r7.leases
    torch.manual_seed(3)
    for lease in (0, 1):
        pool.claim(lease, f"depth{lease}")
        pool.write(lease, 0, torch.randn(12, 3 * r7.model.args.hidden_size))
    params = [RowParams(0.0, 0, 1.0, 0, 12), RowParams(0.8, 20, 0.9, 7, 12)]  # greedy, sampled
    try:
        full = pool.draft([0, 1], [5, 9], [12, 12], params)
        for d in (1, 3):
            part = pool.draft([0, 1], [5, 9], [12, 12], params, depth=d)
            assert part.tokens.shape == (2, d) and part.confidences.shape == (2, d)
            assert torch.equal(part.tokens, full.tokens[:, :d])
            assert torch.allclose(part.probs, full.probs[:, :d], atol=1e-6)
            assert torch.allclose(part.confidences, full.confidences[:, :d], atol=1e-6)
            assert part.dists[0] is None
            assert torch.allclose(part.dists[1], full.dists[1][:d], atol=1e-6)
        with pytest.raises(ValueError, match="depth=0"):
            pool.draft([0], [5], [12], params[:1], depth=0)
    finally:
        pool.release("depth0")
        pool.release("depth1")


def test_runner_drafts_no_deeper_than_the_verify_budget(runners, monkeypatch):
    """Under a verify budget V the worker drafts min(K, V) positions, and the
    output is still the plain greedy output."""
    from dspark.shared.config import SchedulerConfig
    from dspark.scheduler.core import Scheduler

    r0, r7 = runners
    depths = []
    real = r7.leases.draft

    def spy(leases, anchors, anchor_pos, params, use_markov=True, depth=None):
        depths.append(depth)
        return real(leases, anchors, anchor_pos, params, use_markov, depth)

    monkeypatch.setattr(r7.leases, "draft", spy)
    items = [(f"r{i}", p, SamplingParams(max_tokens=16, ignore_eos=True))
             for i, p in enumerate(prompts(2, seed=4))]
    plain, _ = generate(r0, items)
    core = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=64), r7.info())
    for rid, ids, sp in items:
        core.add_request(rid, ids, sp)
    out = {rid: [] for rid, _, _ in items}
    budgets = []
    while core.has_unfinished():
        plan = core.schedule()
        if any(s.num_speculative_tokens for s in plan.seqs):
            plan.verify_budget = len(budgets) % 4  # 0..3, below K
            budgets.append(plan.verify_budget)
        for o in core.update_from_output(plan, r7.step(plan)):
            out[o.request_id].extend(o.new_token_ids)
            if o.finished:
                r7.release([o.request_id])
    assert out == plain
    assert depths == [max(1, v) for v in budgets] and max(depths) == 3


def test_sampled_speculation_is_deterministic_per_seed(runners):
    _, r7 = runners
    items = [(f"r{i}", p, SamplingParams(max_tokens=20, temperature=0.9, top_p=0.95,
                                         seed=100 + i, ignore_eos=True))
             for i, p in enumerate(prompts(4, seed=2))]
    a, _ = generate(r7, items, max_num_seqs=4)
    b, _ = generate(r7, items[::-1], max_num_seqs=2)  # other batches, same seeds
    assert a == b


def test_ring_writes_batched_equal_one_at_a_time(runners):
    """write_many (one projection pass for a step's leases) leaves the rings as
    one write per lease would, including a write longer than the ring."""
    _, r7 = runners
    pool = r7.leases
    d3 = 3 * r7.model.args.hidden_size
    torch.manual_seed(5)
    items = [(0, 0, torch.randn(5, d3)), (2, 9, torch.randn(1, d3)),
             (3, 4, torch.randn(pool.ring + 6, d3))]
    rings = []
    for batched in (False, True):
        for lease, _, _ in items:
            pool.claim(lease, f"w{lease}-{batched}")
        if batched:
            pool.write_many(items)
        else:
            for it in items:
                pool.write(*it)
        rings.append([(pool.k[li][[0, 2, 3]].clone(), pool.v[li][[0, 2, 3]].clone())
                      for li in range(len(pool.k))] + [pool.pos[[0, 2, 3]].clone()])
        for lease, _, _ in items:
            pool.release(f"w{lease}-{batched}")
    assert torch.equal(rings[0][-1], rings[1][-1])
    assert int((rings[1][-1][2] >= 0).sum()) == pool.ring  # the long write filled lease 3
    for (k0, v0), (k1, v1) in zip(rings[0][:-1], rings[1][:-1]):
        assert torch.allclose(k0, k1, atol=1e-5) and torch.allclose(v0, v1, atol=1e-5)


def test_reused_lease_never_shows_the_previous_rows(runners):
    _, r7 = runners
    pool = r7.leases
    pool.claim(0, "first")
    pool.write(0, 0, torch.randn(5, 3 * 64))
    pool.stage_many([(0, 5, torch.randn(2, 3 * 64))])
    assert int((pool.pos[0] >= 0).sum()) == 5 and int((pool.raw_pos[0] >= 0).sum()) == 2
    pool.claim(0, "second")
    assert int((pool.pos[0] >= 0).sum()) == 0 and int((pool.raw_pos[0] >= 0).sum()) == 0
    pool.release("second")
    assert pool.owner[0] is None


def test_plain_steps_stage_tap_rows_and_drafting_projects_them(runners):
    """A leased request's step without drafts only stages its tap rows (no
    projection); its next draft projects them first, so the drafts are those of
    eagerly written rings, staged rows overwritten in the ring's slots included."""
    _, r7 = runners
    pool = r7.leases
    d3 = pool.raw.shape[-1]
    torch.manual_seed(11)
    rows = [torch.randn(12, d3), torch.randn(3, d3), torch.randn(pool.ring, d3)]
    starts = [0, 12, 15]
    got = []
    for lazy in (False, True):
        pool.claim(1, f"s-{lazy}")
        for st, r in zip(starts, rows):
            (pool.stage_many if lazy else pool.write_many)([(1, st, r)])
        if lazy:
            assert int((pool.pos[1] >= 0).sum()) == 0  # nothing projected yet
        anchor_pos = starts[-1] + pool.ring
        d = pool.draft([1], [5], [anchor_pos], [RowParams()])
        assert int((pool.raw_pos[1] >= 0).sum()) == 0  # drafting flushed the stage
        got.append((d.tokens.clone(), pool.pos[1].clone(), pool.k[0][1].clone()))
        pool.release(f"s-{lazy}")
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    assert torch.allclose(got[0][2], got[1][2], atol=1e-5)
    # the runner stages: a plain step of a leased request projects nothing
    ids = [3, 4, 5, 6]
    r7.step(StepPlan(0, [SeqStep("p", ids, 0, [0, 1], sample=True, lease_id=2)]))
    assert int((pool.raw_pos[2] >= 0).sum()) == len(ids) and int((pool.pos[2] >= 0).sum()) == 0
    r7.release(["p"])
    assert int((pool.raw_pos[2] >= 0).sum()) == 0


@torch.inference_mode()
def test_sampled_speculation_follows_the_target_distribution(runners, tiny_model_dir):
    """Lossless: the first two generated tokens over many seeds follow the target's
    exact joint distribution (chi-square goodness of fit), drafts being accepted and
    rejected along the way."""
    _, r7 = runners
    temp, n = 0.7, 1500
    prompt = [11, 42, 7, 19, 64]
    items = [(f"s{i}", prompt, SamplingParams(max_tokens=2, temperature=temp, seed=i,
                                              ignore_eos=True)) for i in range(n)]
    out, core = generate(r7, items, max_num_seqs=4)
    assert core.spec_totals.num_accepted_tokens > 0  # some drafts were accepted
    assert core.spec_totals.num_accepted_tokens < core.spec_totals.num_draft_tokens
    pval, chi2, dof = two_token_fit(tiny_model_dir, prompt, temp, list(out.values()))
    assert pval > 1e-3, (chi2, dof)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_async_scheduling_gives_identical_output(runners, temperature, monkeypatch):
    """Step N+1 planned and run before step N's result is applied: deferred anchors
    come from the worker's own acceptance; output equals sync scheduling."""
    _, r7 = runners
    items = [(f"r{i}", p, SamplingParams(max_tokens=30 + 3 * i, temperature=temperature,
                                         seed=7 + i, ignore_eos=True))
             for i, p in enumerate(prompts(5, seed=3))]

    def run(async_):
        eng = OfflineEngine(r7, max_num_seqs=3, max_num_batched_tokens=64,
                            async_scheduling=async_)
        return {rid: ids for rid, ids, _ in eng.generate(items)}, eng.core

    deferred = []
    real = r7._resolve_anchor
    monkeypatch.setattr(r7, "_resolve_anchor", lambda s: deferred.append(s) or real(s))
    sync_out, _ = run(False)
    assert not deferred
    async_out, core = run(True)
    assert async_out == sync_out
    assert len(deferred) > 10  # the async path really ran
    assert core.load()["free_kv_blocks"] == 96 and core.load()["free_leases"] == 4


def _native_bf16_reason() -> str:
    from dspark.worker.model import native_attention

    ext = native_attention.load(build=True)
    if ext is None:
        return f"native kernels unavailable: {native_attention.unavailable_reason()}"
    if not ext.has_linear_bf16():
        return "this CPU has no AVX512-BF16 (no native bf16 linear kernel)"
    return ""


@pytest.mark.skipif(bool(_native_bf16_reason()), reason=_native_bf16_reason())
def test_bf16_greedy_speculation_equals_plain_on_the_native_kernels(tiny_model_dir,
                                                                    drafter_dir):
    """In bf16 with the native linear kernel (a row's result independent of the
    batch), a verify window's rows are the rows plain decoding computes, so
    greedy speculation reproduces plain greedy output exactly, as in fp32."""
    from dspark.worker.model.native_linear import Bf16Linear

    def bf16(k):
        return runner(tiny_model_dir, drafter_dir, k, dtype="bfloat16", linear="native",
                      attention="native")

    r0, r7 = bf16(0), bf16(K)
    assert isinstance(r7.model.linear, Bf16Linear) and r7.model.wide_layers is None
    items = [(f"b{i}", p, SamplingParams(max_tokens=24 + i, ignore_eos=True))
             for i, p in enumerate(prompts(seed=3))]
    plain, _ = generate(r0, items)
    spec, core = generate(r7, items)
    assert spec == plain
    assert core.spec_totals.verify_steps > 0
