"""Per-row sampling: greedy, temperature, top-k, top-p, seeded.

The sample at a position is a pure function of (seed, position, logits): a
sampled row takes the temperature/top-k/top-p distribution p of its logits and
draws by inverse CDF (the first token, in vocabulary order, whose running sum
of p passes u) with ``u = uniform(seed, position, STREAM_SAMPLE)`` from the
counter-based RNG, so retries, preemption and the speculative step's target
rows (``verify``) reproduce tokens. The returned logprob is that of the token
under the unmodified distribution (``log_softmax`` of the raw logits).

Cost on the project's 2-core CPU, over the default model's 49k vocabulary:
on the CPU top-k and top-p find their tokens without sorting the vocabulary
(a full descending sort took ~5 ms a row; see ``_kept``; accelerators sort
the batch at once, ``_filtered_by_sort``, the same tokens), and one uniform
replaces a vocabulary of exponential noise (~1 ms a row), so a sampled row
costs a few passes over its logits. ``_kept`` is ~10 ops a row (0.2-0.5 ms);
where the native kernels are built, ``native/top_kp.cpp`` runs the same
method for all rows in one call (its masses summed in double: at a top-p
boundary deep in a long tail a token of negligible mass may fall the other
way than in ``_kept``'s float32 sums), and ``sampled_tokens`` draws every
sampled row in one call (``native_sample``: the filter, a softmax over the
kept tokens and the CDF over them alone, where ``draw`` takes a cumsum of
the whole vocabulary). Verification draws a bonus row through
``sampled_tokens`` too, so either way a K = 0 request is a plain decode step.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dspark.shared.rng import STREAM_SAMPLE, uniform

from .model import native_attention
from .model.native_argmax import argmax_rows

# _kept: candidates are the tokens within this many (tempered) logits of the
# row's maximum, doubled until they hold the top-k set and the top-p mass
CANDIDATE_SPAN = 8.0


@dataclass(frozen=True)
class RowParams:
    """Sampling parameters of one logits row; position = position of the sampled token."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    position: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


def sample(logits: torch.Tensor, params: list[RowParams]) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [N, V] float32 -> (token ids [N] long, logprobs [N] float32)."""
    logprobs_all = torch.log_softmax(logits, dim=-1)  # [N, V]
    tokens = argmax_rows(logits)  # [N] greedy default
    rand = [i for i, p in enumerate(params) if not p.greedy]
    if rand:
        idx = torch.tensor(rand, dtype=torch.long, device=logits.device)
        tokens.index_copy_(0, idx, sampled_tokens(logits.index_select(0, idx),
                                                  [params[i] for i in rand]))
    logprobs = logprobs_all.gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs


def sampled_tokens(logits: torch.Tensor, params: Sequence[RowParams]) -> torch.Tensor:
    """The sampler's token for each row of logits [N, V] (every row sampled) at
    params[i].position: the inverse CDF of its filtered distribution at the
    row's ``STREAM_SAMPLE`` uniform. What ``sample`` draws, and what
    verification draws on a bonus row (so a K = 0 request is a plain decode
    step): one native call for the batch where the kernels are built
    (``native_sample``), else ``draw`` over the softmax of ``_filtered_logits``."""
    out = native_sample(logits, params, STREAM_SAMPLE, [p.position for p in params])
    if out is not None:
        return out[1]
    return draw(torch.softmax(_filtered_logits(logits.float(), list(params)), dim=-1), params)


def native_sample(logits: torch.Tensor, params: Sequence[RowParams], stream: int,
                  positions: Sequence[int]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Sampled rows in one native call (``native/top_kp.cpp`` ``sample_rows``):
    logits [N, V] -> (the filtered distribution each row draws from [N, V]
    float32, the token [N] long, its probability [N] float32), each drawn by
    inverse CDF at ``uniform(seed, positions[i], stream)``; None where the
    kernels are not built or the logits are not on the CPU. ``_kept``'s filter,
    a softmax over the kept tokens and a CDF over them alone: the sort-free
    path's ~20 torch ops a row (a 49k cumsum among them) in one pass or two."""
    if logits.device.type != "cpu":
        return None
    ext = native_attention.load(build=False)
    if ext is None or not hasattr(ext, "sample_rows"):
        return None
    f64 = torch.float64
    out = ext.sample_rows(
        logits.float().contiguous(), torch.tensor([p.temperature for p in params], dtype=f64),
        *_top_kp(params, logits.shape[1]),
        torch.tensor([uniform(p.seed, pos, stream) for p, pos in zip(params, positions)],
                     dtype=f64))
    return out[0], out[1], out[2]


