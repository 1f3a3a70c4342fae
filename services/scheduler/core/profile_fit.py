"""The worker's cost profile, corrected by the step times the scheduler sees.

A worker measures its SpsProfile once, at start-up (``dspark.worker.profile``).
Measured on a busy machine it can be skewed: under CPU contention every grid
point took about the same (long) time, which makes extra verify rows look
free. Every step result carries the worker's wall time for the step
(``StepOutput.forward_ms``), so the scheduler refits as it goes:

- each grid point g of the profile has a correction factor c_g (1 at first);
  the corrected step time is ``base.step(rows, drafting) * c(rows)``, with c
  interpolated linearly in log space between the two grid points around
  ``rows`` (flat past the ends), as the base profile interpolates its times;
- an observed step moves the log factors of those two grid points towards
  log(observed / base), each in proportion to its interpolation weight, by at
  most ``max_move`` per step (a stray slow step, a GC pause, moves it by a
  little; a real shift is followed within some tens of steps);
- a grid point no step has reached yet takes the factor of the nearest one
  that has: after a shift the whole curve moves with the rows actually run, so
  a profile skewed at start-up is not trusted where nothing has been seen.

Only the shape matters to the verify budget (a common factor cancels in its
tokens-per-second comparison), so what this fixes is a wrong ratio between
the costs of few and many rows.
"""
from __future__ import annotations

import math

from dspark.shared.types import SpsProfile


class OnlineProfile:
    """``step(rows, drafting)`` like SpsProfile, plus ``observe`` and ``current``."""

    def __init__(self, base: SpsProfile, rate: float = 0.25, max_move: float = 0.15) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate={rate} must be in (0, 1]")
        if max_move <= 0.0:
            raise ValueError(f"max_move={max_move} must be > 0")
        self.base = base
        self.rate = rate
        self.max_move = max_move
        self._log_c = [0.0] * len(base.rows)
        self._seen = [False] * len(base.rows)
        self.num_observed = 0

    # ---- reading
    def _bracket(self, rows: int) -> tuple[int, int, float]:
        """Grid points (i, j) around ``rows`` and j's weight."""
        xs = self.base.rows
        if rows <= xs[0] or len(xs) == 1:
            return 0, 0, 0.0
        if rows >= xs[-1]:
            return len(xs) - 1, len(xs) - 1, 0.0
        j = next(k for k, x in enumerate(xs) if x >= rows)
        return j - 1, j, (rows - xs[j - 1]) / (xs[j] - xs[j - 1])

    def _point(self, g: int) -> float:
        """Grid point g's log factor (the nearest seen point's while g is unseen)."""
        if self._seen[g]:
            return self._log_c[g]
        seen = [k for k, s in enumerate(self._seen) if s]
        if not seen:
            return 0.0
        return self._log_c[min(seen, key=lambda k: (abs(k - g), k))]

    def factor(self, rows: int) -> float:
        i, j, w = self._bracket(rows)
        return math.exp((1.0 - w) * self._point(i) + w * self._point(j))

    def step(self, rows: int, drafting: int, depth: int = 1) -> float:
        return self.base.step(rows, drafting, depth) * self.factor(rows)

    def forward(self, rows: int) -> float:
        return self.base.forward(rows) * self.factor(rows)

    def current(self) -> SpsProfile:
        """The corrected profile on the base grid (for logs and metrics)."""
        fs = [math.exp(self._point(g)) for g in range(len(self.base.rows))]
        return SpsProfile(rows=self.base.rows,
                          forward_ms=tuple(t * f for t, f in zip(self.base.forward_ms, fs)),
                          draft_fixed_ms=self.base.draft_fixed_ms * fs[0],
                          draft_per_request_ms=self.base.draft_per_request_ms * fs[0],
                          draft_per_position_ms=self.base.draft_per_position_ms * fs[0])

    # ---- learning
    def observe(self, rows: int, drafting: int, ms: float, depth: int = 1) -> None:
        """One step's wall time ``ms`` over ``rows`` rows with ``drafting`` drafting
        requests at ``depth`` drafts each. Ignored when it carries no time (or no
        rows)."""
        if rows < 1 or not ms > 0.0 or not math.isfinite(ms):
            return
        i, j, w = self._bracket(rows)
        target = math.log(ms / self.base.step(rows, drafting, depth))
        now = (1.0 - w) * self._point(i) + w * self._point(j)
        move = max(-self.max_move, min(self.max_move, self.rate * (target - now)))
        # each point moves in proportion to its weight, so that the interpolated
        # value moves by exactly `move`
        pts = ((i, 1.0 - w), (j, w)) if i != j else ((i, 1.0),)
        norm = sum(wg * wg for _, wg in pts)
        for g, wg in pts:
            if wg <= 0.0:
                continue
            if not self._seen[g]:  # first evidence: start from the nearest seen point
                self._log_c[g], self._seen[g] = self._point(g), True
            self._log_c[g] += move * wg / norm
        self.num_observed += 1
