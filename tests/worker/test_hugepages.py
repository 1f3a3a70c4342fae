"""The huge-page arena (``hugepages.py``): where packed weights and the KV pool
live on CPU, and that placing them there changes no result."""
from __future__ import annotations

import pytest
import torch

from dspark.worker.model import hugepages, native_attention, native_linear
from dspark.worker.model.kv_cache import (AttnMetadata, PagedKVCache, unpack_keys, unpack_values,
                                          write_kv)

WHY = hugepages.unavailable_reason()
needs_thp = pytest.mark.skipif(WHY is not None, reason=f"no huge pages here: {WHY}")
EXT = native_attention.load(build=False)
needs_bf16 = pytest.mark.skipif(
    EXT is None or not EXT.has_linear_bf16(),
    reason="needs the native kernels built and a CPU with AVX512-BF16")


def test_arena_hands_out_aligned_disjoint_tensors():
    """Every tensor starts on a cache line, none overlaps another, each holds
    what was copied in, zeros() reads zero, a chunk starts on a 2 MiB boundary,
    and a tensor larger than a chunk gets a chunk of its own."""
    ar = hugepages.HugePageArena(chunk_bytes=4 << 20)
    g = torch.Generator().manual_seed(0)
    srcs = [torch.randn(n, generator=g).to(dt) for n, dt in
            ((3, torch.float32), (1000, torch.bfloat16), (5, torch.int64), (70_000, torch.float32),
             (1, torch.bfloat16), (1 << 20, torch.float32))]
    got = [ar.copy_in(s) for s in srcs]
    z = ar.zeros((17, 9), torch.bfloat16)
    spans = []
    for s, t in zip(srcs, got):
        assert torch.equal(s, t) and t.is_contiguous() and t.dtype == s.dtype
        assert t.data_ptr() % hugepages.ALIGN == 0
        spans.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
    assert z.shape == (17, 9) and not z.any()
    spans.append((z.data_ptr(), z.data_ptr() + z.numel() * 2))
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    # 4 MiB of float32 does not fit in what the first chunk has left: a new one, aligned
    assert got[5].data_ptr() % hugepages.HUGE == 0
    big = ar.empty((3 << 20,), torch.float32)  # 12 MiB > a chunk
    assert big.data_ptr() % hugepages.HUGE == 0 and big.numel() == 3 << 20
    assert ar.mapped >= (4 << 20) * 2 + (12 << 20)


def test_arena_tensors_outlive_the_arena():
    """A tensor keeps its mapping: the arena (and its current chunk) can go."""
    ar = hugepages.HugePageArena(chunk_bytes=2 << 20)
    t = ar.copy_in(torch.arange(1000, dtype=torch.float32))
    del ar
    import gc
    gc.collect()
    assert t.sum().item() == sum(range(1000))


def test_switched_off_by_the_environment_and_off_cpu(monkeypatch):
    monkeypatch.setenv(hugepages.ENV, "0")
    assert hugepages.unavailable_reason() == f"{hugepages.ENV}=0 in the environment"
    assert hugepages.arena() is None
    kv = PagedKVCache(2, 4, 16, 3, 64, torch.bfloat16, torch.device("cpu"))
    assert not kv.k.any() and not kv.v.any()  # PyTorch's zeros, as before
    monkeypatch.delenv(hugepages.ENV)
    assert hugepages.arena("meta") is None


@needs_thp
def test_arena_memory_is_on_huge_pages():
    """Written memory of an arena is backed by huge pages (the point of it)."""
    before = hugepages.resident_huge_bytes()
    ar = hugepages.HugePageArena()
    t = ar.empty((16 << 20,), torch.uint8)
    t.fill_(1)
    assert hugepages.resident_huge_bytes() - before >= hugepages.HUGE


@needs_thp
def test_kv_pool_in_the_arena_reads_zero_and_keeps_writes():
    kv = PagedKVCache(3, 8, 16, 3, 64, torch.bfloat16, torch.device("cpu"))
    assert kv.k.shape == (3, 8, 3, 32, 16, 2) and kv.v.shape == (3, 8, 3, 16, 64)
    assert kv.k.data_ptr() % hugepages.ALIGN == 0 and kv.v.data_ptr() % hugepages.ALIGN == 0
    assert not kv.k.any() and not kv.v.any()
    rows, vals = torch.randn(5, 3, 64).bfloat16(), torch.randn(5, 3, 64).bfloat16()
    slots = torch.tensor([0, 17, 33, 64, 127])
    meta = AttnMetadata(slots=slots, positions=torch.zeros(5, dtype=torch.long), block_size=16)
    write_kv(kv.k[1], kv.v[1], rows, vals, meta)
    assert torch.equal(unpack_keys(kv.k[1])[slots], rows)
    assert torch.equal(unpack_values(kv.v[1])[slots], vals)
    assert not kv.k[0].any() and not kv.k[2].any() and not kv.v[0].any() and not kv.v[2].any()


@needs_bf16
@needs_thp
@pytest.mark.parametrize("m", [1, 3, 8, 13])
def test_weights_in_the_arena_give_the_same_bits(m):
    """A Bf16Linear packs into its arena and prefetches for huge pages; its
    outputs equal, bit for bit, those of weights where PyTorch put them
    (the kernel's arithmetic is the same either way)."""
    lin = native_linear.Bf16Linear(EXT)
    assert lin.arena is not None
    plain = native_linear.Bf16Linear(EXT)
    plain.arena = None
    for n, k in ((576, 1536), (3072, 576), (49, 38)):
        w = (torch.randn(n, k, generator=torch.Generator().manual_seed(n)) * 0.05).bfloat16()
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).bfloat16()
        a, b = lin.pack(w), plain.pack(w)
        assert torch.equal(a.wp, b.wp) and a.wp.data_ptr() != b.wp.data_ptr()
        out = lin(x, a)
        assert torch.equal(out, plain(x, b))
        for huge in (True, False):  # the flag alone changes nothing either
            assert torch.equal(EXT.linear_bf16(x.contiguous(), a.wp, a.n, huge), out)
