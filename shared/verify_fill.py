"""The worker's fill rule of confidence-scheduled verification (DSPARK.md 4.4).

The scheduler sizes a step's verify budget V from what it knew earlier; at run
time the worker fills it with the best candidates by the drafter's CURRENT
confidences: candidate (r, j) is "verify drafts 1..j of request r", worth the
cumulative confidence a_{r,j} = c_{r,1} * ... * c_{r,j} (an estimate of
P(drafts 1..j all accepted)). The top V candidates by a, ties to the smaller j
and then the earlier request in the plan, give request r its verify length
l_r = the largest chosen j. Because c <= 1, a is non-increasing in j, so the
chosen set is a prefix for every request and sum(l_r) <= V.

The choice depends on drafter outputs only (confidences, through the drafted
tokens before each position), never on the target's, so acceptance stays
lossless: whether draft j is verified depends on d_1..d_{j-1}, not on d_j.

Pure Python (no torch): the worker fills with it, the scheduler estimates the
next step's candidates with ``cumulative``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence


def cumulative(confidences: Sequence[float]) -> list[float]:
    """c_1..c_K -> a_1..a_K (a_j = c_1 * ... * c_j); a non-finite or negative c
    counts as 0."""
    out, a = [], 1.0
    for c in confidences:
        c = float(c)
        a *= min(c, 1.0) if math.isfinite(c) and c > 0.0 else 0.0
        out.append(a)
    return out


def fill_verify_budget(confidences: Sequence[Sequence[float]], budget: int) -> list[int]:
    """Per request r (plan order) its drafted confidences c_{r,1..K_r}; returns l_r,
    the number of leading drafts it verifies, with sum(l_r) <= budget. Candidates
    with a = 0 are never chosen."""
    cands = []
    for r, cs in enumerate(confidences):
        for j, a in enumerate(cumulative(cs), start=1):
            if a <= 0.0:
                break
            cands.append((-a, j, r))
    cands.sort()
    lengths = [0] * len(confidences)
    for _, j, r in cands[:max(budget, 0)]:
        lengths[r] = max(lengths[r], j)
    return lengths
