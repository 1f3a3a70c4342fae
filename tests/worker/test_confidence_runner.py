"""Confidence-scheduled verification in the worker runner (tiny random Llama + random
drafter, fp32): the start-up profile, the verify-budget fill, and lossless output
under a budget (greedy exact, sampled in distribution), through the real scheduler
core (OfflineEngine) with hand-made cost profiles."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from dspark.shared import pb
from dspark.shared.types import SamplingParams, SeqStep, SpsProfile, StepPlan
from dspark.shared.verify_fill import fill_verify_budget
from dspark.worker.training.engine import OfflineEngine

from .reference import two_token_fit
from .test_spec_runner import K, drafter_dir, prompts, runner  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")
# extra rows cost nothing; pinned: used as given (not refitted from the step times the
# runner reports, which would make the schedule, and sampled outputs, timing-dependent)
FREE = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0), pinned=True)


@pytest.fixture(scope="module")
def runners(tiny_model_dir, drafter_dir):  # noqa: F811
    r0 = runner(tiny_model_dir, drafter_dir, 0)
    rc = runner(tiny_model_dir, drafter_dir, K)
    rc.verify_policy = "confidence"
    return r0, rc


def engine(r, budget_tokens=64, max_num_seqs=4, profile=FREE, async_=False):
    """The scheduler in confidence mode with a hand-made profile; a small token budget
    leaves the steps' verify budgets short of every draft, so l_r varies."""
    info = replace(r.info(), verify_policy="confidence", sps_profile=profile)
    return OfflineEngine(r, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget_tokens,
                         info=info, async_scheduling=async_)


def run(eng, items):
    return {rid: ids for rid, ids, _ in eng.generate(items)}, eng.core


def test_profile_is_measured_only_with_speculation(tiny_model_dir, drafter_dir):  # noqa: F811
    from dspark.shared.config import WorkerConfig
    from dspark.worker.runner import ModelRunner

    r0 = runner(tiny_model_dir, drafter_dir, 0)
    assert r0.profile() is None and r0.info().sps_profile is None
    assert r0.info().verify_policy == "fixed"
    spec = json.dumps({"method": "dspark", "num_speculative_tokens": K, "verify": "confidence"})
    rc = ModelRunner(WorkerConfig(
        model=str(tiny_model_dir), dtype="float32", num_kv_blocks=96, block_size=8,
        tap_layer_ids=(0, 1, 2), drafter=str(drafter_dir), num_leases=4,
        speculative_config=spec))
    assert rc.info().verify_policy == "confidence" and rc.info().sps_profile is None
    prof = rc.profile(budget_s=0.5)
    assert prof.rows[0] == 1 and len(prof.rows) >= 2 and list(prof.rows) == sorted(prof.rows)
    assert all(t > 0 for t in prof.forward_ms)
    assert prof.draft_fixed_ms >= 0 and prof.draft_per_request_ms >= 0
    assert prof.draft_per_position_ms >= 0
    assert prof.draft_fixed_ms + prof.draft_per_request_ms > 0
    info = pb.info_from_pb(pb.info_to_pb(rc.info()))  # the scheduler sees it over gRPC
    assert info.sps_profile == pytest.approx(prof) or info.sps_profile.rows == prof.rows
    assert info.verify_policy == "confidence"
    # the profile's scratch leases are free again
    assert rc.leases.free_count() == rc.leases.num_leases
    # a pinned profile is taken as given, nothing measured
    pinned = json.dumps({"rows": [1, 8], "forward_ms": [5.0, 6.0]})
    rp = ModelRunner(replace(rc.config, sps_profile=pinned))
    assert rp.profile() == SpsProfile(rows=(1, 8), forward_ms=(5.0, 6.0), pinned=True)
    assert pb.info_from_pb(pb.info_to_pb(rp.info())).sps_profile.pinned  # and says so
    assert not prof.pinned and not info.sps_profile.pinned


