"""How a plain step and the native paged attention grow with the context.

    .venv/bin/python scripts/perf/step_by_context.py [--batch 8] [--contexts 16 128 256 512]
                                                     [--rows 1] [--kernel-only] [--dtype auto]

Without ``--kernel-only``: a K = 0 runner in this process (the default model,
bf16 where the CPU has it), ``--batch`` sequences of random tokens prefilled
to each context length, then 40 decode steps of one row each; prints the
median and fastest step. With ``--kernel-only``: the native paged attention
kernel alone over 30 layers' pools on huge pages (as a worker holds them),
``--batch`` sequences of ``--rows`` query rows (8 = a verify window) at each
context (``--dtype``), cold (a pool per layer, as in a forward) and hot (one layer's pool
reused: the same rows from cache), to split memory from compute. Not a test;
the machine's noise applies (compare within one run, on an idle machine).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch


def steps(batch: int, contexts: list[int], threads: int) -> None:
    from dspark.shared.config import WorkerConfig
    from dspark.shared.types import SeqStep, StepPlan
    from dspark.worker.runner import ModelRunner

    torch.set_num_threads(threads)
    blocks_needed = sum(batch * ((c + 64) // 16 + 1) for c in contexts)
    r = ModelRunner(WorkerConfig(speculative_config='{"method": "dspark", '
                                                    '"num_speculative_tokens": 0}',
                                 num_kv_blocks=max(256, blocks_needed)))
    bs, g, step, first = r.block_size, torch.Generator().manual_seed(0), 0, 0
    for ctx in contexts:
        nb = (ctx + 64) // bs + 1
        seqs = []
        for b in range(batch):
            blocks = list(range(first, first + nb))
            first += nb
            toks = torch.randint(100, 20000, (ctx,), generator=g).tolist()
            step += 1
            r.step(StepPlan(step, [SeqStep(f"c{ctx}-{b}", toks, 0, blocks, sample=True)]))
            seqs.append((f"c{ctx}-{b}", blocks))
        times = []
        for i in range(40):
            step += 1
            plan = StepPlan(step, [SeqStep(rid, [1000 + i], ctx + i, blocks, sample=True)
                                   for rid, blocks in seqs])
            t = time.perf_counter()
            r.step(plan)
            times.append((time.perf_counter() - t) * 1e3)
        print(f"batch {batch}, context {ctx}: plain step {statistics.median(times[5:]):.2f} ms "
              f"(fastest {min(times[5:]):.2f})")


def kernel(batch: int, rows: int, contexts: list[int], threads: int, dtype: str) -> None:
    from dspark.worker.model import hugepages, native_attention
    from dspark.worker.model.kv_cache import pack_keys, pack_values
    from dspark.worker.runner import resolve_dtype

    torch.set_num_threads(threads)
    dt = resolve_dtype(dtype, torch.device("cpu"))
    ext = native_attention.load(build=False)
    if ext is None:
        raise SystemExit(f"native kernels not built: {native_attention.unavailable_reason()}")
    ar = hugepages.arena()
    place = ar.copy_in if ar is not None else (lambda t: t)
    bs, nkv, hd, heads, layers = 16, 3, 64, 9, 30  # the default model's shapes
    g = torch.Generator().manual_seed(0)
    for ctx in contexts:
        nb = (ctx + rows) // bs + 1

        def pool(pack):
            return place(pack(torch.randn(batch * nb * bs, nkv, hd, generator=g).to(dt), bs))
        kf = [pool(pack_keys) for _ in range(layers)]
        vf = [pool(pack_values) for _ in range(layers)]
        q = torch.randn(batch * rows, heads, hd, generator=g).to(dt)
        out = torch.empty_like(q)
        # each sequence's blocks scattered over the pool, as a worker's are
        perm = torch.randperm(batch * nb, generator=g)
        tables = perm.view(batch, nb)
        info = torch.tensor([[b * rows, rows, ctx] for b in range(batch)])
        res = []
        for hot in (False, True):
            def once():
                for i in range(layers):
                    j = 0 if hot else i
                    ext.paged_short_attention(q, kf[j], vf[j], info, tables,
                                              1 / math.sqrt(hd), out)
            for _ in range(3):
                once()
            ts = []
            for _ in range(21):
                t = time.perf_counter()
                once()
                ts.append((time.perf_counter() - t) * 1e3)
            res.append(f"{'hot' if hot else 'cold'} {statistics.median(ts):.2f} ms")
        print(f"{batch} seqs x {rows} rows, context {ctx}, {layers} layers, {dt}: "
              + ", ".join(res))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rows", type=int, default=1, help="query rows a sequence (kernel only)")
    p.add_argument("--contexts", type=int, nargs="+", default=[16, 128, 256, 512])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kernel-only", action="store_true")
    p.add_argument("--dtype", default="auto",
                   help="kernel only: auto (the worker's default here), bfloat16, float32")
    a = p.parse_args()
    if a.kernel_only:
        kernel(a.batch, a.rows, a.contexts, a.threads, a.dtype)
    else:
        steps(a.batch, a.contexts, a.threads)


if __name__ == "__main__":
    main()