def _top_kp(params: Sequence[RowParams], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The native kernels' per-row filter arguments: top_k [N] int64 (0: none),
    top_p [N] float64."""
    return (torch.tensor([p.top_k if 0 < p.top_k < vocab else 0 for p in params],
                         dtype=torch.long),
            torch.tensor([p.top_p for p in params], dtype=torch.float64))


def draw(probs: torch.Tensor, params: Sequence[RowParams]) -> torch.Tensor:
    """The inverse CDF of each row of probs [N, V] (filtered distributions) at
    the row's ``STREAM_SAMPLE`` uniform (params[i].position): ``sampled_tokens``
    without the native kernels."""
    return inverse_cdf(probs, [uniform(p.seed, p.position, STREAM_SAMPLE) for p in params])


def inverse_cdf(weights: torch.Tensor, u: Sequence[float]) -> torch.Tensor:
    """weights [N, V] >= 0 (unnormalised), u [N] in (0, 1) -> [N] long: the first
    index whose running sum exceeds u * total. Never returns a zero-weight
    index of a row with weight (a row of zeros gets 0; callers treat such rows
    as undefined)."""
    cdf = torch.cumsum(weights, dim=-1)  # [N, V]
    total = cdf[:, -1:].contiguous()
    x = torch.tensor(list(u), dtype=cdf.dtype, device=cdf.device)[:, None] * total
    idx = torch.searchsorted(cdf, x, right=True)[:, 0]  # [N]
    # u * total can round up to total: fall back to the first index where the
    # running sum reaches the total (the sum rose there: it has weight)
    last = torch.searchsorted(cdf, total, right=False)[:, 0]
    return torch.minimum(idx, last)


def _filtered_logits(logits: torch.Tensor, params: list[RowParams]) -> torch.Tensor:
    """Temperature, then top-k and top-p (on the tempered distribution) as -inf masks."""
    vocab = logits.shape[1]
    temp = torch.tensor([p.temperature for p in params], dtype=logits.dtype,
                        device=logits.device)
    logits = logits / temp[:, None]
    rows = [i for i, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0]
    if not rows:
        return logits
    if logits.device.type != "cpu":  # an accelerator sorts a batch fast, and syncs slowly
        return _filtered_by_sort(logits, params)
    ext = native_attention.load(build=False)
    if ext is not None and logits.dtype == torch.float32 and hasattr(ext, "top_kp_filter"):
        # every row in one call (native/top_kp.cpp: _kept's method, in C++)
        return ext.top_kp_filter(logits.contiguous(), *_top_kp(params, vocab))
    keep = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    for i in rows:
        p = params[i]
        keep[i] = False
        keep[i, _kept(logits[i], p.top_k if 0 < p.top_k < vocab else 0, p.top_p)] = True
    return logits.masked_fill(~keep, float("-inf"))


def _filtered_by_sort(logits: torch.Tensor, params: list[RowParams]) -> torch.Tensor:
    """top-k and top-p masks of tempered logits by one descending sort of the
    batch: the accelerators' path (one batched sort, no per-row syncs). On the
    CPU a sort of the 49k vocabulary costs ~5 ms a row, hence ``_kept``."""
    vocab = logits.shape[1]
    sorted_l, order = torch.sort(logits, dim=-1, descending=True)  # [n, V]
    remove = torch.zeros_like(sorted_l, dtype=torch.bool)
    if any(0 < p.top_k < vocab for p in params):
        k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params],
                         device=logits.device)
        remove |= torch.arange(vocab, device=logits.device)[None, :] >= k[:, None]
    if any(p.top_p < 1.0 for p in params):
        # rows without top-p get a threshold above any cumulative sum: their
        # float32 running sum can round past 1.0 before the tail
        top_p = torch.tensor([p.top_p if p.top_p < 1.0 else 2.0 for p in params],
                             dtype=logits.dtype, device=logits.device)
        probs = torch.softmax(sorted_l.masked_fill(remove, float("-inf")), dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
        remove |= before >= top_p[:, None]
        remove[:, 0] = False  # always keep the most likely token
    mask = torch.zeros_like(remove).scatter_(1, order, remove)
    return logits.masked_fill(mask, float("-inf"))


def _kept(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Token ids a row keeps: its top_k (0 = all) highest logits, then of those,
    in descending order, each token whose preceding mass (the distribution
    renormalised to the top-k set) is below top_p (the first always kept).

    Without sorting the vocabulary: the tokens within ``CANDIDATE_SPAN`` logits
    of the maximum are a prefix of the descending order (all ties included), so
    once they number at least top_k and hold at least top_p of the mass, every
    kept token is among them and sorting them alone gives the same answer. The
    span doubles until they do (at worst the whole vocabulary)."""
    vocab = x.shape[0]
    need = top_k or 1
    lse = torch.logsumexp(x, 0) if not top_k and top_p < 1.0 else None
    mx = x.max()
    span = CANDIDATE_SPAN
    while True:
        cand = (x >= mx - span).nonzero().squeeze(1) if span < float("inf") else \
            torch.arange(vocab, device=x.device)
        vals = x.index_select(0, cand)
        enough = cand.numel() >= need
        if enough and lse is not None:  # the candidates must hold top_p of the mass
            enough = float(torch.exp(torch.logsumexp(vals, 0) - lse)) >= top_p
        if enough or cand.numel() == vocab:
            break
        span = span * 2 if span < 1e4 else float("inf")
    vals, order = torch.sort(vals, descending=True)
    if top_k:
        vals, order = vals[:top_k], order[:top_k]
    if top_p < 1.0:
        probs = torch.softmax(vals, 0) if lse is None else torch.exp(vals - lse)
        before = torch.cumsum(probs, 0) - probs  # mass strictly before each token
        n = max(1, int((before < top_p).sum()))  # before is non-decreasing
        order = order[:n]
    return cand.index_select(0, order)
