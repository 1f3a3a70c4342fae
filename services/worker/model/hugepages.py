"""Large CPU tensors on transparent huge pages (Linux).

A decode step streams every weight of the model once (~270 MB for the default
model in bf16), and the KV pool's rows are read from all over it. On 4 KiB
pages that is ~65k pages a step: the TLB misses on most of them, and the
hardware prefetchers stop at every page boundary. On 2 MiB pages both go away.
Measured on the project's 2-core AVX512-BF16 EPYC, the native bf16 linear over
the default model's layers and LM head, each as served (4 KiB pages with the
kernel's L1 prefetches, huge pages with its L2 ones): 1 row 9.71 -> 8.43 ms,
8 rows 10.38 -> 8.95 ms, and 1.2-1.4x where memory bandwidth is contended
(``python -m dspark.worker.model.hugepages`` prints this side by side).
PyTorch's CPU allocator never asks for huge pages, and most kernels'
transparent-huge-page setting is ``madvise``: only memory advised with
``MADV_HUGEPAGE`` gets them.

``HugePageArena`` hands out tensors carved from anonymous mappings advised so,
in chunks of at least 64 MiB, each aligned to 2 MiB. A tensor keeps its chunk
mapped (``torch.frombuffer`` holds the mapping), so a chunk is unmapped when the
last tensor in it is gone and the arena has moved on. Where huge pages are not
available (not Linux, ``transparent_hugepage`` set to ``never``, or
``DSPARK_HUGEPAGES=0`` in the environment) ``arena()`` returns None and callers
keep PyTorch's allocations: the same values either way.
"""
from __future__ import annotations

import logging
import mmap
import os
import sys
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HUGE = 2 << 20  # bytes in a huge page (x86-64, arm64 with 4 KiB base pages)
CHUNK = 64 << 20  # bytes mapped at a time (a tensor larger than this gets its own)
ALIGN = 64  # bytes: every tensor starts on a cache line
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
ENV = "DSPARK_HUGEPAGES"


def unavailable_reason() -> str | None:
    """Why this process cannot place tensors on huge pages (None: it can)."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "off", "false", "no"):
        return f"{ENV}={os.environ[ENV]} in the environment"
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return "transparent huge pages are a Linux feature"
    try:
        setting = THP_SETTING.read_text()
    except OSError:
        return f"{THP_SETTING} is not readable"
    if "[never]" in setting:
        return f"transparent huge pages are off ({THP_SETTING}: never)"
    return None


class HugePageArena:
    """A bump allocator of CPU tensors over 2 MiB-aligned anonymous mappings
    advised ``MADV_HUGEPAGE``. Not thread-safe: models are built on one thread."""

    def __init__(self, chunk_bytes: int = CHUNK):
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None  # uint8 view of the current mapping
        self._used = 0
        self.mapped = 0  # bytes mapped so far (all chunks)

    def _new_chunk(self, nbytes: int) -> None:
        size = max(self.chunk_bytes, -(-nbytes // HUGE) * HUGE)
        m = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_HUGEPAGE)
        whole = torch.frombuffer(m, dtype=torch.uint8)  # holds the mapping
        skip = -whole.data_ptr() % HUGE
        self._chunk, self._used = whole[skip:skip + size], 0
        self.mapped += size

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor (zero pages until written)."""
        shape = tuple(int(s) for s in shape)
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = elem
        for s in shape:
            nbytes *= s
        start = -(-self._used // ALIGN) * ALIGN
        if self._chunk is None or start + nbytes > self._chunk.numel():
            self._new_chunk(nbytes)
            start = 0
        self._used = start + nbytes
        return self._chunk[start:start + nbytes].view(dtype).view(shape)

    def zeros(self, shape, dtype: torch.dtype, resident: bool = False) -> torch.Tensor:
        """A zero tensor. The arena never hands out memory twice, and a fresh
        anonymous mapping reads as zeros, so nothing needs writing: pages become
        resident as they are first written. ``resident``: write it once now, so
        that all of its memory is taken here (a serving worker's KV pool)."""
        t = self.empty(shape, dtype)
        return t.zero_() if resident else t

    def copy_in(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of CPU tensor ``t`` (contiguous, same shape and dtype) in the arena."""
        return self.empty(t.shape, t.dtype).copy_(t)


def arena(device: torch.device | str = "cpu") -> HugePageArena | None:
    """An arena for a model's tensors on ``device``, or None where huge pages
    cannot be had (then the caller allocates as usual)."""
    if torch.device(device).type != "cpu":
        return None
    why = unavailable_reason()
    if why is not None:
        log.info("tensors on 4 KiB pages: %s", why)
        return None
    return HugePageArena()


def resident_huge_bytes() -> int:
    """This process's anonymous memory on huge pages (bytes), from /proc."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    """The native bf16 linear over the default model's layer shapes, with the
    packed weights where PyTorch put them and in a huge-page arena, side by
    side in one process (rounds alternate)."""
    from . import native_attention
    from .native_linear import Bf16Linear

    ext = native_attention.load(build=True)
    if ext is None or not ext.has_linear_bf16():
        print("needs the native kernels and a CPU with AVX512-BF16", file=sys.stderr)
        return 1
    if unavailable_reason() is not None:
        print(f"no huge pages here: {unavailable_reason()}", file=sys.stderr)
        return 1
    # as served: weights where PyTorch puts them (the kernel prefetching for 4 KiB
    # pages), against the arena (huge pages, prefetched for those)
    lin_4k, lin_huge = Bf16Linear(ext), Bf16Linear(ext)
    lin_4k.arena = None
    g = torch.Generator().manual_seed(0)
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
    plain = [lin_4k.pack((torch.randn(n, k, generator=g) * 0.05).bfloat16()) for n, k in shapes]
    huge = [w._replace(wp=lin_huge.arena.copy_in(w.wp)) for w in plain]
    print(f"{resident_huge_bytes() >> 20} MiB of this process on huge pages")
    print("rows  4 KiB pages  huge pages   (ms per pass over all weights, median of 7)")
    for m in (1, 2, 4, 8):
        xs = {k: torch.randn(m, k, generator=g).bfloat16() for k in (576, 1536)}
        res = {"4k": [], "huge": []}
        for _ in range(3):
            for name, lin, ws in (("4k", lin_4k, plain), ("huge", lin_huge, huge)):
                def go():
                    for w in ws:
                        lin(xs[w.shape[1]], w)
                go()
                ts = []
                for _ in range(7):
                    t0 = time.perf_counter()
                    go()
                    ts.append(time.perf_counter() - t0)
                res[name].append(sorted(ts)[3] * 1e3)
        a, b = min(res["4k"]), min(res["huge"])
        print(f"{m:>4}  {a:11.2f}  {b:10.2f}   ({a / b:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
