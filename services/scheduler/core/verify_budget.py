"""Confidence-scheduled verification: the scheduler's per-step verify budget
(DSPARK.md 4.3 and 4.4, the asynchronous variant). Pure functions.

A step's speculating requests each have estimated cumulative confidences
a_{r,1..K} (P(drafts 1..j all accepted)), known before the step runs: the
drafter's confidences from the request's last verify result, or, before it
has one, the replica's running per-position acceptance. The walk of 4.3 sizes
the budget V, the total number of draft rows the step verifies:

- start with no drafts: rows B = the step's rows without drafts (prefill chunks,
  anchors), expected tokens tau = the tokens it commits anyway (one per
  sampling sequence), time = forward(B), no drafting;
- take the candidates (r, j) by a descending (ties: smaller j, then plan order):
  each adds one row and a_{r,j} expected tokens; the requests with a candidate
  in the prefix are the ones that draft (the drafter's measured fixed cost from
  the first one on, plus its per-request cost for each at the prefix's draft
  depth: the worker drafts min(K, V) positions per drafting request, so a
  budget of 1 or 2 rows pays for 1 or 2 positions of the draft head, not K);
- V = the prefix with the best expected tokens per second, tau / time, and
  those requests draft (``choose_drafters``); the others run a plain step.

DSPARK.md's synchronous walk stops at the first candidate that does not
improve the rate; there that early stop keeps the selection independent of the
current drafts. Here the budget comes from earlier confidences and the worker
fills it at run time from the current ones (``dspark.shared.verify_fill``), so
the walk may look at every prefix and keep the best: drafting costs a step at
V = 1 (the drafter runs for all speculating requests at once), after which a
run of cheap rows can still pay it back.

The worker then verifies, per drafting request, the prefix of its current
drafts that the top V candidates by current cumulative confidence choose.
"""
from __future__ import annotations

from collections.abc import Sequence

from dspark.shared.types import SpsProfile
from dspark.shared.verify_fill import cumulative, ranked

# Conditional acceptance assumed per position before the replica has verified
# anything, and its weight in pseudo-steps (a weak prior: real counts take over).
PRIOR_ACCEPTANCE = 0.5
PRIOR_WEIGHT = 2.0


def size_verify_budget(profile: SpsProfile, base_rows: int, base_tokens: int,
                       candidates: Sequence[Sequence[float]], max_budget: int) -> int:
    """The step's verify budget V in 0..max_budget.

    Args:
      profile: the worker's measured forward and drafting costs.
      base_rows: rows of the step without drafts (>= 1).
      base_tokens: tokens the step commits without drafts.
      candidates: per speculating request (plan order) its estimated cumulative
        confidences a_{r,1..K} (non-increasing, in [0, 1]).
      max_budget: the most draft rows the step may take (token budget, K per request).
    """
    cands = ranked(candidates)[:max(0, max_budget)]
    if not cands:
        return 0
    k_max = max(len(cs) for cs in candidates)
    drafting: set[int] = set()
    tau = float(base_tokens)
    best_v, best_rate = 0, tau / profile.step(base_rows, 0)
    for v, (neg_a, _, r) in enumerate(cands, start=1):
        tau -= neg_a
        drafting.add(r)
        rate = tau / profile.step(base_rows + v, len(drafting), min(v, k_max))
        if rate > best_rate:
            best_v, best_rate = v, rate
    return best_v


def choose_drafters(candidates: Sequence[Sequence[float]], v: int) -> set[int]:
    """The requests (indices into ``candidates``) with a candidate among the top v:
    the ones that draft this step."""
    return {r for _, _, r in ranked(candidates)[:max(0, v)]}


def running_cumulative(accepted_per_pos: Sequence[int], verified_per_pos: Sequence[int],
                       k: int) -> list[float]:
    """The replica's running estimate of a_1..a_K: products of the per-position
    conditional acceptance (accepted / judged), each with a weak prior."""
    rates = []
    for j in range(k):
        acc = accepted_per_pos[j] if j < len(accepted_per_pos) else 0
        ver = verified_per_pos[j] if j < len(verified_per_pos) else 0
        rates.append((acc + PRIOR_ACCEPTANCE * PRIOR_WEIGHT) / (ver + PRIOR_WEIGHT))
    return cumulative(rates)


def estimate(last_confidences: Sequence[float], running: Sequence[float], k: int,
             weight: float = 1.0) -> list[float]:
    """A request's a_1..a_K for the next step: the cumulative products of the
    drafter's confidences from its last verify result; positions it did not draft
    (or all K, before it has one) continue with the replica's running conditional
    rates (``running`` = running_cumulative).

    ``weight`` in [0, 1] is how much those confidences still say about the next
    draft: the estimate is ``running + weight * (own - running)`` per position.
    The scheduler lowers it with every step the request runs without drafting
    (``SchedulerConfig.verify_confidence_decay``), so one unlucky draft does not
    keep a request from drafting for good. Both sequences are non-increasing in
    [0, 1], and so is any such mix."""
    own = cumulative(last_confidences[:k])
    out = list(own)
    for j in range(len(own), k):
        prev_run = running[j - 1] if j else 1.0
        cond = running[j] / prev_run if prev_run > 0 else 0.0
        out.append((out[-1] if out else 1.0) * cond)
    if weight >= 1.0 or not own:
        return out
    w = max(0.0, weight)
    return [r + w * (o - r) for o, r in zip(out, running)]
