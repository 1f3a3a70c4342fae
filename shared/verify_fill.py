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


def ranked(cumulatives: Sequence[Sequence[float]]) -> list[tuple[float, int, int]]:
    """(-a, j, r) for every candidate with a_{r,j} > 0 (per request r its
    non-increasing a_{r,1..K}), best first: ties to the smaller j, then the
    earlier request. The scheduler's budget walk and the worker's fill share it."""
    return sorted((-a, j, r) for r, cs in enumerate(cumulatives)
                  for j, a in enumerate(cs, start=1) if a > 0.0)


def fill_verify_budget(confidences: Sequence[Sequence[float]], budget: int,
                       step_ms: Sequence[float] | None = None, base_tokens: int = 0
                       ) -> list[int]:
    """Per request r (plan order) its drafted confidences c_{r,1..K_r}; returns l_r,
    the number of leading drafts it verifies, with sum(l_r) <= budget. Candidates
    with a = 0 are never chosen.

    ``step_ms`` (optional, the scheduler's expected wall time of the step with v
    draft rows verified, v = 0..budget, drafting included) trims the fill to the
    rows the current confidences pay for: the walk of DSPARK.md 4.3 over the
    filled candidates best first, from ``base_tokens`` expected tokens at v = 0,
    keeping each candidate while (base_tokens + sum of a) / step_ms[v] rises
    and stopping at the first that does not (the early stop: whether a draft is
    verified then depends only on the candidates ranked before it, never on a
    later draft, so acceptance stays lossless)."""
    cands = ranked([cumulative(cs) for cs in confidences])[:max(budget, 0)]
    if step_ms is not None:
        if len(step_ms) != max(budget, 0) + 1:
            raise ValueError(f"verify_step_ms has {len(step_ms)} entries, must have "
                             f"verify_budget + 1 = {max(budget, 0) + 1}")
        if not all(math.isfinite(t) and t > 0.0 for t in step_ms):
            raise ValueError("verify_step_ms must be finite and > 0 (ms)")
        tau = float(base_tokens)
        best = tau / step_ms[0]
        for v, (neg_a, _, _) in enumerate(cands, start=1):
            tau -= neg_a
            rate = tau / step_ms[v]
            if rate <= best:
                cands = cands[:v - 1]
                break
            best = rate
    lengths = [0] * len(confidences)
    for _, j, r in cands:
        lengths[r] = max(lengths[r], j)
    return lengths
