"""The measured cost profile refitted from observed step times (profile_fit.py),
and the scheduler's use of it: a profile skewed at start-up is corrected, a
pinned one is used as given."""
from __future__ import annotations

import math

import pytest

from dspark.scheduler.core.profile_fit import OnlineProfile
from dspark.shared.types import SpsProfile, StepOutput

from sched_helpers import reference, sampling
from test_confidence_scheduling import K, BudgetWorker, add, conf_scheduler, drive

FLAT = SpsProfile(rows=(1, 8, 32), forward_ms=(100.0, 100.0, 100.0))


def true_ms(rows: int) -> float:
    return 2.0 + rows


def test_refit_follows_the_observed_costs():
    p = OnlineProfile(FLAT)
    for _ in range(150):
        for rows in (1, 8, 32):
            p.observe(rows, 0, true_ms(rows))
    for rows in (1, 8, 32):
        assert p.forward(rows) == pytest.approx(true_ms(rows), rel=0.03)
        assert p.step(rows, 0) == pytest.approx(true_ms(rows), rel=0.03)
    cur = p.current()
    assert cur.rows == FLAT.rows and cur.forward_ms == pytest.approx((3.0, 10.0, 34.0), rel=0.03)
    assert p.num_observed == 450 and p.base is FLAT  # the base is kept as measured


def test_points_not_reached_follow_the_nearest_one_seen():
    p = OnlineProfile(FLAT)
    assert p.factor(8) == 1.0 and p.current() == FLAT  # nothing seen: the base
    for _ in range(100):
        p.observe(1, 0, 5.0)
    # only one row count seen: the whole curve moves with it
    assert p.forward(1) == pytest.approx(5.0, rel=0.01)
    assert p.forward(32) == pytest.approx(5.0, rel=0.01)
    for _ in range(100):
        p.observe(32, 0, 50.0)  # now the far end is seen too, and 8 lies between
    assert p.forward(32) == pytest.approx(50.0, rel=0.01)
    assert p.forward(1) == pytest.approx(5.0, rel=0.01)  # its own observations stand
    assert 5.0 < p.forward(8) < 50.0


def test_one_stray_step_moves_it_a_little():
    p = OnlineProfile(FLAT, max_move=0.15)
    for _ in range(100):
        p.observe(1, 0, 10.0)
    before = p.forward(1)
    p.observe(1, 0, 5000.0)  # a GC pause, a noisy neighbour
    assert before < p.forward(1) <= before * math.exp(0.15) + 1e-9


def test_steps_without_a_time_change_nothing():
    p = OnlineProfile(FLAT)
    for rows, ms in ((8, 0.0), (8, float("nan")), (8, -3.0), (0, 10.0), (8, float("inf"))):
        p.observe(rows, 0, ms)
    assert p.num_observed == 0 and p.forward(8) == 100.0


def test_drafting_cost_scales_with_its_row_count():
    base = SpsProfile(rows=(1, 8), forward_ms=(100.0, 100.0), draft_fixed_ms=50.0)
    p = OnlineProfile(base)
    for _ in range(100):
        p.observe(8, 1, 15.0)  # a step of 8 rows that drafted: 150 ms measured, 15 seen
    assert p.step(8, 1) == pytest.approx(15.0, rel=0.01)


def test_a_step_is_compared_with_its_own_draft_depth():
    """Steps timed exactly as the base profile prices their depth move nothing;
    the same times read as depth 1 would look 6 x 10 ms too slow."""
    base = SpsProfile(rows=(1, 8), forward_ms=(100.0, 100.0), draft_per_request_ms=5.0,
                      draft_per_position_ms=10.0)
    p = OnlineProfile(base)
    for _ in range(20):
        p.observe(8, 2, 100.0 + 2 * (5.0 + 6 * 10.0), depth=7)
    assert p.factor(8) == pytest.approx(1.0)
    assert p.current().draft_per_position_ms == pytest.approx(10.0)
    shallow = OnlineProfile(base)
    for _ in range(20):
        shallow.observe(8, 2, 100.0 + 2 * (5.0 + 6 * 10.0))
    assert shallow.factor(8) > 1.5


@pytest.mark.parametrize("kw", [dict(rate=0.0), dict(rate=1.5), dict(max_move=0.0)])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        OnlineProfile(FLAT, **kw)


# --- in the scheduler ----------------------------------------------------------

class TimedWorker(BudgetWorker):
    """Reports a step time that grows with the rows it computes: row-bound,
    1 ms + 2 ms per row."""

    def step(self, plan):
        out = super().step(plan)
        rows = sum(len(s.token_ids) or 1 for s in plan.seqs) + sum(self.lens[-1])
        return StepOutput(out.step_id, out.outputs, forward_ms=1.0 + 2.0 * rows)


