"""Verify rows -> the numbers acceptance needs, batched over requests.

For a batch of requests, request r ran the target on ``[anchor, d_1..d_K]``
(K = K_r >= 0, rows concatenated in request order, ``sum(K_r + 1)`` rows).
Row i of request r is at position ``a_r + i`` and yields ``q_i``, the
distribution of the token at position ``a_r + i + 1``. ``verify`` returns per
request a ``dspark.shared.acceptance.VerifyResult``:

- ``t_i``: the target's own token at position a_r + i + 1: the argmax for
  greedy rows; for a sampled request, on the bonus row (when acceptance
  reaches it) exactly what ``sampler.sample`` returns for (seed, a_r + i + 1)
  on that row (``sampler.sampled_tokens``: the inverse CDF of the row's
  filtered distribution at the sampler's own uniform, stream
  ``STREAM_SAMPLE``), so plain and speculative decoding share one stream and
  a K = 0 request is a plain decode step;
- ``q(d_i)`` with q = ``processed_probs`` (softmax of the sampler's filtered
  logits, one-hot at the argmax for greedy rows), and ``p(d_i)`` from the
  draft's processed rows (1.0 for a one-hot draft), float32 values as the
  wire carries them, so the worker's own acceptance (async anchors, the
  walk) sees what the scheduler sees;
- ``u_i`` = ``rng.uniform(seed, a_r + i, STREAM_ACCEPT)`` (the position of d_i);
- the residual sample from ``normalize(max(0, q_{i-1} - p_i))`` by inverse
  CDF with ``rng.uniform(seed, a_r + i, STREAM_RESIDUAL)``, or -1 when that
  vector is zero.

A greedy request drafted greedily reduces to comparisons. Any other request
is walked in acceptance's order, running acceptance's test on the same
float32 values and uniforms the scheduler will (``_walk``): q is computed for
the rows acceptance reaches, the residual only at the draft it first
rejects. Past that point the fields are placeholders acceptance never reads
(q = 0, residual ``RESIDUAL_SKIPPED``, t = the argmax); an acceptance that
disagreed would raise on the skipped residual rather than accept. A sampled
window of 8 rows thus filters ~1 + accepted rows instead of 8.

``processed_probs`` and ``sample_draft`` (stream ``STREAM_DRAFT``, inverse
CDF) are what the drafter's left-to-right Markov loop uses to draft at the
request's temperature (``sample_draft_rows``: in one native call on the CPU
where the kernels are built), so p and q are filtered the same way.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dspark.shared.acceptance import RESIDUAL_NONE, RESIDUAL_SKIPPED, VerifyResult
from dspark.shared.rng import STREAM_ACCEPT, STREAM_DRAFT, STREAM_RESIDUAL, uniform

from .model.native_argmax import argmax_rows
from .sampler import RowParams, _filtered_logits, inverse_cdf, native_sample, sampled_tokens


@dataclass
class VerifyInput:
    """One request's share of a verify batch.

    ``params.position`` is ignored: positions follow from ``anchor_position``.
    """

    draft_tokens: list[int]  # [K] d_1..d_K, K >= 0
    params: RowParams  # the request's temperature, top_k, top_p, seed
    anchor_position: int  # position of the anchor row (row 0)
    # [K, V] the distributions p_1..p_K the drafts were actually drawn from
    # (processed_probs rows + sample_draft), or None when each d_i is the
    # argmax (one-hot p). Passing full rows for argmax drafts is lossy.
    draft_probs: torch.Tensor | None = None


def processed_probs(logits: torch.Tensor, params: Sequence[RowParams]) -> torch.Tensor:
    """logits [N, V] -> the distribution each row samples from, [N, V] float32:
    softmax of the sampler's temperature/top-k/top-p filtered logits, one-hot
    at the argmax for greedy rows."""
    logits = logits.float()
    greedy = [i for i, p in enumerate(params) if p.greedy]
    rand = [i for i, p in enumerate(params) if not p.greedy]
    if not greedy:  # all sampled (a sampled request's draft rows): no scatter
        return torch.softmax(_filtered_logits(logits, list(params)), dim=-1)
    probs = torch.zeros_like(logits)
    if greedy:
        g = _index(greedy, logits.device)
        probs.index_put_((g, argmax_rows(logits.index_select(0, g))),
                         torch.ones(len(greedy), device=logits.device))
    if rand:
        r = _index(rand, logits.device)
        sub = _filtered_logits(logits.index_select(0, r), [params[i] for i in rand])
        probs.index_copy_(0, r, torch.softmax(sub, dim=-1))
    return probs


def sample_draft(probs: torch.Tensor, params: Sequence[RowParams],
                 positions: Sequence[int]) -> torch.Tensor:
    """probs [N, V] (``processed_probs`` rows) -> draft tokens [N] long.

    Greedy rows take the argmax (their p is one-hot); sampled rows draw by
    inverse CDF with ``uniform(seed, positions[i], STREAM_DRAFT)``, where
    positions[i] is the position of the drafted token.
    """
    rand = [i for i, p in enumerate(params) if not p.greedy]
    if len(rand) == len(params):  # all sampled: no argmax, no scatter
        u = [uniform(p.seed, pos, STREAM_DRAFT) for p, pos in zip(params, positions)]
        return inverse_cdf(probs.float(), u)
    tokens = argmax_rows(probs)
    if rand:
        r = _index(rand, probs.device)
        u = [uniform(params[i].seed, positions[i], STREAM_DRAFT) for i in rand]
        tokens.index_copy_(0, r, inverse_cdf(probs.index_select(0, r).float(), u))
    return tokens


def sample_draft_rows(logits: torch.Tensor, params: Sequence[RowParams],
                      positions: Sequence[int]
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sampled draft rows (every row sampled): logits [N, V] -> (the distribution
    each row draws from [N, V] float32, the drafts [N] long, p(draft) [N] float32).

    ``processed_probs`` then ``sample_draft`` (stream ``STREAM_DRAFT``), or on
    the CPU where the native kernels are built one call for the batch
    (``native/top_kp.cpp`` ``sample_rows``: the same filter, a softmax over the
    kept tokens and the inverse CDF at the same uniform; ~20 torch ops a
    drafted position otherwise). Either way the draft is drawn from exactly
    the distribution returned, which is all acceptance needs of it."""
    out = native_sample(logits, params, STREAM_DRAFT, positions)
    if out is not None:
        return out
    probs = processed_probs(logits, params)
    drawn = sample_draft(probs, params, positions)
    return probs, drawn, probs.gather(1, drawn.unsqueeze(1)).squeeze(1)


