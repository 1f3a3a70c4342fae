"""What being ready to speculate costs a plain decode step, in process.

    python -m dspark.worker.bench_plain [--batch 8] [--steps 64] [--rounds 3] [--threads 2]

Under confidence-scheduled verification most steps at 8+ concurrent requests
verify no draft, yet each speculating request's plain step still writes its
tap rows into its drafter lease (the drafter's context projection). This runs
the same greedy decode steps (``--batch`` requests, one token each) on a K = 0
runner and on a speculating runner whose requests hold leases but never draft,
alternating the two ``--rounds`` times, and prints ms per step of each and the
ratio. Not a test; the machine's noise applies (compare within one run).
"""
from __future__ import annotations

import argparse
import time

import torch

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SeqStep, StepPlan

PROMPT = ("<|im_start|>user\nExplain how a hash table handles collisions, "
          "with an example.<|im_end|>\n<|im_start|>assistant\n")


def make_runner(model_dir, dtype: str, spec: str, drafter: str, batch: int):
    from dspark.worker.runner import ModelRunner

    cfg = WorkerConfig(model=str(model_dir), dtype=dtype, num_kv_blocks=64 * batch,
                       speculative_config=spec, num_leases=max(batch, 1))
    if drafter:
        cfg.drafter = drafter
    r = ModelRunner(cfg)
    r.warmup()
    return r


def run(r, ids: list[int], batch: int, steps: int, leases: bool) -> tuple[float, list[int]]:
    """Prefill ``batch`` copies of ids, then time ``steps`` plain decode steps."""
    per = -(-(len(ids) + steps + 2) // r.block_size)
    blocks = [list(range(i * per, (i + 1) * per)) for i in range(batch)]
    lease = (lambda i: i) if leases else (lambda i: -1)
    rid = [f"b{i}" for i in range(batch)]
    out = r.step(StepPlan(0, [SeqStep(rid[i], ids, 0, blocks[i], sample=True, lease_id=lease(i))
                              for i in range(batch)])).outputs
    last, pos, toks = [o.token_id for o in out], len(ids), []
    t0 = time.perf_counter()
    for s in range(steps):
        out = r.step(StepPlan(s + 1, [SeqStep(rid[i], [last[i]], pos, blocks[i], sample=True,
                                              lease_id=lease(i)) for i in range(batch)])).outputs
        last = [o.token_id for o in out]
        toks.append(last[0])
        pos += 1
    dt = time.perf_counter() - t0
    r.release(rid)
    return 1e3 * dt / steps, toks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--drafter", default="", help="drafter dir (default: the shipped one)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from tokenizers import Tokenizer

    from dspark.worker.convert import prepare_default_model

    d = prepare_default_model()
    ids = Tokenizer.from_file(str(d / "tokenizer.json")).encode(PROMPT).ids
    spec = '{"method": "dspark", "num_speculative_tokens": 7}'
    plain = make_runner(d, args.dtype, spec.replace("7", "0"), "", args.batch)
    ready = make_runner(d, args.dtype, spec, args.drafter, args.batch)
    a, b = [], []
    for _ in range(args.rounds):
        ms0, t0 = run(plain, ids, args.batch, args.steps, False)
        ms1, t1 = run(ready, ids, args.batch, args.steps, True)
        a.append(ms0)
        b.append(ms1)
        print(f"K = 0: {ms0:.2f} ms/step   leases, no drafts: {ms1:.2f} ms/step   "
              f"ratio {ms1 / ms0:.3f}   same tokens: {t0 == t1}")
    a.sort(), b.sort()
    print(f"median over {args.rounds} rounds, batch {args.batch}: K = 0 {a[len(a) // 2]:.2f} ms, "
          f"ready to speculate {b[len(b) // 2]:.2f} ms, ratio {b[len(b) // 2] / a[len(a) // 2]:.3f}")


if __name__ == "__main__":
    main()
