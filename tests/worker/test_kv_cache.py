"""The KV pool's layout (keys per block and KV head, transposed in dimension
groups; values per block and KV head) and the PyTorch attention paths over it,
against attention computed directly from the rows."""
from __future__ import annotations

import random

import pytest
import torch

from dspark.worker.model import kv_cache
from dspark.worker.model.kv_cache import (AttnMetadata, PagedKVCache, build_metadata, key_pair,
                                          pack_keys, pack_values, paged_attention, unpack_keys,
                                          unpack_values, write_kv)

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_written_row_lands_where_the_layout_says(dtype):
    bs, kvh, hd = 8, 3, 32
    kv = PagedKVCache(2, 6, bs, kvh, hd, dtype, CPU)
    p = key_pair(dtype)
    assert p == (2 if dtype == torch.bfloat16 else 1)
    assert kv.k.shape == (2, 6, kvh, hd // p, bs, p) and kv.v.shape == (2, 6, kvh, bs, hd)
    k_new, v_new = torch.randn(3, kvh, hd).to(dtype), torch.randn(3, kvh, hd).to(dtype)
    slots = torch.tensor([5, 17, 40])  # blocks 0, 2, 5 at offsets 5, 1, 0
    meta = AttnMetadata(slots=slots, positions=torch.zeros(3, dtype=torch.long), block_size=bs)
    write_kv(kv.k[1], kv.v[1], k_new, v_new, meta)
    for row, slot in enumerate(slots.tolist()):
        blk, off = divmod(slot, bs)
        for j in range(kvh):
            for d in (0, 1, 7, hd - 1):
                assert kv.k[1, blk, j, d // p, off, d % p] == k_new[row, j, d]
            assert torch.equal(kv.v[1, blk, j, off], v_new[row, j])
    assert torch.equal(unpack_keys(kv.k[1])[slots], k_new)
    assert torch.equal(unpack_values(kv.v[1])[slots], v_new)
    assert not kv.k[0].any() and not kv.v[0].any()
    written = torch.zeros(6 * bs, dtype=torch.bool)
    written[slots] = True
    assert not unpack_keys(kv.k[1])[~written].any() and not unpack_values(kv.v[1])[~written].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pack_and_unpack_are_inverse(dtype):
    rows = torch.randn(4 * 16, 2, 64).to(dtype)
    assert torch.equal(unpack_keys(pack_keys(rows, 16)), rows)
    assert torch.equal(unpack_values(pack_values(rows, 16)), rows)
    with pytest.raises(ValueError, match="head_dim=63"):
        kv_cache.pool_shapes(4, 16, 2, 63, torch.bfloat16)


def direct_attention(q, k_rows, v_rows, seqs, bs, g):
    """Each query row against its sequence's keys [0, position], from the rows."""
    out, row = [], 0
    for start, n, blocks in seqs:
        for i in range(n):
            pos = start + i
            slots = [blocks[t // bs] * bs + t % bs for t in range(pos + 1)]
            k, v = k_rows[slots].double(), v_rows[slots].double()  # [L, KV, hd]
            heads = []
            for h in range(q.shape[1]):
                w = torch.softmax(k[:, h // g] @ q[row, h].double() / q.shape[2] ** 0.5, 0)
                heads.append(w @ v[:, h // g])
            out.append(torch.cat(heads))
            row += 1
    return torch.stack(out)


@pytest.mark.parametrize("bs", [8, 16])
@pytest.mark.parametrize("case", ["short_batch", "short_single", "decode1", "per_sequence",
                                  "long_chunks"])
def test_the_pytorch_paths_attend_over_the_pool(bs, case, monkeypatch):
    """Short windows batched (gathered blocks), one short window alone, a batch-1
    decode row, short windows one sequence at a time (long contexts), and prefill
    chunks with and without a cached prefix: each as attention from the rows."""
    rng = random.Random(bs)
    gen = torch.Generator().manual_seed(bs)
    heads, kvh, hd, nblocks = 6, 2, 16, 64
    free = list(range(nblocks))
    rng.shuffle(free)
    shapes = {"short_batch": [(13, 3), (30, 1), (2, 8)], "short_single": [(21, 5)],
              "decode1": [(40, 1)], "per_sequence": [(20, 2), (35, 1)],
              "long_chunks": [(0, 11), (19, 12), (5, 2)]}[case]
    if case == "per_sequence":
        monkeypatch.setattr(kv_cache, "BATCH_GATHER_MAX_KEYS", 16)
    seqs, used = [], set()
    for i, (start, n) in enumerate(shapes):
        nb = -(-(start + n) // bs)
        if i == len(shapes) - 1:  # consecutive block ids: read as one run, not gathered
            blocks = list(range(nblocks - nb, nblocks))
        else:
            blocks = [b for b in free if b not in used and b < nblocks - 8][:nb]
        used.update(blocks)
        seqs.append((start, n, blocks))
    t = sum(n for _, n, _ in seqs)
    k_rows = torch.randn(nblocks * bs, kvh, hd, generator=gen)
    v_rows = torch.randn(nblocks * bs, kvh, hd, generator=gen)
    q = torch.randn(t, heads, hd, generator=gen)
    k_new, v_new = torch.randn(t, kvh, hd, generator=gen), torch.randn(t, kvh, hd, generator=gen)
    meta = build_metadata(seqs, bs, heads // kvh, CPU)
    if case == "decode1":
        assert meta.decode1
    if case == "per_sequence":
        assert len(meta.long) == 2 and meta.short is None
    if case == "long_chunks":
        assert len(meta.long) == 2 and meta.short is not None
    kv = PagedKVCache(1, nblocks, bs, kvh, hd, torch.float32, CPU)
    kv.k[0].copy_(pack_keys(k_rows, bs))
    kv.v[0].copy_(pack_values(v_rows, bs))
    if meta.gather_blocks:
        meta.ws_k, meta.ws_v = kv.workspace(meta.gather_blocks)
    got = paged_attention(q, k_new, v_new, kv.k[0], kv.v[0], meta)
    k_rows[meta.slots], v_rows[meta.slots] = k_new, v_new  # this step's rows, written
    ref = direct_attention(q, k_rows, v_rows, seqs, bs, heads // kvh)
    assert got.shape == (t, heads * hd)
    assert torch.allclose(got.double(), ref, atol=1e-5), float((got.double() - ref).abs().max())
