"""Drafter training data, part 2: the target's per-position features of a sequence.

One no-grad target forward over a whole sequence (chunked prefill over a scratch
paged KV cache, logits for every row) gives, for every position t:

* the tap rows (residual stream after each tap layer, concatenated): the
  drafter's context features, ``[L, m*d]`` in the model dtype;
* the target's next-token distribution ``p_t = softmax(logits_t)`` (temperature 1),
  stored either in full (float16 ``[L, V]``) or as its top-k support
  (float16 values + int32 indices, NOT renormalised);
* the target's greedy next token ``argmax p_t`` (always exact, from the full
  float32 logits): the drafter's block labels.

Memory per token (SmolLM2-135M: V = 49152, d = 576, m = 3 taps):
  taps            m*d*elem       = 3.4 KB (bf16) / 6.9 KB (fp32)
  probs, full     2*V            = 96 KB (fp16)
  probs, top-k    6*k            = 384 B for k = 64
  argmax          8 B
so a 400-token sequence costs ~40 MB with full probs, ~3-4 MB with top-64.
With ``logits_from`` (the trainer passes the prompt length) p_t, the LM head and
the softmax are computed and stored only from that position on: prompt rows cost
their taps only.
Transient during the forward: one chunk's logits ``[chunk, V]`` float32
(192 MB for chunk = 1024 at V = 49152, 96 MB at the default 512) plus a scratch
KV cache of ``2 * layers * L * kv_heads * head_dim`` elements.

Top-k L1 approximation: ``dense_probs`` puts zeros outside the kept support,
so the drafter's ``||p_d - p_t||_1`` becomes
``sum_{support} |p_d - p_t| + (1 - sum_{support} p_d)``, which is exact when
p_t has no mass outside the support and otherwise under-counts by at most the
dropped mass ``1 - sum_{support} p_t`` (and the support's own error). With
topk=None everything is exact up to float16 rounding of p_t.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.worker.model.kv_cache import PagedKVCache, build_metadata

KV_BLOCK = 16  # rows per block of the scratch cache


@dataclass
class Features:
    """Per-position target features of one sequence of length L."""
    taps: torch.Tensor                    # [L, m*d] model dtype
    argmax: torch.Tensor                  # [L] int64: argmax p_t (predicts token t+1);
    #                                       -1 before ``offset``
    probs: torch.Tensor | None = None     # [L - offset, V] float16 (full form)
    topk_vals: torch.Tensor | None = None  # [L - offset, k] float16 (top-k form)
    topk_idx: torch.Tensor | None = None   # [L - offset, k] int32
    vocab_size: int = 0
    offset: int = 0                       # first position with logits (``logits_from``)

    def __len__(self) -> int:
        return self.argmax.shape[0]

    def dense_probs(self, positions: torch.Tensor) -> torch.Tensor:
        """p_t at the given positions [...] (each >= offset) -> [..., V] float32
        (zeros off a top-k support)."""
        if positions.numel() and int(positions.min()) < self.offset:
            raise IndexError(f"p_t asked at position {int(positions.min())} < offset "
                             f"{self.offset} (features computed with logits_from={self.offset})")
        rows = positions - self.offset
        if self.probs is not None:
            return self.probs[rows].float()
        vals = self.topk_vals[rows].float()
        idx = self.topk_idx[rows].long()
        out = vals.new_zeros(*positions.shape, self.vocab_size)
        return out.scatter_(-1, idx, vals)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in
                   (self.taps, self.argmax, self.probs, self.topk_vals, self.topk_idx)
                   if t is not None)


@torch.no_grad()  # not inference_mode: the rows are later fed to a graph that needs grads
def target_features(llama, token_ids: list[int], tap_layers, chunk: int = 512,
                    topk: int | None = None, logits_from: int = 0) -> Features:
    """Run the target once over ``token_ids`` and return its per-position features.

    tap_layers: the drafter's ``target_layer_ids`` (tap i = residual after layer i).
    chunk: prefill chunk length (rows per forward); any value gives the same result.
    topk: None keeps the full p_t (float16); k keeps the k largest probabilities.
    logits_from: p_t / argmax only for positions >= this (training needs them only
    inside the answer: skips the LM head, softmax and storage over the prompt).
    """
    n = len(token_ids)
    a = llama.args
    max_len = llama.cos.shape[0]
    if n == 0:
        raise ValueError("target_features: empty sequence")
    if n > max_len:
        raise ValueError(f"target_features: sequence of {n} tokens exceeds the target's "
                         f"max_len={max_len} (load it with a larger max_len or truncate)")
    if chunk < 1:
        raise ValueError(f"target_features: chunk={chunk} must be >= 1")
    if topk is not None and not 1 <= topk <= a.vocab_size:
        raise ValueError(f"target_features: topk={topk} must be in [1, {a.vocab_size}]")
    logits_from = min(max(int(logits_from), 0), n)
    tap_layers = tuple(int(i) for i in tap_layers)
    dev, dt = llama.embed.device, llama.dtype
    nb = -(-n // KV_BLOCK)
    kv = PagedKVCache(a.num_layers, nb, KV_BLOCK, a.num_kv_heads, a.head_dim, dt, dev)
    blocks = list(range(nb))
    toks = torch.tensor(token_ids, dtype=torch.long, device=dev)
    taps = torch.empty(n, len(tap_layers) * a.hidden_size, dtype=dt, device=dev)
    argmax = torch.full((n,), -1, dtype=torch.long, device=dev)
    m = n - logits_from
    if topk is None:
        probs = torch.empty(m, a.vocab_size, dtype=torch.float16, device=dev)
        vals = idx = None
    else:
        probs = None
        vals = torch.empty(m, topk, dtype=torch.float16, device=dev)
        idx = torch.empty(m, topk, dtype=torch.int32, device=dev)
    for s in range(0, n, chunk):
        c = min(chunk, n - s)
        meta = build_metadata([(s, c, blocks)], KV_BLOCK, a.num_heads // a.num_kv_heads, dev)
        if meta.gather_blocks:
            meta.ws_k, meta.ws_v = kv.workspace(meta.gather_blocks)
        r0 = max(logits_from - s, 0)  # first row of this chunk that needs logits
        rows = torch.arange(r0, c, device=dev) if r0 < c else None
        logits = llama.forward(toks[s:s + c], meta, kv, rows, tap_layers, taps[s:s + c])
        if logits is None:
            continue
        lo, hi = s + r0 - logits_from, s + c - logits_from  # rows of the stored p_t
        argmax[s + r0:s + c] = logits.argmax(-1)
        p = torch.softmax(logits, -1)
        del logits
        if topk is None:
            probs[lo:hi] = p
        else:
            v, i = p.topk(topk, -1)
            vals[lo:hi], idx[lo:hi] = v, i
    return Features(taps, argmax, probs, vals, idx, a.vocab_size, logits_from)
