"""The start-up profile's forward times are made non-decreasing in the rows
(``dspark.worker.profile.non_decreasing``) before the verify budget uses them."""
from __future__ import annotations

import pytest

from dspark.worker.profile import GRID, non_decreasing


def test_monotone_times_are_kept():
    times = [9.8, 10.0, 10.2, 11.8, 17.7, 30.0]
    assert non_decreasing(times) == times


@pytest.mark.parametrize("times, want", [
    ([10.0, 9.0, 11.0, 12.0], [9.5, 9.5, 11.0, 12.0]),     # a high first point pooled
    ([10.0, 11.0, 10.5, 13.0], [10.0, 10.75, 10.75, 13.0]),  # a low middle point pooled
    ([3.0, 2.0, 1.0], [2.0, 2.0, 2.0]),                   # all out of order: their mean
    ([5.0], [5.0]),
])
def test_violators_are_pooled_into_their_mean(times, want):
    got = non_decreasing(times)
    assert got == pytest.approx(want)
    assert all(a <= b for a, b in zip(got, got[1:]))
    assert sum(got) == pytest.approx(sum(times))  # least squares keeps the total


def test_the_grid_has_the_short_windows():
    """2 and 4 rows are timed: the cost of 1 -> 8 rows is not a straight line."""
    assert GRID[:4] == (1, 2, 4, 8) and list(GRID) == sorted(GRID)
