"""A native kernel against the path it replaces, side by side in one process:
short-window attention (native vs PyTorch) or, with ``--kernel linear``, the
fp32 linear layers (native vs oneDNN's packed weights).

    python -m dspark.worker.bench_attention [--kernel attention|linear]
                                            [--conc 1 8 32] [--k 0 7] [--rounds 2]

The runner and the scheduler core in process (no gRPC: the step rate itself),
on eval prompts, greedy, default dtype. For every concurrency and K, the two
backends run in alternating rounds (native, torch, native, torch) and their
pooled tokens/s are compared. Not a test: prints the rates and their ratios.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", choices=("attention", "linear"), default="attention")
    ap.add_argument("--conc", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--k", type=int, nargs="+", default=[0, 7])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from tokenizers import Tokenizer

    from dspark.shared.bench import load_eval_prompts
    from dspark.worker.convert import prepare_default_model
    from dspark.worker.runner import ModelRunner
    from dspark.worker.training.engine import OfflineEngine

    d = prepare_default_model()
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    prompts = [tok.encode(f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n").ids
               for p in load_eval_prompts(max(args.conc))]
    runners = {}
    for att in ("native", "torch"):
        for k in args.k:
            runners[att, k] = ModelRunner(WorkerConfig(
                model=str(d), dtype=args.dtype, num_kv_blocks=2048,
                **{args.kernel: att},
                speculative_config=json.dumps({"method": "dspark",
                                               "num_speculative_tokens": k})))
            kernel = getattr(runners[att, k], f"native_{args.kernel}")
            if att == "native" and kernel is None:
                raise SystemExit(f"native {args.kernel} is unavailable here (see make setup)")
    print(f"{'tokens/s':14}{'native':>9}{'torch':>9}{'ratio':>8}")
    for conc in args.conc:
        for k in args.k:
            toks = {"native": 0, "torch": 0}
            wall = {"native": 0.0, "torch": 0.0}
            for rnd in range(args.rounds):
                for att in ("native", "torch"):
                    items = [(f"{rnd}-{i}", prompts[i % len(prompts)],
                              SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))
                             for i in range(conc)]
                    eng = OfflineEngine(runners[att, k], max_num_seqs=conc)
                    t0 = time.perf_counter()
                    toks[att] += sum(len(out) for _, out, _ in eng.generate(items))
                    wall[att] += time.perf_counter() - t0
            rate = {a: toks[a] / wall[a] for a in toks}
            print(f"conc {conc:>2} K={k}:  {rate['native']:8.1f} {rate['torch']:8.1f} "
                  f"{rate['native'] / rate['torch']:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
