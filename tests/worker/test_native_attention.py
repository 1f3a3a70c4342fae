"""The native short-window attention kernel against the PyTorch path.

Skipped, with the reason, where the kernel cannot be built (no C++ compiler).
"""
from __future__ import annotations

import json
import random

import pytest
import torch

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SamplingParams
from dspark.worker.model import native_attention
from dspark.worker.model.kv_cache import build_metadata, pack_keys, pack_values, paged_attention
from dspark.worker.runner import ModelRunner
from dspark.worker.training.engine import OfflineEngine

EXT = native_attention.load(build=True)
pytestmark = pytest.mark.skipif(
    EXT is None, reason=f"native attention unavailable: {native_attention.unavailable_reason()}")

CPU = torch.device("cpu")


def attend(seqs, q, k_new, v_new, k_rows, v_rows, bs, g, native):
    """paged_attention over a pool holding k_rows / v_rows ([slots, KV, hd] in slot
    order; it writes this step's K/V into its own copy)."""
    meta = build_metadata(seqs, bs, g, CPU, native=EXT if native else None)
    return paged_attention(q, k_new, v_new, pack_keys(k_rows, bs), pack_values(v_rows, bs), meta)


def random_step(rng: random.Random, n_seqs: int, max_rows: int, bs: int, pool_blocks: int,
                long_chunk: bool = False):
    """(start, rows, block table) per sequence; tables are shuffled, non-contiguous
    block ids, so keys are read from scattered blocks."""
    free = list(range(pool_blocks))
    rng.shuffle(free)
    seqs = []
    for i in range(n_seqs):
        n = 12 if long_chunk and i == 0 else rng.randint(1, max_rows)
        start = rng.randint(0, 70)
        nb = -(-(start + n) // bs)
        seqs.append((start, n, [free.pop() for _ in range(nb)]))
    return seqs


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads,hd", [(4, 2, 32), (9, 3, 64), (4, 4, 16)])
@pytest.mark.parametrize("bs", [8, 16, 32])  # tiles assembled from two blocks; read in place
def test_matches_the_pytorch_path(dtype, tol, heads, kv_heads, hd, bs):
    rng = random.Random(heads * 100 + hd)
    g = torch.Generator().manual_seed(hd)
    pool_blocks = 96
    for trial in range(4):
        seqs = random_step(rng, n_seqs=1 + 3 * trial, max_rows=8, bs=bs,
                           pool_blocks=pool_blocks, long_chunk=trial == 3)
        t = sum(n for _, n, _ in seqs)
        k = torch.randn(pool_blocks * bs, kv_heads, hd, generator=g).to(dtype)
        v = torch.randn(pool_blocks * bs, kv_heads, hd, generator=g).to(dtype)
        q = torch.randn(t, heads, hd, generator=g).to(dtype)
        kn = torch.randn(t, kv_heads, hd, generator=g).to(dtype)
        vn = torch.randn(t, kv_heads, hd, generator=g).to(dtype)
        ref = attend(seqs, q, kn, vn, k, v, bs, heads // kv_heads, native=False)
        got = attend(seqs, q, kn, vn, k, v, bs, heads // kv_heads, native=True)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        assert torch.allclose(got.float(), ref.float(), atol=tol, rtol=tol), \
            f"trial {trial}: max |diff| {(got.float() - ref.float()).abs().max():.3g}"


def test_a_row_does_not_depend_on_its_batch():
    """Each window's rows are computed the same way alone or among others: exact."""
    rng = random.Random(7)
    g = torch.Generator().manual_seed(7)
    bs, heads, kvh, hd = 8, 6, 2, 32
    seqs = random_step(rng, n_seqs=6, max_rows=8, bs=bs, pool_blocks=80)
    t = sum(n for _, n, _ in seqs)
    k, v = (torch.randn(80 * bs, kvh, hd, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(t, heads, hd, generator=g).to(torch.bfloat16)
    kn, vn = (torch.randn(t, kvh, hd, generator=g).to(torch.bfloat16) for _ in range(2))
    together = attend(seqs, q, kn, vn, k, v, bs, heads // kvh, native=True)
    row = 0
    for s in seqs:
        n = s[1]
        alone = attend([s], q[row:row + n], kn[row:row + n], vn[row:row + n], k, v, bs,
                       heads // kvh, native=True)
        assert torch.equal(alone, together[row:row + n])
        row += n


def test_the_thread_count_does_not_change_a_row():
    """A batch-1 verify window (3 KV heads) and a small batch, at 1 to 8 threads:
    the same bit for bit (a worker's output must not depend on its --threads),
    and equal to the PyTorch path to bf16 rounding."""
    rng = random.Random(11)
    g = torch.Generator().manual_seed(11)
    bs, heads, kvh, hd = 8, 9, 3, 64
    before = torch.get_num_threads()
    for seqs in ([(45, 8, list(range(7)))], random_step(rng, 2, 8, bs, 40)):
        t = sum(n for _, n, _ in seqs)
        k, v = (torch.randn(40 * bs, kvh, hd, generator=g).to(torch.bfloat16)
                for _ in range(2))
        q = torch.randn(t, heads, hd, generator=g).to(torch.bfloat16)
        kn, vn = (torch.randn(t, kvh, hd, generator=g).to(torch.bfloat16) for _ in range(2))
        outs = []
        try:
            for threads in (1, 2, 3, 4, 8):
                torch.set_num_threads(threads)
                outs.append(attend(seqs, q, kn, vn, k, v, bs, heads // kvh, native=True))
        finally:
            torch.set_num_threads(before)
        for o in outs[1:]:
            assert torch.equal(o, outs[0])
        ref = attend(seqs, q, kn, vn, k, v, bs, heads // kvh, native=False)
        assert torch.allclose(outs[0].float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_invalid_inputs_are_refused():
    q = torch.randn(2, 4, 24)  # head_dim 24: not a multiple of the kernel's 16 lanes
    k = torch.randn(2, 2, 24, 8, 1)
    v = torch.randn(2, 2, 8, 24)
    info = torch.tensor([[0, 2, 3]])
    tables = torch.tensor([[0]])
    with pytest.raises(RuntimeError, match="head_dim"):
        EXT.paged_short_attention(q, k, v, info, tables, 0.2, torch.empty_like(q))
    q16, k16, v16 = q[..., :16].contiguous(), k[:, :, :16].contiguous(), v[..., :16].contiguous()
    with pytest.raises(RuntimeError, match="dtypes"):
        EXT.paged_short_attention(q16, k16.double(), v16, info, tables, 0.25,
                                  torch.empty(2, 4, 16))
    with pytest.raises(RuntimeError, match="5-D"):  # a pool in slot order, as before
        EXT.paged_short_attention(q16, torch.randn(16, 2, 16), v16, info, tables, 0.25,
                                  torch.empty(2, 4, 16))
    with pytest.raises(RuntimeError, match="pair width"):  # bf16 keys need pairs
        EXT.paged_short_attention(q16.bfloat16(), k16.bfloat16(), v16.bfloat16(), info, tables,
                                  0.25, torch.empty(2, 4, 16, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="shapes"):
        EXT.paged_short_attention(q16, k16, v16[:, :, :4].contiguous(), info, tables, 0.25,
                                  torch.empty(2, 4, 16))


def test_worker_config_selects_the_backend(tiny_model_dir):
    def runner(attention):
        return ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32",
                                        num_kv_blocks=64, block_size=8, attention=attention, tap_layer_ids=(0, 1),
                                        speculative_config=json.dumps(
                                            {"method": "dspark", "num_speculative_tokens": 0})))
    assert runner("torch").native_attention is None
    assert runner("native").native_attention is EXT
    assert runner("auto").native_attention is EXT
    with pytest.raises(ValueError, match="attention"):
        WorkerConfig(attention="fast")
    # a head_dim the kernel does not take: auto falls back, native refuses to start
    assert native_attention.resolve("auto", CPU, 24) is None
    with pytest.raises(ValueError, match="head_dim=24"):
        native_attention.resolve("native", CPU, 24)
    assert native_attention.resolve("auto", torch.device("meta"), 64) is None


def test_greedy_output_is_the_same_on_both_paths(tiny_model_dir):
    """fp32 end to end through the runner and the scheduler: a mixed batch of
    prefills and decodes gives the same greedy tokens with either backend."""
    outs = []
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 97) for _ in range(rng.randrange(3, 40))] for _ in range(5)]
    items = [(f"r{i}", p, SamplingParams(max_tokens=20, ignore_eos=True))
             for i, p in enumerate(prompts)]
    for attention in ("torch", "native"):
        r = ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32",
                                     num_kv_blocks=96, block_size=8, attention=attention, tap_layer_ids=(0, 1),
                                     speculative_config=json.dumps(
                                         {"method": "dspark", "num_speculative_tokens": 0})))
        eng = OfflineEngine(r, max_num_seqs=4, max_num_batched_tokens=32)
        outs.append({rid: ids for rid, ids, _ in eng.generate(items)})
    assert outs[0] == outs[1]


def test_auto_never_compiles_at_start_up(tmp_path, monkeypatch):
    """With no build in the cache, --attention auto takes the PyTorch path (and
    says how to build) instead of compiling inside a worker's start-up."""
    monkeypatch.setattr(native_attention, "_state", {})
    monkeypatch.setattr(native_attention, "build_dir", lambda: tmp_path / "none")
    compiled = []
    import torch.utils.cpp_extension as cpp

    monkeypatch.setattr(cpp, "load", lambda *a, **k: compiled.append(a))
    assert native_attention.resolve("auto", CPU, 64) is None
    assert "make setup" in native_attention.unavailable_reason()
    assert compiled == []


def drafter_inputs(g, b, k, c, heads, kvh, hd, dtype):
    q = torch.randn(b, k, heads, hd, generator=g).to(dtype)
    kc, vc = (torch.randn(b, c, kvh, hd, generator=g).to(dtype) for _ in range(2))
    kb, vb = (torch.randn(b, k, kvh, hd, generator=g).to(dtype) for _ in range(2))
    return q, kc, vc, kb, vb


def drafter_reference(q, kc, vc, kb, vb, valid):
    """What DraftLayer.attend computes without the kernel (SDPA, boolean mask), in fp64."""
    b, k = q.shape[:2]
    kk = torch.cat([kc, kb], 1).transpose(1, 2).double()
    vv = torch.cat([vc, vb], 1).transpose(1, 2).double()
    mask = torch.cat([valid, valid.new_ones(b, k)], 1)[:, None, None, :]
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).double(), kk, vv, attn_mask=mask,
        enable_gqa=q.shape[2] != kc.shape[2]).transpose(1, 2)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads,hd", [(9, 3, 64), (4, 2, 16), (4, 4, 32)])
def test_drafter_attention_matches_sdpa(dtype, tol, heads, kv_heads, hd):
    """The drafter's block rows over their visible context rows and their whole
    block: requests with a full window, a few scattered rows, and no context row
    at all (the block alone), against SDPA with the boolean mask."""
    g = torch.Generator().manual_seed(3)
    b, k, c = 4, 7, 40
    q, kc, vc, kb, vb = drafter_inputs(g, b, k, c, heads, kv_heads, hd, dtype)
    valid = torch.zeros(b, c, dtype=torch.bool)
    valid[0] = True
    valid[1, [2, 5, 17, 39]] = True
    valid[3, 10:33] = True  # request 2 sees no context row
    got = EXT.drafter_attention(q, kc, vc, kb, vb, valid, hd ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    ref = drafter_reference(q, kc, vc, kb, vb, valid)
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)
    # invisible rows do not matter, whatever they hold
    kc2, vc2 = kc.clone(), vc.clone()
    kc2[~valid], vc2[~valid] = 1e4, -1e4
    assert torch.equal(EXT.drafter_attention(q, kc2, vc2, kb, vb, valid, hd ** -0.5), got)


def test_drafter_attention_a_request_does_not_depend_on_its_batch():
    """A request drafted alone or among others, at 1 or 2 threads: bit for bit."""
    g = torch.Generator().manual_seed(5)
    b, k, c, heads, kvh, hd = 5, 7, 24, 9, 3, 64
    q, kc, vc, kb, vb = drafter_inputs(g, b, k, c, heads, kvh, hd, torch.bfloat16)
    valid = torch.rand(b, c, generator=g) > 0.3
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(EXT.drafter_attention(q, kc, vc, kb, vb, valid, 0.125))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])
    for i in range(b):
        one = slice(i, i + 1)
        alone = EXT.drafter_attention(q[one], kc[one], vc[one], kb[one], vb[one], valid[one],
                                      0.125)
        assert torch.equal(alone, outs[0][one])


def test_drafter_attention_refuses_bad_inputs():
    g = torch.Generator().manual_seed(0)
    q, kc, vc, kb, vb = drafter_inputs(g, 2, 3, 5, 4, 2, 16, torch.float32)
    valid = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="valid must be bool"):
        EXT.drafter_attention(q, kc, vc, kb, vb, valid.float(), 0.25)
    with pytest.raises(RuntimeError, match="context shapes"):
        EXT.drafter_attention(q, kc, vc, kb, vb, valid[:, :4].contiguous(), 0.25)
    with pytest.raises(RuntimeError, match="block K/V shapes"):
        EXT.drafter_attention(q, kc, vc, kb[:, :2].contiguous(), vb, valid, 0.25)
    with pytest.raises(RuntimeError, match="dtypes differ"):
        EXT.drafter_attention(q, kc.double(), vc, kb, vb, valid, 0.25)
    with pytest.raises(RuntimeError, match="contiguous"):
        EXT.drafter_attention(q.transpose(0, 1), kc, vc, kb, vb, valid, 0.25)