def verify(logits: torch.Tensor, inputs: Sequence[VerifyInput]) -> list[VerifyResult]:
    """logits [sum(K_r + 1), V] of the verify rows -> one VerifyResult per input.

    Any float dtype: greedy rows take the argmax as given (a bf16 row's argmax is
    its float32 copy's), only the sampled rows are converted to float32.

    A greedy request drafted greedily reduces to comparisons. Any other request
    (sampled, or with draft distributions) is walked row by row in acceptance's
    order (``_walk``): the V-sized work of a row (its filtered distribution q,
    the residual) is done only where acceptance will read it, so its fields
    past the first rejection are placeholders acceptance never reads."""
    offsets, n = [], 0
    for x in inputs:
        k = len(x.draft_tokens)
        if x.draft_probs is not None and tuple(x.draft_probs.shape) != (k, logits.shape[1]):
            raise ValueError(f"draft_probs has shape {tuple(x.draft_probs.shape)}, "
                             f"expected ({k}, {logits.shape[1]})")
        offsets.append(n)
        n += k + 1
    if logits.shape[0] != n:
        raise ValueError(f"logits has {logits.shape[0]} rows, the inputs need {n}")
    target = argmax_rows(logits).tolist()  # greedy rows' t_i (placeholders elsewhere)
    # draft k = d_{i+1} of request x, judged by target row off + i
    drafts = [_Draft(x, off + i, x.draft_tokens[i], x.anchor_position + i + 1)
              for x, off in zip(inputs, offsets) for i in range(len(x.draft_tokens))]
    p_rows = [x.draft_probs for x in inputs if x.draft_probs is not None]
    p = _Rows(torch.cat(p_rows).float().to(logits.device) if p_rows else None,
              [k for k, dr in enumerate(drafts) if dr.x.draft_probs is not None])
    # float32 as they travel (proto ``float``): the values the scheduler accepts on
    p_draft = _as_float32(_probs_of_drafts(p, range(len(drafts)), drafts, None))
    uniforms = [uniform(dr.x.params.seed, dr.position, STREAM_ACCEPT) for dr in drafts]
    # one-hot q and p (greedy, drafted greedily): q(d) = [d == t], the residual
    # is t where they differ
    q_draft = [1.0 if dr.token == target[dr.row] else 0.0 for dr in drafts]
    residual = [RESIDUAL_NONE if dr.token == target[dr.row] else target[dr.row]
                for dr in drafts]
    walks, first = [], 0
    for x, off in zip(inputs, offsets):
        kk = len(x.draft_tokens)
        if not x.params.greedy or x.draft_probs is not None:
            walks.append(_Walk(x, off, list(range(first, first + kk))))
        first += kk
    if walks:
        _walk(logits, walks, drafts, p, target, q_draft, p_draft, uniforms, residual)

    out, k = [], 0
    for x, off in zip(inputs, offsets):
        kk = len(x.draft_tokens)
        out.append(VerifyResult(
            draft_tokens=list(x.draft_tokens), target_tokens=target[off:off + kk + 1],
            q_draft=q_draft[k:k + kk], p_draft=p_draft[k:k + kk],
            uniforms=uniforms[k:k + kk], residual_tokens=residual[k:k + kk]))
        k += kk
    return out