def test_offline_engine_measures_the_profile_confidence_needs(tiny_model_dir,
                                                            drafter_dir):  # noqa: F811
    rc = runner(tiny_model_dir, drafter_dir, K)
    rc.verify_policy = "confidence"
    assert rc.info().sps_profile is None
    eng = OfflineEngine(rc, max_num_seqs=2)
    assert eng.info.verify_policy == "confidence" and eng.info.sps_profile is not None
    items = [(f"r{i}", p, SamplingParams(max_tokens=8, ignore_eos=True))
             for i, p in enumerate(prompts(3))]
    got, core = run(eng, items)
    assert core.confidence_scheduled  # not the "fixed" fallback of a missing profile
    plain, _ = run(OfflineEngine(runner(tiny_model_dir, drafter_dir, 0), max_num_seqs=2), items)
    assert got == plain  # greedy: exact whatever it verified


def test_budgeted_step_verifies_the_top_candidates(runners):
    """One step run directly: the worker drafts as deep as the budget can use
    (min(K, V) positions, at least 1), returns those confidences per request and
    verifies exactly the prefixes the fill rule picks from them."""
    _, rc = runners
    items = [(f"b{i}", p, SamplingParams(max_tokens=2, ignore_eos=True))
             for i, p in enumerate(prompts(3, seed=4))]
    eng = engine(rc)
    list(eng.generate([]))  # nothing: just a core
    core = eng.core
    for rid, p, sp in items:
        core.add_request(rid, p, replace(sp, max_tokens=20))
    plan = core.schedule()  # prefills
    core.update_from_output(plan, rc.step(plan))
    for budget in (0, 2, 5, 30):
        plan = core.schedule()
        assert all(s.num_speculative_tokens == K for s in plan.seqs)
        plan = replace(plan, verify_budget=budget, verify_step_ms=None)  # fill it all
        out = rc.step(plan)
        confs = [o.confidences for o in out.outputs]
        assert all(len(c) == min(K, max(1, budget)) for c in confs)
        lens = [len(o.draft_tokens) for o in out.outputs]
        assert lens == fill_verify_budget(confs, budget)
        assert sum(lens) == min(budget, len(plan.seqs) * K)
        for o, n in zip(out.outputs, lens):
            assert len(o.target_tokens) == n + 1 and len(o.q_draft) == n
        core.update_from_output(plan, out)
    for rid, _, _ in items:
        core.abort(rid)
        rc.release([rid])
    assert core.load()["free_kv_blocks"] == core.allocator.num_total


def test_the_worker_trims_the_fill_by_the_step_times(runners):
    """With the step's expected times (StepPlan.verify_step_ms) the worker verifies
    the fill's prefix that the current confidences pay for: every row when rows are
    free, none when they are dear; a list of the wrong length is refused."""
    _, rc = runners
    eng = engine(rc)
    list(eng.generate([]))
    core = eng.core
    for i, p in enumerate(prompts(3, seed=6)):
        core.add_request(f"t{i}", p, SamplingParams(max_tokens=20, ignore_eos=True))
    plan = core.schedule()  # prefills
    core.update_from_output(plan, rc.step(plan))
    budget = 5
    for per_row, want in ((0.0, "fill"), (1e6, "none")):
        plan = replace(core.schedule(), verify_budget=budget,
                       verify_step_ms=[10.0 + per_row * v for v in range(budget + 1)])
        out = rc.step(plan)
        lens = [len(o.draft_tokens) for o in out.outputs]
        if want == "fill":
            assert lens == fill_verify_budget([o.confidences for o in out.outputs], budget)
            assert sum(lens) == budget
        else:
            assert lens == [0, 0, 0]
            assert all(len(o.target_tokens) == 1 for o in out.outputs)
        core.update_from_output(plan, out)
    plan = replace(core.schedule(), verify_budget=budget, verify_step_ms=[10.0] * budget)
    with pytest.raises(ValueError, match="verify_step_ms has 5 entries"):
        rc.step(plan)
    for i in range(3):
        core.abort(f"t{i}")
    rc.release([f"t{i}" for i in range(3)])
    assert core.load()["free_kv_blocks"] == core.allocator.num_total


