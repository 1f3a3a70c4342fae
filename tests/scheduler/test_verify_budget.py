"""The scheduler's verify-budget walk (services/scheduler/core/verify_budget.py) and
the SpsProfile cost model, with hand-made profiles."""
from __future__ import annotations

import pytest

from dspark.scheduler.core.verify_budget import (estimate, running_cumulative,
                                                 size_verify_budget)
from dspark.shared.types import SpsProfile
from dspark.shared.verify_fill import cumulative

A = cumulative([0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])  # one request's a_1..a_7


def test_profile_interpolates_and_extrapolates():
    p = SpsProfile(rows=(1, 8, 32), forward_ms=(10.0, 12.0, 30.0), draft_fixed_ms=3.0,
                   draft_per_request_ms=0.5)
    assert p.forward(1) == 10.0 and p.forward(0) == 10.0
    assert p.forward(4) == pytest.approx(10.0 + 3 * 2 / 7)
    assert p.forward(20) == pytest.approx(12.0 + 12 * 18 / 24)
    assert p.forward(64) == pytest.approx(30.0 + 32 * 18 / 24)  # past the grid: linear
    assert p.step(8, 0) == 12.0  # nothing drafts: no drafter cost
    assert p.step(8, 4) == pytest.approx(12.0 + 3.0 + 2.0)
    assert p.step(8, 4, depth=7) == p.step(8, 4)  # no per-position cost measured
    d = SpsProfile(rows=(1,), forward_ms=(10.0,), draft_fixed_ms=3.0,
                   draft_per_request_ms=0.5, draft_per_position_ms=0.25)
    assert d.step(1, 4, depth=1) == pytest.approx(10.0 + 3.0 + 4 * 0.5)
    assert d.step(1, 4, depth=7) == pytest.approx(10.0 + 3.0 + 4 * (0.5 + 6 * 0.25))
    assert d.step(1, 0, depth=7) == 10.0
    with pytest.raises(ValueError, match="ascending"):
        SpsProfile(rows=(8, 1), forward_ms=(1.0, 2.0))


def test_free_rows_verify_every_plausible_candidate():
    # memory-bound: extra rows cost nothing, drafting nothing
    free = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0))
    cands = [A, A[:3] + [0.0] * 4]
    assert size_verify_budget(free, 2, 2, cands, max_budget=100) == 7 + 3
    assert size_verify_budget(free, 2, 2, cands, max_budget=5) == 5  # the token budget


def test_compute_bound_verifies_little():
    # every row costs 1 ms: a draft row pays only if it is surely accepted
    bound = SpsProfile(rows=(1, 256), forward_ms=(1.0, 256.0))
    assert size_verify_budget(bound, 32, 32, [A] * 32, max_budget=224) == 0
    # a fixed cost per step, then 1 ms per row. Base 8 rows / 8 tokens: 8/28 per ms;
    # +.9: 8.9/29, +.5: 9.4/30, +.45: 9.85/31 (each better), then a .1 row: 9.95/32
    # (worse), and so on
    mid = SpsProfile(rows=(1, 256), forward_ms=(21.0, 276.0))
    cands = [[0.9, 0.45, 0.05]] + [[0.5, 0.1]] + [[0.1]] * 6
    v = size_verify_budget(mid, 8, 8, cands, max_budget=100)
    assert v == 3  # .9, .5, .45


def test_v_is_zero_when_drafting_costs_more_than_it_brings():
    dear = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0), draft_fixed_ms=100.0)
    assert size_verify_budget(dear, 1, 1, [A], max_budget=7) == 0
    free = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0))
    assert size_verify_budget(free, 1, 1, [[0.0] * 7], max_budget=7) == 0  # no candidate
    assert size_verify_budget(free, 1, 1, [A], max_budget=0) == 0
    assert size_verify_budget(free, 1, 1, [], max_budget=7) == 0


def test_the_walk_keeps_the_best_prefix_past_the_drafting_step():
    # drafting costs 6 ms once: the first draft (a = .1) alone does not pay it back
    # (1.1/46 < 1/40), five together do (1.5/46 > 1/40). A walk that stopped at the
    # first non-improving candidate would return 0.
    p = SpsProfile(rows=(1, 256), forward_ms=(40.0, 40.0), draft_fixed_ms=6.0)
    cands = [[0.1, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0]]
    assert 1.1 / 46 < 1 / 40 < 1.5 / 46
    assert size_verify_budget(p, 1, 1, cands, max_budget=7) == 5


