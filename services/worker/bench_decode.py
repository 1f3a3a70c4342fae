"""Batch-1 greedy decode speed: our runner vs transformers generate() (same dtype).

    python -m dspark.worker.bench_decode [--dtype bfloat16] [--new 128] [--threads 2]

Not a test: prints tokens/s of both and their ratio.
"""
from __future__ import annotations

import argparse
import time

import torch

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SeqStep, StepPlan


def bench_ours(model_dir, dtype: str, ids: list[int], n_new: int, taps) -> tuple[float, list[int]]:
    from dspark.worker.runner import ModelRunner

    r = ModelRunner(WorkerConfig(model=str(model_dir), dtype=dtype, num_kv_blocks=64,
                                 tap_layer_ids=taps))
    r.warmup()
    blocks = list(range(-(-(len(ids) + n_new) // r.block_size)))
    t0 = time.perf_counter()
    o = r.step(StepPlan(0, [SeqStep("b", ids, 0, blocks, sample=True)])).outputs[0]
    t1 = time.perf_counter()
    out, pos = [o.token_id], len(ids)
    while len(out) < n_new:
        o = r.step(StepPlan(1, [SeqStep("b", [out[-1]], pos, blocks, sample=True)])).outputs[0]
        out.append(o.token_id)
        pos += 1
    t2 = time.perf_counter()
    print(f"ours   prefill {1e3 * (t1 - t0):.1f} ms, decode {(n_new - 1) / (t2 - t1):.1f} tok/s")
    return (n_new - 1) / (t2 - t1), out


def bench_hf(model_dir, dtype: str, ids: list[int], n_new: int) -> tuple[float, list[int]]:
    import transformers

    m = transformers.LlamaForCausalLM.from_pretrained(
        str(model_dir), torch_dtype=getattr(torch, dtype)).eval()
    x = torch.tensor([ids])
    kw = dict(do_sample=False, pad_token_id=2)
    with torch.inference_mode():
        m.generate(x, max_new_tokens=4, **kw)  # warm up
        t0 = time.perf_counter()
        m.generate(x, max_new_tokens=1, **kw)
        t1 = time.perf_counter()
        out = m.generate(x, max_new_tokens=n_new, min_new_tokens=n_new, **kw)
        t2 = time.perf_counter()
    # decode rate: subtract the prefill (+ first token) time
    n = out.shape[1] - len(ids)
    rate = (n - 1) / (t2 - t1 - (t1 - t0))
    print(f"hf     prefill {1e3 * (t1 - t0):.1f} ms, decode {rate:.1f} tok/s")
    return rate, out[0, len(ids):].tolist()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-taps", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from tokenizers import Tokenizer

    from dspark.worker.convert import prepare_default_model

    d = prepare_default_model()
    ids = Tokenizer.from_file(str(d / "tokenizer.json")).encode(
        "<|im_start|>user\nWrite a long story about a dragon.<|im_end|>\n"
        "<|im_start|>assistant\n").ids
    taps = () if args.no_taps else (8, 16, 24)
    ours, a = bench_ours(d, args.dtype, ids, args.new, taps)
    if not args.no_hf:
        hf, b = bench_hf(d, args.dtype, ids, args.new)
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        print(f"{args.dtype}: ours {ours:.1f} tok/s, transformers {hf:.1f} tok/s, "
              f"ratio {ours / hf:.2f}x (identical first {same} tokens)")


if __name__ == "__main__":
    main()
