"""Where a speculative step's time goes, in process: K = 0 against K = 7.

    python -m dspark.worker.bench_spec [--conc 1] [--prompts 4] [--max-tokens 256]
                                       [--verify fixed|confidence] [--decay 0.5 ...]
                                       [--price depth|full ...] [--trim on|off ...]
                                       [--rounds 2]
                                       [--temperature 0] [--top-p 1] [--top-k 0]
                                       [--threads 2] [--dtype bfloat16] [--drafter DIR]
                                       [--gguf-weights auto|on|off]

Each deployment is the scheduler core and a runner (no gRPC) in a process of
its own, on eval prompts, greedy (or sampled: ``--temperature`` and optionally
``--top-p`` / ``--top-k``, request i seeded with i), ``--conc`` requests at
a time. The deployments run the same prompts in alternating rounds (one
process at a time, the others wait; the order reverses every round), and
every runner step is split into the target forward, drafting, results
(sampling the plain rows, verifying the drafts) and the rest; the time
between runner steps (the scheduler core planning and committing, the
engine's loop) is reported beside it. Prints per
deployment tokens/s, steps, ms per step by part and tokens per step, then the
ratio and the tokens per step at which K = 7 would break even with K = 0 (its
ms per step over K = 0's ms per token).

With ``--verify confidence``, one K = 7 deployment runs per ``--decay`` value
(the scheduler's verify_confidence_decay) and per ``--price``: ``depth`` is
the worker's measured profile as served (drafting priced at the depth a budget
asks for), ``full`` the same profile with every draft priced at depth K (as
before the profile had a per-position cost). Under ``--verify confidence``
every K = 7 deployment uses the cost profile the first one measured, so they
differ only in what they were asked to. ``--trim on off`` runs a K = 7
deployment each way (the scheduler's ``verify_trim``: the worker trims the
budget's fill to the rows the current confidences pay for, or fills it).

Separate processes, because runners built in one process do not run alike:
one built later ran the same plain forward up to ~10% faster (where its
memory sits), which an A/B between runners of one process reads as a result.
Not a test; the machine's noise applies (compare within one run).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import time
from collections import defaultdict

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


def run_round(engine, items, sampling, seeded: bool = False) -> tuple[int, float]:
    """(tokens, seconds) of one round: all items through the engine (``seeded``:
    item i sampled with seed i)."""
    t0 = time.perf_counter()
    n = sum(len(out) for _, out, _ in engine.generate(
        [(rid, ids, dataclasses.replace(sampling, seed=i) if seeded else sampling)
         for i, (rid, ids) in enumerate(items)]))
    return n, time.perf_counter() - t0


@dataclasses.dataclass(frozen=True)
class Deployment:
    name: str
    k: int
    verify: str = "fixed"
    decay: float | None = None
    price: str = "depth"  # confidence: "depth" (as served) or "full" (every draft at K)
    trim: bool = True  # confidence: the scheduler's verify_trim


def _serve(conn, dep: Deployment, args: dict, prompts: list[list[int]]) -> None:
    """A deployment's process: build, then answer ("profile" | "round" | "stats" |
    "stop") requests over ``conn``."""
    import torch

    from dspark.shared.config import WorkerConfig
    from dspark.shared.types import SamplingParams
    from dspark.worker.convert import prepare_default_model
    from dspark.worker.runner import ModelRunner
    from dspark.worker.training.engine import OfflineEngine

    if args["threads"]:
        torch.set_num_threads(args["threads"])
    conc = args["conc"]
    spec = {"method": "dspark", "num_speculative_tokens": dep.k}
    if dep.k:
        spec["verify"] = dep.verify
    cfg = WorkerConfig(model=str(prepare_default_model()), dtype=args["dtype"],
                       gguf_weights=args["gguf_weights"],
                       num_kv_blocks=max(256, 48 * conc), speculative_config=json.dumps(spec),
                       num_leases=max(1, conc))
    if dep.k and args["drafter"]:
        cfg.drafter = args["drafter"]
    runner = ModelRunner(cfg)
    runner.warmup()
    engine = OfflineEngine(runner, max_num_seqs=conc)  # profiles (confidence)
    if dep.decay is not None:
        engine.config.verify_confidence_decay = dep.decay
    engine.config.verify_trim = dep.trim
    acc = instrument(runner)
    sampling = SamplingParams(max_tokens=args["max_tokens"], temperature=args["temperature"],
                              top_p=args["top_p"], top_k=args["top_k"], ignore_eos=True)
    while True:
        cmd, arg = conn.recv()
        if cmd == "profile":  # give the measured one, or take the one given
            if arg is None:
                conn.send(engine.info.sps_profile)
                continue
            prof = arg
            if dep.price == "full":
                k = dep.k
                prof = dataclasses.replace(
                    prof, draft_per_position_ms=0.0,
                    draft_per_request_ms=prof.draft_per_request_ms
                    + (k - 1) * prof.draft_per_position_ms)
            engine.info = dataclasses.replace(engine.info, sps_profile=prof)
            conn.send(None)
        elif cmd == "round":
            items = [(f"{dep.name}-{arg}-{i}", p) for i, p in enumerate(prompts)]
            n, s = run_round(engine, items, sampling, seeded=True)
            acc["wall"] += s
            conn.send((n, s))
        elif cmd == "stats":
            conn.send(dict(acc))
        else:
            conn.send(None)
            return


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conc", type=int, default=1, help="requests at a time")
    ap.add_argument("--prompts", type=int, default=4, help="eval prompts per round")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--verify", choices=("fixed", "confidence"), default="fixed")
    ap.add_argument("--decay", type=float, nargs="+", default=[0.5],
                    help="verify_confidence_decay of the K = 7 deployment(s) (confidence)")
    ap.add_argument("--trim", choices=("on", "off"), nargs="+", default=["on"],
                    help="the scheduler's verify_trim of the K = 7 deployment(s) (confidence)")
    ap.add_argument("--price", choices=("depth", "full"), nargs="+", default=["depth"],
                    help="how the K = 7 deployment(s) price drafting (confidence)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--drafter", default="", help="drafter dir (default: the shipped one)")
    ap.add_argument("--gguf-weights", default="auto", choices=("auto", "on", "off"),
                    help="fp32: the linear layers from the model's GGUF blocks")
    args = ap.parse_args()
    from dspark.router.tokenizer import Tokenizer
    from dspark.shared.bench import load_eval_prompts
    from dspark.worker.convert import prepare_default_model

    tok = Tokenizer.from_dir(prepare_default_model())
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
               for p in load_eval_prompts(args.prompts)]
    deps = [Deployment("k0", 0)]
    if args.verify == "confidence":
        several = len(args.decay) * len(args.price) > 1
        for dec in args.decay:
            for price in args.price:
                for trim in args.trim:
                    name = f"k7 decay {dec:g} price {price}" if several else "k7"
                    if len(args.trim) > 1:
                        name += f" trim {trim}"
                    deps.append(Deployment(name, 7, "confidence", dec, price, trim == "on"))
    else:
        deps.append(Deployment("k7", 7))
    ctx = mp.get_context("spawn")
    conns = {}
    procs = []
    try:
        for dep in deps:  # one at a time: building and profiling want the cores
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(child, dep, vars(args), prompts), daemon=True)
            p.start()
            procs.append(p)
            conns[dep.name] = parent
            if dep.verify == "confidence":
                parent.send(("profile", None))
                parent.recv()  # built and profiled
            else:
                parent.send(("stats", None))
                parent.recv()  # built
        spec = [d.name for d in deps if d.verify == "confidence"]
        if spec:
            conns[spec[0]].send(("profile", None))
            shared = conns[spec[0]].recv()
            print(f"cost profile (measured by {spec[0]!r}, used by all): {shared}")
            for name in spec:
                conns[name].send(("profile", shared))
                conns[name].recv()
        tokens: dict[str, int] = defaultdict(int)
        wall: dict[str, float] = defaultdict(float)
        for rd in range(args.rounds):
            for dep in (deps if rd % 2 == 0 else deps[::-1]):
                conns[dep.name].send(("round", rd))
                n, s = conns[dep.name].recv()
                tokens[dep.name] += n
                wall[dep.name] += s
                print(f"round {rd} {dep.name}: {n / s:.1f} tok/s", flush=True)
        accs = {}
        for dep in deps:
            conns[dep.name].send(("stats", None))
            accs[dep.name] = conns[dep.name].recv()
        for c in conns.values():
            c.send(("stop", None))
            c.recv()
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    rate = {n: tokens[n] / wall[n] for n in accs}
    ms_per_token0 = 1e3 * accs["k0"]["step"] / tokens["k0"]
    print(f"\nbatch of {args.conc}, {args.prompts} prompts x {args.max_tokens} tokens, "
          f"{args.rounds} rounds, {args.dtype}, verify {args.verify}, a process each, "
          + ("greedy" if not args.temperature else
             f"temperature {args.temperature:g} top-p {args.top_p:g} top-k {args.top_k}"))
    for name, acc in accs.items():
        steps = acc["step_calls"]
        parts = {p: 1e3 * acc.get(p, 0.0) / steps for p in PARTS}
        other = 1e3 * acc["step"] / steps - sum(parts.values())
        print(f"{name}: {rate[name]:.1f} tok/s, {steps:.0f} steps, {tokens[name] / steps:.3f} "
              f"tokens/step, {1e3 * acc['step'] / steps:.2f} ms/step = "
              + " + ".join(f"{p} {v:.2f}" for p, v in parts.items()) + f" + other {other:.2f}"
              + f" (drafted on {acc.get('draft_calls', 0):.0f} steps); the scheduler and "
              f"engine between steps {1e3 * (acc['wall'] - acc['step']) / steps:.2f} ms/step")
    for name in accs:
        if name == "k0":
            continue
        step = 1e3 * accs[name]["step"] / accs[name]["step_calls"]
        print(f"{name} / k0: {rate[name] / rate['k0']:.3f}x; breaks even at "
              f"{step / ms_per_token0:.2f} tokens/step")


if __name__ == "__main__":
    main()