@dataclass
class _Walk:
    """A request verified row by row: its first row, its drafts' indices, and the
    next draft acceptance will judge (``len(ks)``: the bonus row)."""

    x: VerifyInput
    off: int
    ks: list[int]
    j: int = 0

    def row_params(self, i: int) -> RowParams:
        p = self.x.params
        return RowParams(p.temperature, p.top_k, p.top_p, p.seed,
                         self.x.anchor_position + i + 1)


def _walk(logits: torch.Tensor, walks: list[_Walk], drafts: list[_Draft], p: _Rows,
          target: list[int], q_draft: list[float], p_draft: list[float],
          uniforms: list[float], residual: list[int]) -> None:
    """Acceptance's walk (``shared/acceptance.accept``, sampled rule) over each
    request, in rounds batched over requests, filling q_draft, residual and
    target in place where acceptance reads them.

    Each round computes q (``processed_probs``) for the row each request
    stands at while it has a draft to judge there, then: a draft with u * p < q is accepted (its residual
    RESIDUAL_SKIPPED), the walk goes on; at the first rejection the residual
    sample is drawn and the walk stops (a residual that is zero, q == p, is
    -1 and the walk goes on); past the last draft the bonus token t_K is the
    sampler's draw, as plain decoding draws it. Drafts after the stop keep q =
    0 and RESIDUAL_SKIPPED, rows after it the argmax: acceptance of these very
    values stops before them, and a different acceptance would raise on a
    skipped residual rather than accept."""
    dev, vocab = logits.device, logits.shape[1]
    q_rows: dict[int, torch.Tensor] = {}  # row -> q (sampled rows only)
    for w in walks:
        for k in w.ks:
            q_draft[k], residual[k] = 0.0, RESIDUAL_SKIPPED
    active = walks
    while active:
        # q of the row each sampled request stands at, to judge its next draft (a
        # request past its last draft needs only the bonus draw, which
        # sampled_tokens makes from the logits, as sample does)
        need = [(w, w.off + w.j) for w in active
                if not w.x.params.greedy and w.j < len(w.ks)]
        if need:
            rows = [r for _, r in need]
            q = processed_probs(logits.index_select(0, _index(rows, dev)),
                                [w.row_params(w.j) for w, _ in need])
            q_rows.update(zip(rows, q))
        bonus, reject, nxt = [], [], []
        for w in active:
            row = w.off + w.j
            if w.j == len(w.ks):
                if not w.x.params.greedy:
                    bonus.append((w, row))
                continue
            k = w.ks[w.j]
            d = drafts[k].token
            # a float32 tensor's value (or 0/1): exactly what the wire carries
            q_draft[k] = float(q_rows[row][d]) if row in q_rows else float(d == target[row])
            if uniforms[k] * p_draft[k] < q_draft[k]:  # accepted
                w.j += 1
                nxt.append(w)
            else:
                reject.append(w)
        if bonus:  # t_K: the sampler's draw on that row (as sample draws it)
            t = sampled_tokens(logits.index_select(0, _index([r for _, r in bonus], dev)),
                               [w.row_params(w.j) for w, _ in bonus]).tolist()
            for (_, r), tok in zip(bonus, t):
                target[r] = tok
        if reject:
            ks = [w.ks[w.j] for w in reject]
            rows = [w.off + w.j for w in reject]
            cached = [r for r in rows if r in q_rows]
            q = _Rows(torch.stack([q_rows[r] for r in cached]) if cached else None, cached)
            qf = _dense(q, rows, [target[r] for r in rows], vocab, dev)  # greedy: one-hot
            pf = _dense(p, ks, [drafts[k].token for k in ks], vocab, dev)
            res = (qf - pf).clamp_min_(0.0)  # [len(reject), V]
            u = [uniform(drafts[k].x.params.seed, drafts[k].position, STREAM_RESIDUAL)
                 for k in ks]
            picked = inverse_cdf(res, u).tolist()
            defined = (res.sum(-1) > 0).tolist()
            for w, k, tok, ok in zip(reject, ks, picked, defined):
                residual[k] = tok if ok else RESIDUAL_NONE
                if not ok:  # q == p there: acceptance goes on to the next draft
                    w.j += 1
                    nxt.append(w)
        active = nxt


