"""The drafter's greedy Markov loop in one native call (native/markov.cpp through
``native_markov``) picks exactly the drafts of the Python loop it replaces, and
a drafter packed with the native linear drafts the same tokens and confidences
through it as through the Python loop.

Kernel tests skip, with the reason, where the native kernels cannot be built
(no C++ compiler) or, for bf16, where the CPU has no AVX512-BF16.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dspark.worker.model import native_attention, native_markov
from dspark.worker.model.native_linear import Bf16Linear, RowsLinear

from .test_drafter import batch, make_drafter

EXT = native_attention.load(build=True)
needs_ext = pytest.mark.skipif(
    EXT is None, reason=f"native kernels unavailable: {native_attention.unavailable_reason()}")
DTYPES = [torch.float32, torch.bfloat16]


def _linear(dtype):
    if EXT is None:
        pytest.skip(f"native kernels unavailable: {native_attention.unavailable_reason()}")
    if dtype == torch.bfloat16:
        if not (EXT.has_linear_bf16() and EXT.has_markov_bf16()):
            pytest.skip("this CPU has no AVX512-BF16: no native bf16 kernels")
        return Bf16Linear(EXT)
    return RowsLinear(EXT)


def reference(lin, base, e0, w1_slot, w2_packed):
    """The Python loop of draft_from_h, greedy, on the packed W2 (one op at a time)."""
    slots, rows, e = [], [], e0
    for k in range(base.shape[1]):
        rows.append(e)
        logits = torch.add(base[:, k], lin(e, w2_packed))
        s = logits.argmax(-1)
        slots.append(s)
        e = F.embedding(s, w1_slot)
    return torch.stack(slots, 1), torch.stack(rows, 1)


def _case(dtype, b, depth, n, r, seed, kind):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(b, depth, n, generator=g) * 3
    if kind == "ties":  # many equal logits: the first maximum must win
        base = base.round()
    elif kind == "masked":  # most of the vocabulary masked off, one row all -inf
        base[base < 1.0] = float("-inf")
        base[0, 0] = float("-inf")
    elif kind == "nan":  # a NaN is the maximum (as torch.argmax)
        base[b - 1, depth - 1, n // 3] = float("nan")
        base[0, 0, n - 1] = float("nan")
    w1 = (torch.randn(n, r, generator=g)).to(dtype)
    w2 = (torch.randn(n, r, generator=g) * (0.0 if kind == "ties" else 0.5)).to(dtype)
    e0 = torch.randn(b, r, generator=g).to(dtype)
    return base, e0, w1, w2


@needs_ext
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b, depth, n, r, kind", [
    (1, 7, 16384, 64, "plain"),     # the default drafter's shape at batch 1
    (5, 7, 1000, 64, "plain"),      # a vocabulary that is not whole units of 16
    (3, 1, 16384, 64, "plain"),     # depth 1 (a budget of one draft)
    (4, 4, 257, 8, "ties"),
    (3, 5, 300, 16, "masked"),
    (2, 6, 160, 64, "nan"),
    (2, 3, 7, 2, "plain"),          # fewer outputs than one unit
    # batch 1 with a vocabulary of >= 64 units a thread: bf16 splits each
    # position's vocabulary between the threads and merges their maxima
    (1, 7, 4096, 64, "ties"),
    (1, 5, 4100, 16, "masked"),
    (1, 6, 4096, 64, "nan"),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_equals_python_loop(dtype, b, depth, n, r, kind, threads):
    lin = _linear(dtype)
    base, e0, w1, w2 = _case(dtype, b, depth, n, r, seed=b * 100 + depth, kind=kind)
    pw2 = lin.pack(w2)
    assert native_markov.usable(w1, pw2)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        slots, rows = native_markov.greedy_loop(base, e0, w1, pw2)
    finally:
        torch.set_num_threads(before)
    ref_slots, ref_rows = reference(lin, base, e0, w1, pw2)
    assert slots.dtype == torch.int64 and rows.dtype == dtype
    assert torch.equal(slots, ref_slots)
    assert torch.equal(rows, ref_rows)
    if kind == "nan":
        assert int(slots[0, 0]) == n - 1 and int(slots[b - 1, depth - 1]) == n // 3
    if kind == "masked":
        assert int(slots[0, 0]) == 0  # all -inf: the first index, as torch.argmax


@needs_ext
def test_kernel_rejects_mismatched_inputs():
    lin = RowsLinear(EXT)
    base, e0, w1, w2 = _case(torch.float32, 2, 3, 64, 8, seed=0, kind="plain")
    pw2 = lin.pack(w2)
    with pytest.raises(RuntimeError, match="W2 has"):
        EXT.markov_greedy(base[..., :32].contiguous(), e0, w1, pw2.wp, pw2.n)
    with pytest.raises(RuntimeError, match="one dtype"):
        EXT.markov_greedy(base, e0.to(torch.bfloat16), w1, pw2.wp, pw2.n)
    # a W2 packed by anything but the native linear (oneDNN, plain) is not usable
    assert not native_markov.usable(w1, w2)
    # nor one whose shape is not W1's (an odd rank, padded to pairs for bf16)
    if EXT.has_linear_bf16():
        w1o = torch.randn(64, 7).to(torch.bfloat16)
        assert not native_markov.usable(w1o, Bf16Linear(EXT).pack(torch.randn(64, 7)))
    assert not native_markov.usable(None, pw2)
    assert not native_markov.usable(w1.to(torch.bfloat16), pw2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_drafter_uses_the_kernel_and_drafts_as_the_python_loop(target, dtype,
                                                                      monkeypatch):
    """draft_from_h, greedy, on a drafter packed with the native linear: the one-call
    loop and the Python loop give the same tokens, p and confidences, at every depth;
    sampled drafting (pick) still takes the Python loop."""
    lin = _linear(dtype)
    vocab = list(range(3, 97, 2))
    dr = make_drafter(target, draft_vocab_size=len(vocab))
    dr.set_draft_vocab(vocab)
    dr = dr.to(dtype)
    dr.bind_target(target.embed.to(dtype), target.lm_head.to(dtype))
    assert dr.pack_for_inference((lin.pack, lin))
    ctx, cpos, clen, anchors, apos = batch(target, lengths=(11, 5, 8))
    h = dr.backbone(ctx.to(dtype), cpos, clen, anchors, apos)
    calls = []
    real = native_markov.greedy_loop
    monkeypatch.setattr(native_markov, "greedy_loop", lambda *a: calls.append(1) or real(*a))
    for depth in (None, 1, 3):
        native = dr.draft_from_h(h, anchors, depth=depth)
        with monkeypatch.context() as m:
            m.setattr(native_markov, "usable", lambda *a: False)
            python = dr.draft_from_h(h, anchors, depth=depth)
        assert torch.equal(native.tokens, python.tokens)
        assert set(native.tokens.flatten().tolist()) <= set(vocab)
        assert torch.equal(native.probs, python.probs) and bool((native.probs == 1).all())
        assert torch.equal(native.confidences, python.confidences)
        assert native.tokens.shape == (3, depth or dr.config.block_size)
    assert len(calls) == 3
    # a pick (sampled drafting) and the ablation without the Markov head never use it
    dr.draft_from_h(h, anchors, pick=lambda k, logits: (logits.argmax(-1), None))
    dr.draft_from_h(h, anchors, use_markov=False)
    assert len(calls) == 3
