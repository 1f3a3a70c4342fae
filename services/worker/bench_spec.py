"""Where a speculative step's time goes, in process: K = 0 against K = 7.

    python -m dspark.worker.bench_spec [--conc 1] [--prompts 4] [--max-tokens 256]
                                       [--verify fixed|confidence] [--decay 0.5 ...]
                                       [--rounds 2] [--threads 2] [--dtype bfloat16]
                                       [--drafter DIR]

The scheduler core and the runner in one process (no gRPC), on eval prompts,
greedy, ``--conc`` requests at a time. The two deployments run the same prompts
in alternating rounds, and every runner step is split into the target forward,
drafting, results (sampling the plain rows, verifying the drafts) and the rest.
Prints per deployment tokens/s, steps, ms per step by part and tokens per step,
then the ratio and the tokens per step at which K = 7 would break even with
K = 0 (its ms per step over K = 0's ms per token). With ``--verify confidence``
and several ``--decay`` values (the scheduler's verify_confidence_decay) one
K = 7 deployment runs per value, all in the same rounds. The runners share one
process, and one built later tends to run the same forward faster (memory
placement, up to ~10%; K = 0 is built first), so treat ratios within that band
as a tie. Not a test; the machine's noise applies (compare within one run).
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SamplingParams

PARTS = ("forward", "draft", "results")


def instrument(runner) -> dict[str, float]:
    """Accumulate the wall time of the runner's steps and of their parts (seconds)."""
    acc: dict[str, float] = defaultdict(float)

    def timed(obj, attr: str, key: str) -> None:
        fn = getattr(obj, attr)

        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[key] += time.perf_counter() - t0
                acc[key + "_calls"] += 1

        setattr(obj, attr, wrapper)

    timed(runner, "step", "step")
    timed(runner.model, "forward", "forward")
    timed(runner, "_draft", "draft")
    timed(runner, "_results", "results")
    return acc


def run_round(engine, items, sampling) -> tuple[int, float]:
    """(tokens, seconds) of one round: all items through the engine."""
    t0 = time.perf_counter()
    n = sum(len(out) for _, out, _ in engine.generate(
        [(rid, ids, sampling) for rid, ids in items]))
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conc", type=int, default=1, help="requests at a time")
    ap.add_argument("--prompts", type=int, default=4, help="eval prompts per round")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--verify", choices=("fixed", "confidence"), default="fixed")
    ap.add_argument("--decay", type=float, nargs="+", default=[0.5],
                    help="verify_confidence_decay of the K = 7 deployment(s) (confidence)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--drafter", default="", help="drafter dir (default: the shipped one)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from dspark.router.tokenizer import Tokenizer
    from dspark.shared.bench import load_eval_prompts
    from dspark.worker.convert import prepare_default_model
    from dspark.worker.runner import ModelRunner
    from dspark.worker.training.engine import OfflineEngine

    d = prepare_default_model()
    tok = Tokenizer.from_dir(d)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
               for p in load_eval_prompts(args.prompts)]
    k7 = {"method": "dspark", "num_speculative_tokens": 7, "verify": args.verify}
    decays = args.decay if args.verify == "confidence" else [None]
    deployments = {"k0": ({"method": "dspark", "num_speculative_tokens": 0}, None)}
    for dec in decays:
        deployments["k7" if len(decays) == 1 else f"k7 decay {dec:g}"] = (k7, dec)
    engines, accs = {}, {}
    for name, (spec, dec) in deployments.items():
        cfg = WorkerConfig(model=str(d), dtype=args.dtype,
                           num_kv_blocks=max(256, 48 * args.conc),
                           speculative_config=json.dumps(spec), num_leases=max(1, args.conc))
        if name != "k0" and args.drafter:
            cfg.drafter = args.drafter
        runner = ModelRunner(cfg)
        runner.warmup()
        engines[name] = OfflineEngine(runner, max_num_seqs=args.conc)  # profiles (confidence)
        if dec is not None:
            engines[name].config.verify_confidence_decay = dec
        accs[name] = instrument(runner)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    tokens: dict[str, int] = defaultdict(int)
    wall: dict[str, float] = defaultdict(float)
    for rd in range(args.rounds):
        for name, eng in engines.items():
            items = [(f"{name}-{rd}-{i}", p) for i, p in enumerate(prompts)]
            n, s = run_round(eng, items, sampling)
            tokens[name] += n
            wall[name] += s
            print(f"round {rd} {name}: {n / s:.1f} tok/s", flush=True)
    rate = {n: tokens[n] / wall[n] for n in engines}
    ms_per_token0 = 1e3 * accs["k0"]["step"] / tokens["k0"]
    print(f"\nbatch of {args.conc}, {args.prompts} prompts x {args.max_tokens} tokens, "
          f"{args.rounds} rounds, {args.dtype}, verify {args.verify}")
    for name, acc in accs.items():
        steps = acc["step_calls"]
        parts = {p: 1e3 * acc[p] / steps for p in PARTS}
        other = 1e3 * acc["step"] / steps - sum(parts.values())
        print(f"{name}: {rate[name]:.1f} tok/s, {steps:.0f} steps, {tokens[name] / steps:.3f} "
              f"tokens/step, {1e3 * acc['step'] / steps:.2f} ms/step = "
              + " + ".join(f"{p} {v:.2f}" for p, v in parts.items()) + f" + other {other:.2f}"
              + f" (drafted on {acc['draft_calls']:.0f} steps)")
    for name in engines:
        if name == "k0":
            continue
        step = 1e3 * accs[name]["step"] / accs[name]["step_calls"]
        print(f"{name} / k0: {rate[name] / rate['k0']:.3f}x; breaks even at "
              f"{step / ms_per_token0:.2f} tokens/step")

if __name__ == "__main__":
    main()
