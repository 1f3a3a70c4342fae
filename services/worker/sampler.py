"""Per-row sampling: greedy, temperature, top-k, top-p, seeded.

The sample at a position is a pure function of (seed, position, logits): each
sampled row draws exponential noise E from a generator seeded with
``mix(seed, position)`` and picks ``argmax(p_i / E_i)`` (the exponential race,
equivalent to sampling from p), so retries and preemption reproduce tokens.
The returned logprob is that of the token under the unmodified distribution
(``log_softmax`` of the raw logits).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.shared.rng import mix_seed  # stream 0 of the counter-based RNG

from .model.native_argmax import argmax_rows


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
        sub = _filtered_logits(logits.index_select(0, idx), [params[i] for i in rand])
        noise = torch.stack([_exp_noise(params[i], logits.shape[1]) for i in rand])
        noise = noise.to(logits.device)
        # argmax(p / E) == argmax(log p - log E); masked logits are -inf
        picked = argmax_rows(torch.log_softmax(sub, dim=-1) - noise.log())
        tokens.index_copy_(0, idx, picked)
    logprobs = logprobs_all.gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs


def _exp_noise(p: RowParams, vocab: int) -> torch.Tensor:
    g = torch.Generator(device="cpu")
    g.manual_seed(mix_seed(p.seed, p.position))
    return torch.empty(vocab, dtype=torch.float32).exponential_(generator=g)  # [V]


def _filtered_logits(logits: torch.Tensor, params: list[RowParams]) -> torch.Tensor:
    """Temperature, then top-k and top-p (on the tempered distribution) as -inf masks."""
    n, vocab = logits.shape
    temp = torch.tensor([p.temperature for p in params], dtype=logits.dtype,
                        device=logits.device)
    logits = logits / temp[:, None]
    need_k = any(0 < p.top_k < vocab for p in params)
    need_p = any(p.top_p < 1.0 for p in params)
    if not (need_k or need_p):
        return logits
    sorted_l, order = torch.sort(logits, dim=-1, descending=True)  # [n, V]
    remove = torch.zeros_like(sorted_l, dtype=torch.bool)
    if need_k:
        k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params],
                         device=logits.device)
        remove |= torch.arange(vocab, device=logits.device)[None, :] >= k[:, None]
    if need_p:
        # rows without top-p get a threshold above any cumulative sum: their
        # float32 running sum can round past 1.0 before the tail, which would
        # cut the tail of a top_p=1 row only because its batch has a top-p row
        top_p = torch.tensor([p.top_p if p.top_p < 1.0 else 2.0 for p in params],
                             dtype=logits.dtype, device=logits.device)
        probs = torch.softmax(sorted_l.masked_fill(remove, float("-inf")), dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
        remove |= before >= top_p[:, None]
        remove[:, 0] = False  # always keep the most likely token
    mask = torch.zeros_like(remove).scatter_(1, order, remove)
    return logits.masked_fill(mask, float("-inf"))
