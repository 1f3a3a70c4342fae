"""The fused ops of a decode / verify step (native): each layer's RoPE, K/V write
and attention in one call (``rope_write_attention``), and the residual update
fused into the next RMSNorm (``add_rms_norm_rows``). They must compute what the
separate ops compute, bit for bit, and the model must give the same logits,
taps and KV pool either way.

Skipped, with the reason, where the native kernels cannot be built.
"""
from __future__ import annotations

import random

import pytest
import torch

from dspark.worker.model import native_attention, native_linear
from dspark.worker.model.kv_cache import (PagedKVCache, build_metadata, pack_keys, pack_values,
                                          paged_attention)
from dspark.worker.model.llama import load_llama

from .conftest import TINY, write_tiny_llama

EXT = native_attention.load(build=True)
pytestmark = pytest.mark.skipif(
    EXT is None, reason=f"native kernels unavailable: {native_attention.unavailable_reason()}")

CPU = torch.device("cpu")


def _windows(rng: random.Random, n_seqs: int, max_rows: int, bs: int, pool_blocks: int):
    """(start, rows, block table) per sequence, on shuffled (scattered) blocks."""
    free = list(range(pool_blocks))
    rng.shuffle(free)
    seqs = []
    for _ in range(n_seqs):
        n, start = rng.randint(1, max_rows), rng.randint(0, 70)
        seqs.append((start, n, [free.pop() for _ in range(-(-(start + n) // bs))]))
    return seqs


def _rope_tables(positions: torch.Tensor, hd: int, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    f = torch.outer(positions.float(), inv)
    emb = torch.cat([f, f], -1)
    sin = emb.sin()
    return emb.cos().to(dtype), torch.cat([-sin[:, :hd // 2], sin[:, hd // 2:]], -1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,hd,bs", [(4, 2, 32, 16), (9, 3, 64, 16),
                                                  (4, 4, 16, 8), (6, 2, 32, 32)])
def test_rope_write_attention_is_the_three_ops(dtype, heads, kv_heads, hd, bs):
    """Against rope_rows + write_kv + paged_short_attention (the unfused native
    path): the same output and the same pools, bit for bit, for batches of decode
    rows and verify windows on scattered blocks."""
    rng = random.Random(heads * 31 + hd)
    g = torch.Generator().manual_seed(hd + bs)
    pool_blocks = 64
    for trial in range(5):
        seqs = _windows(rng, n_seqs=1 + 2 * trial, max_rows=8, bs=bs, pool_blocks=pool_blocks)
        t = sum(n for _, n, _ in seqs)
        qkv = torch.randn(t, (heads + 2 * kv_heads) * hd, generator=g).to(dtype)
        positions = torch.cat([torch.arange(s, s + n) for s, n, _ in seqs])
        cos, sin = _rope_tables(positions, hd, dtype)
        k_rows = torch.randn(pool_blocks * bs, kv_heads, hd, generator=g).to(dtype)
        v_rows = torch.randn(pool_blocks * bs, kv_heads, hd, generator=g).to(dtype)
        k1, v1 = pack_keys(k_rows, bs), pack_values(v_rows, bs)
        k2, v2 = k1.clone(), v1.clone()
        meta = build_metadata(seqs, bs, heads // kv_heads, CPU, native=EXT)
        assert meta.native is not None and not meta.long and meta.short is None
        qk = EXT.rope_rows(qkv, cos, sin, heads + kv_heads)
        v = qkv[:, (heads + kv_heads) * hd:].view(t, kv_heads, hd)
        ref = paged_attention(qk[:, :heads], qk[:, heads:], v, k1, v1, meta)
        got = EXT.rope_write_attention(qkv, cos, sin, k2, v2, meta.native.info,
                                       meta.native.tables, hd ** -0.5, heads, kv_heads)
        assert got.shape == (t, heads * hd)
        assert torch.equal(got, ref.view(t, heads * hd))
        assert torch.equal(k2, k1) and torch.equal(v2, v1)


def test_rope_write_attention_refuses_bad_inputs():
    heads, kvh, hd, bs = 4, 2, 16, 8
    k = torch.zeros(4, kvh, hd, bs, 1)
    v = torch.zeros(4, kvh, bs, hd)
    qkv = torch.randn(3, (heads + 2 * kvh) * hd)
    cos, sin = _rope_tables(torch.arange(3), hd, torch.float32)
    tables = torch.tensor([[0, 1]])

    def call(info, tables=tables, qkv=qkv, heads=heads):
        return EXT.rope_write_attention(qkv, cos, sin, k, v, torch.tensor(info), tables, 0.25,
                                        heads, kvh)

    call([[0, 3, 5]])  # rows 0..2 at positions 5..7: fine
    with pytest.raises(RuntimeError, match="row 2 is named by 0 windows"):
        call([[0, 2, 5]])
    with pytest.raises(RuntimeError, match="row 1 is named by 2 windows"):
        call([[0, 2, 5], [1, 2, 0]], tables=torch.tensor([[0, 1], [2, 3]]))
    with pytest.raises(RuntimeError, match="not within the 3 rows"):
        call([[1, 3, 5]])
    with pytest.raises(RuntimeError, match="past sequence 0's block table"):
        call([[0, 3, 14]])
    with pytest.raises(RuntimeError, match=r"block 9 out of range \[0, 4\)"):
        call([[0, 3, 6]], tables=torch.tensor([[0, 9]]))  # position 8: the second block
    with pytest.raises(RuntimeError, match="qkv width"):
        call([[0, 3, 5]], heads=2)
    with pytest.raises(RuntimeError, match="dtypes differ"):
        call([[0, 3, 5]], qkv=qkv.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_is_the_add_then_the_norm(dtype):
    g = torch.Generator().manual_seed(3)
    for t, d in ((1, 64), (7, 576), (40, 100)):
        x = torch.randn(t, d, generator=g).to(dtype)
        y = torch.randn(t, d, generator=g).to(dtype)
        w = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype)
        want_x = x + y
        want = EXT.rms_norm_rows(want_x, w, 1e-5)
        got = EXT.add_rms_norm_rows(x, y, w, 1e-5)
        assert torch.equal(x, want_x)  # updated in place
        assert torch.equal(got, want)
    with pytest.raises(RuntimeError, match="x and add"):
        EXT.add_rms_norm_rows(torch.zeros(2, 8), torch.zeros(3, 8), torch.ones(8), 1e-5)
    with pytest.raises(RuntimeError, match="contiguous"):
        EXT.add_rms_norm_rows(torch.zeros(8, 2).t(), torch.zeros(2, 8), torch.ones(8), 1e-5)


def _run_steps(model, steps, bs: int = 8, blocks: int = 40):
    """Run (start, rows, table, token ids) windows per step through model.forward
    on a fresh pool; returns every step's logits and taps, and the final pools."""
    a = model.args
    kv = PagedKVCache(a.num_layers, blocks, bs, a.num_kv_heads, a.head_dim, torch.float32, CPU)
    logits, taps = [], []
    for step in steps:
        seqs = [(s, len(ids), table) for s, ids, table in step]
        meta = build_metadata(seqs, bs, a.num_heads // a.num_kv_heads, CPU, native=EXT)
        tokens = torch.tensor([i for _, ids, _ in step for i in ids])
        out = torch.empty(tokens.shape[0], 2 * a.hidden_size)
        logits.append(model.forward(tokens, meta, kv, torch.arange(tokens.shape[0]), (0, 2), out))
        taps.append(out)
    return logits, taps, kv


def test_the_model_computes_the_same_with_and_without_the_fused_ops(tmp_path, monkeypatch):
    """A mixed prefill step (long chunks: the unfused attention, fused norms),
    then decode and verify steps of several sequences (one call a layer): the
    same logits, taps and KV pool, bit for bit, fp32."""
    path = write_tiny_llama(tmp_path / "m", seed=7)
    model = load_llama(path, torch.float32, CPU, 128, pack=True,
                       rows_linear=native_linear.RowsLinear(EXT))
    assert model.add_rms_norm is not None and model.rope is not None
    rng = random.Random(5)
    tables = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    prompts = [[rng.randrange(3, TINY["vocab_size"]) for _ in range(n)] for n in (20, 13, 9)]
    steps = [[(0, p, t) for p, t in zip(prompts, tables)]]
    pos = [len(p) for p in prompts]
    for n_rows in ((1, 1, 1), (8, 1, 3), (2, 5, 1), (1, 1, 1)):
        step = []
        for i, n in enumerate(n_rows):
            step.append((pos[i], [rng.randrange(3, 97) for _ in range(n)], tables[i]))
            pos[i] += n
        steps.append(step)
    calls = []
    one_call = EXT.rope_write_attention
    monkeypatch.setattr(EXT, "rope_write_attention", lambda *a: calls.append(1) or one_call(*a))
    results = []
    for fused in (True, False):
        model.fused_ops = fused
        results.append(_run_steps(model, steps))
        # one call a layer in each of the 4 steps of short windows only
        assert len(calls) == (4 * TINY["num_hidden_layers"] if fused else 0)
        calls.clear()
    (l1, t1, kv1), (l2, t2, kv2) = results
    for a, b in zip(l1, l2):
        assert torch.equal(a, b)
    for a, b in zip(t1, t2):
        assert torch.equal(a, b)
    for layer in range(TINY["num_hidden_layers"]):
        assert torch.equal(kv1.k[layer], kv2.k[layer])
        assert torch.equal(kv1.v[layer], kv2.v[layer])
