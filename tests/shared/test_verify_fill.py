"""The worker's fill rule of confidence-scheduled verification (shared/verify_fill.py)."""
from __future__ import annotations

import math

import pytest

from dspark.shared.verify_fill import cumulative, fill_verify_budget


def test_cumulative_products_clamp_bad_values():
    assert cumulative([0.5, 0.5, 1.0]) == [0.5, 0.25, 0.25]
    assert cumulative([0.9, float("nan"), 0.9]) == [0.9, 0.0, 0.0]
    assert cumulative([1.5, -0.1]) == [1.0, 0.0]  # c is a probability
    assert cumulative([]) == []


def test_top_v_by_cumulative_confidence_across_requests():
    # a: r0 = .9, .81, .081   r1 = .5, .495
    conf = [[0.9, 0.9, 0.1], [0.5, 0.99]]
    assert fill_verify_budget(conf, 1) == [1, 0]
    assert fill_verify_budget(conf, 2) == [2, 0]
    assert fill_verify_budget(conf, 3) == [2, 1]
    assert fill_verify_budget(conf, 4) == [2, 2]
    assert fill_verify_budget(conf, 5) == [3, 2]
    assert fill_verify_budget(conf, 99) == [3, 2]  # never more than drafted


def test_lengths_are_prefixes_and_sum_to_at_most_v():
    # a later draft can never be chosen without the earlier ones, even when its own
    # confidence is high: a_{r,j} <= a_{r,j-1}
    conf = [[0.3, 1.0, 1.0, 1.0], [0.35, 0.2], [0.31]]
    for v in range(10):
        lens = fill_verify_budget(conf, v)
        assert sum(lens) == min(v, 7)
        assert all(0 <= n <= len(c) for n, c in zip(lens, conf))
    # a = .35 (r1,1), .31 (r2,1), .3 (r0,1..4: equal, smaller j first), .07 (r1,2)
    assert fill_verify_budget(conf, 2) == [0, 1, 1]
    assert fill_verify_budget(conf, 4) == [2, 1, 1]
    assert fill_verify_budget(conf, 6) == [4, 1, 1]


def test_ties_go_to_smaller_j_then_plan_order():
    assert fill_verify_budget([[0.5], [0.5], [0.5]], 2) == [1, 1, 0]
    # equal a at (r0, 2) and (r1, 1): the smaller j wins
    assert fill_verify_budget([[1.0, 0.5], [0.5]], 2) == [1, 1]
    assert fill_verify_budget([[1.0, 0.5], [0.5]], 3) == [2, 1]


def test_zero_budget_and_zero_confidence_verify_nothing():
    assert fill_verify_budget([[0.9, 0.9], [0.8]], 0) == [0, 0]
    assert fill_verify_budget([[0.0, 0.9], [0.8]], 10) == [0, 1]  # a = 0: never
    assert fill_verify_budget([[math.nan], [0.1]], 10) == [0, 1]
    assert fill_verify_budget([], 5) == []
    assert fill_verify_budget([[0.9]], -1) == [0]


@pytest.mark.parametrize("seed", range(5))
def test_random_fill_matches_a_brute_force_top_v(seed):
    import random

    rng = random.Random(seed)
    conf = [[rng.random() for _ in range(rng.randrange(0, 8))] for _ in range(6)]
    v = rng.randrange(0, 20)
    lens = fill_verify_budget(conf, v)
    # brute force: every (r, j) with its a, sorted (-a, j, r); take v
    cands = sorted((-a, j, r) for r, c in enumerate(conf)
                   for j, a in enumerate(cumulative(c), start=1) if a > 0)[:v]
    want = [0] * len(conf)
    for _, j, r in cands:
        want[r] += 1
    assert lens == want


def test_step_times_trim_the_fill_to_the_rows_that_pay():
    """With the step's expected time for 0..V verified rows, the fill keeps a
    prefix of the ranked candidates while (tokens without drafts + sum of a) /
    time rises: free rows keep everything, dear ones nothing."""
    conf = [[0.9, 0.9, 0.1], [0.5, 0.99]]  # ranked a: .9, .81, .5, .495, .081
    ms = lambda per_row: [10.0 + per_row * v for v in range(6)]  # noqa: E731
    assert fill_verify_budget(conf, 5, ms(0.0), base_tokens=2) == [3, 2]
    # 1 ms a row: 2.9/11, 3.71/12, 4.21/13, 4.705/14 rise; 4.786/15 does not
    assert fill_verify_budget(conf, 5, ms(1.0), base_tokens=2) == [2, 2]
    # 3 ms a row: 2.9/13, 3.71/16 rise; 4.21/19 does not
    assert fill_verify_budget(conf, 5, ms(3.0), base_tokens=2) == [2, 0]
    assert fill_verify_budget(conf, 5, ms(5.0), base_tokens=2) == [0, 0]
    # never more than the budget, trimmed or not
    assert fill_verify_budget(conf, 2, ms(0.0)[:3], base_tokens=2) == [2, 0]


def test_the_trim_stops_at_the_first_candidate_that_does_not_pay():
    """The early stop of DSPARK.md 4.3: a later candidate that would raise the rate
    again is not looked at (whether a draft is verified may depend only on the
    candidates ranked before it, never on the drafts after it)."""
    # a = .15, .14: 1.15 / 12 < 1 / 10 stops, though 1.29 / 12.1 > 1 / 10
    assert fill_verify_budget([[0.15, 0.14 / 0.15]], 2, [10.0, 12.0, 12.1], 1) == [0]
    assert fill_verify_budget([[0.15, 0.14 / 0.15]], 2, None, 1) == [2]


def test_bad_step_times_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"verify_step_ms has 2 entries, must have "
                                         r"verify_budget \+ 1 = 4"):
        fill_verify_budget([[0.5, 0.5, 0.5]], 3, [1.0, 2.0], 1)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="verify_step_ms must be finite and > 0"):
            fill_verify_budget([[0.5]], 1, [10.0, bad], 1)