@dataclass
class _Draft:
    x: VerifyInput
    row: int  # the target row that judges it (holds q for its position)
    token: int
    position: int


class _Rows:
    """Full distributions for a subset of rows, the others one-hot.

    ``probs[slot[j]]`` is row j's distribution when j is in ``slot``."""

    def __init__(self, probs: torch.Tensor | None, rows: Sequence[int]) -> None:
        self.probs = probs  # [len(rows), V] or None
        self.slot = {j: s for s, j in enumerate(rows)}


def _probs_of_drafts(dist: _Rows, rows: Sequence[int], drafts: list[_Draft],
                     onehot_at: list[int] | None) -> list[float]:
    """dist_row(d) per draft; a row without a full distribution is one-hot at
    ``onehot_at[row]`` (the target's argmax), or at the draft itself (p = 1)."""
    out = []
    full_k, full_s = [], []
    for k, (j, dr) in enumerate(zip(rows, drafts)):
        if j in dist.slot:
            full_k.append(k)
            full_s.append(dist.slot[j])
            out.append(0.0)
        elif onehot_at is None:
            out.append(1.0)
        else:
            out.append(1.0 if dr.token == onehot_at[j] else 0.0)
    if full_k:
        dev = dist.probs.device
        vals = dist.probs[_index(full_s, dev), _index([drafts[k].token for k in full_k], dev)]
        for k, v in zip(full_k, vals.tolist()):
            out[k] = v
    return out


def _dense(dist: _Rows, rows: Sequence[int], onehot_at: Sequence[int], vocab: int,
           device: torch.device) -> torch.Tensor:
    """[len(rows), V]: each row's full distribution, or one-hot at onehot_at."""
    out = torch.zeros(len(rows), vocab, device=device)
    dense_s = [s for s, j in enumerate(rows) if j in dist.slot]
    hot_s = [s for s, j in enumerate(rows) if j not in dist.slot]
    if dense_s:
        src = dist.probs.index_select(0, _index([dist.slot[rows[s]] for s in dense_s], device))
        out.index_copy_(0, _index(dense_s, device), src)
    if hot_s:
        out[_index(hot_s, device), _index([onehot_at[s] for s in hot_s], device)] = 1.0
    return out


def _index(ids: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(list(ids), dtype=torch.long, device=device)


def _as_float32(xs: list[float]) -> list[float]:
    """Python floats rounded to float32 (as a proto ``float`` carries them)."""
    return np.asarray(xs, dtype=np.float32).astype(np.float64).tolist()
