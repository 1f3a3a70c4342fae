"""The drafter's greedy Markov loop in one native call, when it can run.

``DSparkDrafter.draft_from_h`` drafts K positions left to right: each position
adds the Markov bias of the previous draft, W2 @ W1[x_{k-1}], to the draft
head's logits and takes the argmax. In Python that is ~5 ops a position (~170
us each at batch 1 on the project's 2-core AVX512-BF16 EPYC, mostly dispatch).
``native/markov.cpp`` runs the whole greedy loop in one call from the packed W2
that the native linear kernels use, computing each bias as they do for one row,
so it picks exactly the drafts the Python loop picks
(``tests/worker/test_native_markov.py``).

Used by a serving drafter (packed with the native linear: ``--linear auto`` or
``native``, CPU, fp32 or bf16 on AVX512-BF16) for greedy drafting; sampled
drafting, training and every other case take the Python loop.
"""
from __future__ import annotations

import torch

from . import native_attention
from .native_linear import RowsWeight

_loaded: list = []


def _ext():
    if not _loaded:
        ext = native_attention.load(build=False)
        if ext is None or not hasattr(ext, "markov_greedy"):
            return None
        _loaded.append(ext)
    return _loaded[0]


def usable(w1_slot: torch.Tensor | None, packed_w2) -> bool:
    """Whether ``greedy_loop`` can run on these weights (the extension built, a
    CPU tensor, W2 packed by the native linear in W1's dtype)."""
    if w1_slot is None or not isinstance(packed_w2, RowsWeight):
        return False
    if w1_slot.device.type != "cpu" or packed_w2.wp.dtype != w1_slot.dtype:
        return False
    if tuple(packed_w2.shape) != tuple(w1_slot.shape):  # e.g. an odd rank padded for bf16
        return False
    ext = _ext()
    if ext is None:
        return False
    if w1_slot.dtype == torch.bfloat16:
        return packed_w2.wp.dim() == 4 and ext.has_markov_bf16()
    return w1_slot.dtype == torch.float32 and packed_w2.wp.dim() == 3


def greedy_loop(base: torch.Tensor, e0: torch.Tensor, w1_slot: torch.Tensor,
                packed_w2: RowsWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """base [B, D, Vd] float32 draft-head logits, e0 [B, r] = W1[anchor], W1's
    rows by draft slot [Vd, r], W2 packed -> (draft slots [B, D] int64, the W1
    rows each position's bias came from [B, D, r]). Call ``usable`` first."""
    return tuple(_ext().markov_greedy(base.contiguous(), e0.contiguous(), w1_slot,
                                      packed_w2.wp, packed_w2.n))