def test_ties_do_not_change_the_count():
    free = SpsProfile(rows=(1, 256), forward_ms=(10.0, 10.0 + 0.001 * 255))
    same = [[0.5, 0.25]] * 4
    assert size_verify_budget(free, 4, 4, same, max_budget=3) == 3
    assert size_verify_budget(free, 4, 4, same, max_budget=100) == 8


def test_running_estimate_and_per_request_estimate():
    # no data yet: the prior (0.5 per position)
    assert running_cumulative([0, 0], [0, 0], 2) == [0.5, 0.25]
    # 100 judged at position 1, 30 accepted; 30 judged at position 2, 3 accepted
    run = running_cumulative([30, 3], [100, 30], 2)
    assert run[0] == pytest.approx(31 / 102)
    assert run[1] == pytest.approx(31 / 102 * 4 / 32)
    # a request's own confidences first, the replica's conditional rates after them
    est = estimate([0.9], run, 2)
    assert est == pytest.approx([0.9, 0.9 * 4 / 32])
    assert estimate([], run, 2) == pytest.approx(run)
    assert estimate([0.9, 0.8, 0.7], run, 2) == pytest.approx([0.9, 0.72])


def test_a_short_budget_pays_for_a_shallow_draft_only():
    """The worker drafts min(K, V) positions, so the walk prices V = 1 at depth 1.
    Flat forward (30 ms), drafting 1 ms a request plus 2 ms per position past
    the first: one draft at a = .3 brings 1.3 tokens in 31 ms (> 1 in 30); a
    second at a = .03 would cost 2 ms more for .03. Priced at full depth (13 ms,
    as a profile without per-position costs says) the same draft would not pay."""
    cands = [cumulative([0.3, 0.1, 0.5, 0.5, 0.5, 0.5, 0.5])]  # .3, .03, ...
    shallow = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0), draft_per_request_ms=1.0,
                         draft_per_position_ms=2.0)
    assert size_verify_budget(shallow, 1, 1, cands, max_budget=7) == 1
    assert 1.3 / 31 > 1 / 30 > 1.3 / 43
    full = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0), draft_per_request_ms=13.0)
    assert size_verify_budget(full, 1, 1, cands, max_budget=7) == 0
    # two requests with K = 3: a budget of 6 drafts 3 positions each, not 6
    # (2 + 5.88 tokens in 30 + 2 * 2 * 10 ms beats V = 1's 2.99 in 30; priced at
    # depth 6 it would cost 130 ms and lose to it)
    k3 = [cumulative([0.99, 0.99, 0.99])] * 2
    p = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0), draft_per_position_ms=10.0)
    assert size_verify_budget(p, 2, 2, k3, max_budget=6) == 6
    assert (2 + 5.88) / 70 > 2.99 / 30 > (2 + 5.88) / 130


def test_only_requests_in_the_best_prefix_draft_and_pay_for_it():
    from dspark.scheduler.core.verify_budget import choose_drafters

    # drafting costs 20 ms per drafting request: the confident request's 3 drafts pay
    # for its own drafting, the doubtful ones' would not pay for theirs
    p = SpsProfile(rows=(1, 256), forward_ms=(30.0, 30.0), draft_per_request_ms=20.0)
    cands = [[0.9, 0.8, 0.7, 0.0], [0.05, 0.0], [0.04, 0.0]]
    v = size_verify_budget(p, 3, 3, cands, max_budget=20)
    assert v == 3 and choose_drafters(cands, v) == {0}
    # charged for all three requests, the same drafts would not pay at all
    assert (3 + 2.4) / (30 + 60) < 3 / 30 < (3 + 2.4) / (30 + 20)
    assert choose_drafters(cands, 0) == set() and choose_drafters(cands, 4) == {0, 1}


def test_old_confidences_weigh_less_toward_the_running_rates():
    run = running_cumulative([90, 80], [100, 90], 2)  # 0.89, then 0.89 * 81/92
    own = [0.1, 0.5]
    fresh = estimate(own, run, 2)
    assert fresh == pytest.approx([0.1, 0.05])
    assert estimate(own, run, 2, weight=1.0) == fresh
    half = estimate(own, run, 2, weight=0.5)
    assert half == pytest.approx([(0.1 + run[0]) / 2, (0.05 + run[1]) / 2])
    assert estimate(own, run, 2, weight=1e-9) == pytest.approx(run)
    # a mix of two non-increasing estimates stays one
    for w in (0.9, 0.5, 0.1):
        e = estimate([0.2, 0.9, 0.9], run, 3, weight=w)
        assert all(a >= b for a, b in zip(e, e[1:])) and all(0.0 <= a <= 1.0 for a in e)
    # before a request has drafted there is nothing to weigh
    assert estimate([], run, 2, weight=0.25) == pytest.approx(run)