def _run(profile, explore_every=4, max_tokens=200):
    s = conf_scheduler(profile, num_blocks=512, budget=64)
    s.config.verify_explore_every = explore_every
    # the refit alone: confidences keep their weight (the fake drafter's 0.3 is
    # below its real acceptance, and aged estimates would move toward the latter)
    s.config.verify_confidence_decay = 1.0
    w = TimedWorker(512, 4, conf=lambda rid, pos: 0.3, wrong=lambda rid, pos: pos % 3 == 0)
    prompts = add(s, n=4, max_tokens=max_tokens)
    res, _ = drive(s, w, False)
    for rid, p in prompts.items():  # whatever it verifies, the output is exact
        assert res[rid] == reference(p, sampling(max_tokens=max_tokens, seed=int(rid[1:])))[0]
    assert s.load()["free_kv_blocks"] == 512 and s.load()["free_leases"] == 8
    return s, w


def test_a_profile_that_makes_rows_look_free_is_corrected():
    # measured flat (as under contention at start-up): every draft looks free.
    # Steps really cost 1 ms + 2 ms per row: four anchors commit 4 tokens in
    # 9 ms, and a draft (expected 0.3 tokens or less) never pays for its 2 ms.
    # After the refit nothing is drafted but in the exploration steps (one
    # request's window of 1, 2, 4 or K drafts in turn, every 4th step)
    s, w = _run(SpsProfile(rows=(1, 8, 32), forward_ms=(30.0, 30.0, 30.0)))
    assert isinstance(s.sps_profile, OnlineProfile) and s.sps_profile.num_observed > 0
    assert [lens for lens in w.lens if lens][0] == [K] * 4  # at first: every draft
    # (a step that drafts nothing verifies nothing: lens []); the last steps, where
    # one request is left (a point of the profile seldom observed), aside
    tail = w.lens[-48:-8]
    assert all(lens in ([], [1], [2], [4], [K]) for lens in tail)
    explored = [lens[0] for lens in tail if lens]
    assert 9 <= len(explored) <= 10  # exploration only
    assert set(explored) == {1, 2, 4, K}  # every window in turn
    assert s.sps_profile.forward(32) / s.sps_profile.forward(1) > 4
    assert s.num_explore_steps > 10


def test_a_pinned_profile_is_used_as_given():
    pinned = SpsProfile(rows=(1, 8, 32), forward_ms=(30.0, 30.0, 30.0), pinned=True)
    s, w = _run(pinned)
    assert s.sps_profile is pinned and s.num_explore_steps == 0
    assert all(lens == [K] * len(lens) for lens in w.lens if lens)  # never corrected


def test_no_exploration_when_switched_off():
    s, w = _run(SpsProfile(rows=(1, 8, 32), forward_ms=(30.0, 30.0, 30.0)),
                explore_every=0, max_tokens=80)
    assert s.num_explore_steps == 0


def test_each_observed_step_carries_the_depth_the_worker_drafted():
    """The refit compares a step's time with its own draft depth: min(K, budget)
    for the requests that drafted (the runner's rule), 1 for steps without."""
    # one request, rows at 5 ms each: only its likelier drafts are worth a row,
    # so budgets (and depths) vary with its confidences
    s = conf_scheduler(SpsProfile(rows=(1, 8, 32), forward_ms=(30.0, 65.0, 185.0)),
                       num_blocks=512, budget=64)
    s.config.verify_confidence_decay = 1.0
    w = TimedWorker(512, 4, conf=lambda rid, pos: 0.3 + 0.1 * (pos % 5))
    plans, observed = [], []
    step = w.step

    def recording_step(plan):
        plans.append(plan)
        return step(plan)

    w.step = recording_step
    prof = s.sps_profile
    observe = prof.observe

    def recording_observe(rows, drafting, ms, depth=1):
        observed.append((drafting, depth))
        observe(rows, drafting, ms, depth)

    prof.observe = recording_observe
    add(s, n=1, max_tokens=80)
    drive(s, w, False)
    assert len(observed) == len(plans)
    depths = set()
    for plan, (drafting, depth) in zip(plans, observed):
        ks = [q.num_speculative_tokens for q in plan.seqs if q.num_speculative_tokens]
        assert drafting == len(ks)
        if ks:
            assert depth == max(1, min(max(ks), plan.verify_budget))
            depths.add(depth)
    assert len(depths) > 1, depths  # shallow and deeper drafts both happened


def test_exploration_windows_cycle_up_to_k():
    from dspark.scheduler.core.speculation import explore_windows

    assert explore_windows(7) == (1, 2, 4, 7)
    assert explore_windows(8) == (1, 2, 4, 8)
    assert explore_windows(4) == (1, 2, 4)
    assert explore_windows(3) == (1, 2, 3)
    assert explore_windows(1) == (1,)