@pytest.mark.parametrize("async_", [False, True])
def test_greedy_under_a_budget_equals_plain_greedy(runners, async_):
    r0, rc = runners
    items = [(f"r{i}", p, SamplingParams(max_tokens=24 + i, ignore_eos=True))
             for i, p in enumerate(prompts())]
    plain, _ = run(OfflineEngine(r0, max_num_seqs=4, max_num_batched_tokens=64), items)
    out, core = run(engine(rc, budget_tokens=4 + 6, async_=async_), items)
    assert out == plain
    st = core.spec_totals
    assert st.verify_steps > 0 and st.unverified_steps > 0
    assert st.num_draft_tokens < K * st.verify_steps  # budgets cut some requests short
    assert core.load()["free_leases"] == 4 and core.load()["free_kv_blocks"] == 96


def test_sampled_under_a_budget_reproduces_with_the_same_schedule(runners):
    """Seeded sampling reproduces for the same sequence of steps (sync and async).
    Which drafts a step verifies depends on the other requests in it, so unlike a
    fixed K the realisation may change with the schedule: only its distribution
    is guaranteed (next test)."""
    _, rc = runners
    items = [(f"r{i}", p, SamplingParams(max_tokens=20, temperature=0.8, seed=7 + i,
                                         ignore_eos=True))
             for i, p in enumerate(prompts(5, seed=3))]
    for async_ in (False, True):
        a, core = run(engine(rc, budget_tokens=3 + 4, max_num_seqs=3, async_=async_), items)
        b, _ = run(engine(rc, budget_tokens=3 + 4, max_num_seqs=3, async_=async_), items)
        assert a == b
        assert core.spec_totals.unverified_steps > 0 and core.spec_totals.verify_steps > 0


@torch.inference_mode()
def test_sampled_under_a_budget_follows_the_target_distribution(runners, tiny_model_dir,
                                                                monkeypatch):
    """Lossless under a verify budget: the first two tokens over many seeds follow the
    target's joint distribution (chi-square), while the budget gives some requests
    drafts and others none, chosen by the drafter's current confidences."""
    import dspark.scheduler.core.speculation as spec

    _, rc = runners
    # V = half the step's speculating requests: the fill rule picks them by confidence
    monkeypatch.setattr(spec, "size_verify_budget",
                        lambda profile, rows, tokens, cands, max_budget: len(cands) // 2)
    temp, n = 0.7, 1500
    prompt = [11, 42, 7, 19, 64]
    items = [(f"s{i}", prompt, SamplingParams(max_tokens=2, temperature=temp, seed=i,
                                              ignore_eos=True)) for i in range(n)]
    out, core = run(engine(rc, max_num_seqs=4), items)
    st = core.spec_totals
    assert st.unverified_steps > 0 and st.verify_steps > 0  # both kinds of step ran
    assert 0 < st.num_accepted_tokens < st.num_draft_tokens
    pval, chi2, dof = two_token_fit(tiny_model_dir, prompt, temp, list(out.values()))
    assert pval > 1e-3, (chi2, dof)


def test_zero_budget_step_is_a_plain_step(runners):
    """verify_budget = 0: each speculating request's result is the target's own token
    at the anchor + 1, exactly what a plain decode step samples."""
    r0, rc = runners
    p = prompts(1, seed=9)[0]
    plan = StepPlan(0, [SeqStep("z", p, 0, list(range(6)), sample=True, temperature=0.9,
                                seed=3, lease_id=0)])
    first = rc.step(plan).outputs[0].token_id
    spec = StepPlan(1, [SeqStep("z", [first], len(p), list(range(6)), sample=True,
                                temperature=0.9, seed=3, lease_id=0,
                                num_speculative_tokens=K)], verify_budget=0)
    o = rc.step(spec).outputs[0]
    r0.step(StepPlan(0, [SeqStep("z", p, 0, list(range(6)), sample=True, temperature=0.9,
                                 seed=3)]))
    plain = r0.step(StepPlan(1, [SeqStep("z", [first], len(p), list(range(6)), sample=True,
                                         temperature=0.9, seed=3)])).outputs[0]
    assert o.draft_tokens == [] and o.target_tokens == [plain.token_id]
    assert len(o.confidences) == 1  # drafted no deeper than needed (at least one)
    rc.release(["z"])
    r0.release(["z"])
