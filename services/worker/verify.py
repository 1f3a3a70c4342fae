"""Verify rows -> the numbers acceptance needs, batched over requests.

For a batch of requests, request r ran the target on ``[anchor, d_1..d_K]``
(K = K_r >= 0, rows concatenated in request order, ``sum(K_r + 1)`` rows).
Row i of request r is at position ``a_r + i`` and yields ``q_i``, the
distribution of the token at position ``a_r + i + 1``. ``verify`` returns per
request a ``dspark.shared.acceptance.VerifyResult``:

- ``t_i``: exactly what ``sampler.sample`` returns for (seed, a_r + i + 1) on
  that row (argmax for greedy rows, otherwise the inverse CDF of q at the
  sampler's own uniform, stream ``STREAM_SAMPLE``), so plain and speculative
  decoding share one stream and a K = 0 request is a plain decode step;
- ``q(d_i)`` with q = ``processed_probs`` (softmax of the sampler's filtered
  logits, one-hot at the argmax for greedy rows), and ``p(d_i)`` from the
  draft's processed rows (1.0 for a one-hot draft);
- ``u_i`` = ``rng.uniform(seed, a_r + i, STREAM_ACCEPT)`` (the position of d_i);
- the residual sample from ``normalize(max(0, q_{i-1} - p_i))`` by inverse
  CDF with ``rng.uniform(seed, a_r + i, STREAM_RESIDUAL)``, or -1 when that
  vector is zero; for rows with a full q or p only where acceptance will read
  it (the first draft it rejects), ``RESIDUAL_SKIPPED`` elsewhere (the worker
  runs acceptance's test on the same float32 values and uniforms).

Only rows where q or p is not one-hot do V-sized residual work; a greedy
request drafted greedily reduces to comparisons. ``processed_probs`` and
``sample_draft`` (stream ``STREAM_DRAFT``, inverse CDF) are what the
drafter's left-to-right Markov loop uses to draft at the request's
temperature, so p and q are processed the same way.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dspark.shared.acceptance import RESIDUAL_NONE, RESIDUAL_SKIPPED, VerifyResult
from dspark.shared.rng import STREAM_ACCEPT, STREAM_DRAFT, STREAM_RESIDUAL, uniform

from .model.native_argmax import argmax_rows
from .sampler import RowParams, _filtered_logits, draw, inverse_cdf


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


def verify(logits: torch.Tensor, inputs: Sequence[VerifyInput]) -> list[VerifyResult]:
    """logits [sum(K_r + 1), V] of the verify rows -> one VerifyResult per input.

    Any float dtype: greedy rows take the argmax as given (a bf16 row's argmax is
    its float32 copy's), only the sampled rows are converted to float32."""
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
    row_params = [RowParams(x.params.temperature, x.params.top_k, x.params.top_p,
                            x.params.seed, x.anchor_position + i + 1)
                  for x in inputs for i in range(len(x.draft_tokens) + 1)]
    target, q = _target_rows(logits, row_params)
    # draft k = d_{i+1} of request x, judged by target row off + i
    drafts = [_Draft(x, off + i, x.draft_tokens[i], x.anchor_position + i + 1)
              for x, off in zip(inputs, offsets) for i in range(len(x.draft_tokens))]
    p_rows = [x.draft_probs for x in inputs if x.draft_probs is not None]
    p = _Rows(torch.cat(p_rows).float().to(logits.device) if p_rows else None,
              [k for k, dr in enumerate(drafts) if dr.x.draft_probs is not None])
    # float32 as they travel (proto ``float``): the values the scheduler accepts on
    q_draft = _as_float32(_probs_of_drafts(q, [dr.row for dr in drafts], drafts, target))
    p_draft = _as_float32(_probs_of_drafts(p, range(len(drafts)), drafts, None))
    uniforms = [uniform(dr.x.params.seed, dr.position, STREAM_ACCEPT) for dr in drafts]
    residual = _residuals(q, p, drafts, target, q_draft, p_draft, uniforms,
                          logits.shape[1], logits.device)

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


def _target_rows(logits: torch.Tensor, row_params: list[RowParams]) -> tuple[list[int], _Rows]:
    """t_j for every row (as ``sampler.sample``) and q_j for the sampled rows."""
    target = argmax_rows(logits)  # [n] greedy rows: argmax of the raw logits
    rand = [j for j, p in enumerate(row_params) if not p.greedy]
    if not rand:
        return target.tolist(), _Rows(None, [])
    r = _index(rand, logits.device)
    params = [row_params[j] for j in rand]
    q = torch.softmax(_filtered_logits(logits.index_select(0, r).float(), params), dim=-1)
    # the sampler's draw, term for term, so t_j == sample()'s token
    target.index_copy_(0, r, draw(q, params))
    return target.tolist(), _Rows(q, rand)


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


def _residuals(q: _Rows, p: _Rows, drafts: list[_Draft], target: list[int],
               q_draft: list[float], p_draft: list[float], uniforms: list[float],
               vocab: int, device: torch.device) -> list[int]:
    """The residual samples acceptance can use: per draft, the seeded sample from
    normalize(max(0, q - p)), -1 where that is zero.

    One-hot rows (q and p both one-hot) cost nothing and are always given. A
    draft with a full q or p row needs V-sized work, and acceptance reads its
    residual only where it first rejects (``u * p >= q``, on these very float32
    values and uniforms): so each request's drafts are walked in order, the
    residual is computed at its first rejected draft only (in one batch over
    requests), and the others get RESIDUAL_SKIPPED. Where that residual is zero
    (q == p: acceptance continues) the walk goes on past it in another batch."""
    out = [RESIDUAL_NONE] * len(drafts)
    full = set()
    for k, dr in enumerate(drafts):
        if dr.row in q.slot or k in p.slot:
            full.add(k)
        elif dr.token != target[dr.row]:  # one-hot q and p at different tokens
            out[k] = target[dr.row]
    if not full:
        return out
    requests: dict[int, list[int]] = {}
    for k, dr in enumerate(drafts):
        requests.setdefault(id(dr.x), []).append(k)
    walks = [(ks, 0) for ks in requests.values() if any(k in full for k in ks)]
    while walks:
        need = []  # (drafts of the request, index of the first rejected one)
        for ks, start in walks:
            for j in range(start, len(ks)):
                k = ks[j]
                if out[k] == RESIDUAL_NONE and k not in full:
                    continue  # one-hot and equal: accepted
                if uniforms[k] * p_draft[k] < q_draft[k]:  # accepted (acceptance.accept)
                    if k in full:
                        out[k] = RESIDUAL_SKIPPED
                    continue
                if k in full:
                    need.append((ks, j))
                else:  # rejected, its residual known: nothing after it is read
                    _skip_after(out, ks, j, full)
                break
        if not need:
            break
        ks_need = [ks[j] for ks, j in need]
        qf = _dense(q, [drafts[k].row for k in ks_need],
                    [target[drafts[k].row] for k in ks_need], vocab, device)
        pf = _dense(p, ks_need, [drafts[k].token for k in ks_need], vocab, device)
        res = (qf - pf).clamp_min_(0.0)  # [len(need), V]
        u = [uniform(drafts[k].x.params.seed, drafts[k].position, STREAM_RESIDUAL)
             for k in ks_need]
        picked = inverse_cdf(res, u).tolist()
        defined = (res.sum(-1) > 0).tolist()
        walks = []
        for (ks, j), tok, ok in zip(need, picked, defined):
            if ok:
                out[ks[j]] = tok
                _skip_after(out, ks, j, full)
            else:  # q == p there: acceptance goes on to the next draft
                out[ks[j]] = RESIDUAL_NONE
                walks.append((ks, j + 1))
    return out


def _skip_after(out: list[int], ks: list[int], j: int, full: set[int]) -> None:
    """Drafts after a request's first rejection: their residuals are never read."""
    for k in ks[j + 1:]:
        if k in full:
            out[k] = RESIDUAL_SKIPPED


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
