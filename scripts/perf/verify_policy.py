"""Verify policies at batch 1, offline: what confidence-scheduled verification
would give on a cost profile, from recorded drafts (no timing noise).

    .venv/bin/python scripts/perf/verify_policy.py record OUT.pt [--prompts 40] [--max-tokens 128]
    .venv/bin/python scripts/perf/verify_policy.py simulate OUT.pt \\
        --forward-ms 9.4 11.3 15.3 35.4 [--rows 1 2 4 8] [--draft-ms 3.8] [--per-position-ms 0.28]

``record`` runs the real decoding loop in process (the default model and
drafter, fp32, fixed K = 7, greedy, one request at a time, eval prompts) and
keeps, for every verify step, the drafter's calibrated confidences c_1..c_7
and how many drafts the target accepted (``training.calibrate.collect_rollouts``).
A fixed K verifies every draft, so each recorded step says what any shorter
window would have accepted: min(accepted, l).

``simulate`` replays the steps in order under each policy with the scheduler's
own functions (``verify_budget.size_verify_budget`` / ``estimate`` /
``running_cumulative``, the exploration every 32 sized steps with its
windows of 1, 2, 4, K drafts in turn (never trimmed, as served), and the worker's
``verify_fill.fill_verify_budget`` with or without the step times that trim
it) and prices each step as profile.step(rows, drafting, depth) + 0.6 ms (the
runner's results and bookkeeping): tokens/s for K = 0, fixed K = 7, the
scheduler as served (trim on and off), "always draft d, trim" and an oracle
that verifies exactly the drafts that will be accepted (the ceiling for any
rule). One recorded step stands for one step of every policy (the steps are
consumed as a stream), which ignores that a policy's steps land at other
positions: compare policies, not absolute figures. Not a test.
"""
from __future__ import annotations

import argparse

OVERHEAD_MS = 0.6
K = 7


def record(out: str, n_prompts: int, max_tokens: int) -> None:
    import json

    import torch

    from dspark.router.tokenizer import Tokenizer
    from dspark.shared.bench import load_eval_prompts
    from dspark.shared.config import WorkerConfig
    from dspark.worker.convert import prepare_default_model
    from dspark.worker.runner import ModelRunner
    from dspark.worker.training.calibrate import collect_rollouts

    torch.set_num_threads(2)
    model = prepare_default_model()
    tok = Tokenizer.from_dir(model)
    prompts = [(f"p{i}", tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])))
               for i, p in enumerate(load_eval_prompts(n_prompts))]
    spec = {"method": "dspark", "num_speculative_tokens": K, "verify": "fixed"}
    r = ModelRunner(WorkerConfig(model=str(model), dtype="float32", num_kv_blocks=256,
                                 speculative_config=json.dumps(spec), num_leases=1))
    r.warmup()
    z, acc = collect_rollouts(r, prompts, max_tokens, 0.0)  # z: logits of the calibrated c
    torch.save({"confidences": torch.sigmoid(z), "accepted": acc}, out)
    print(f"{z.shape[0]} verify steps, tau {1 + acc.float().mean():.3f} -> {out}")


def simulate(path: str, profile, explore_every: int = 32, decay: float = 0.5) -> None:
    import torch

    from dspark.scheduler.core.speculation import explore_windows
    from dspark.scheduler.core.verify_budget import (estimate, running_cumulative,
                                                     size_verify_budget)
    from dspark.shared.verify_fill import fill_verify_budget

    windows = explore_windows(K)
    d = torch.load(path)
    confs, accepted = d["confidences"].tolist(), d["accepted"].tolist()

    def cost(rows: int, drafting: int, depth: int) -> float:
        return profile.step(rows, drafting, depth) + OVERHEAD_MS

    def run(policy: str, trim: bool = False, depth: int = K) -> tuple[float, int]:
        tokens = ms = 0.0
        last, age, sized, drafted, explored = [], 0, 0, 0, 0
        acc_pos, ver_pos = [0] * K, [0] * K
        for c, a in zip(confs, accepted):
            if policy == "k0":
                tokens, ms = tokens + 1, ms + cost(1, 0, 1)
                continue
            if policy == "fixed":
                tokens, ms = tokens + 1 + a, ms + cost(1 + K, 1, K)
                drafted += 1
                continue
            explore = False
            if policy == "always":
                v = depth
            else:  # the scheduler: budget from earlier confidences, explored every 32
                est = estimate(last, running_cumulative(acc_pos, ver_pos, K), K, decay ** age)
                v = size_verify_budget(profile, 1, 1, [est], K)
                sized += 1
                explore = bool(explore_every) and sized % explore_every == 0
                if explore:  # sized the other way, never trimmed (as served)
                    if v:
                        v = 0
                    else:
                        v = windows[explored % len(windows)]
                        explored += 1
            if v == 0:
                tokens, ms, age = tokens + 1, ms + cost(1, 0, 1), age + 1
                continue
            dep = min(K, v)
            cur = c[:dep]
            drafted += 1
            if policy == "oracle":
                n = min(a, dep)
            else:
                steps = [cost(1 + u, 1, dep) for u in range(v + 1)] \
                    if trim and not explore else None
                n = fill_verify_budget([cur], v, steps, base_tokens=1)[0]
            got = min(a, n)
            tokens, ms = tokens + 1 + got, ms + cost(1 + n, 1, dep)
            last, age = cur, 0
            for p in range(got):
                acc_pos[p] += 1
            for p in range(min(got + 1, n)):
                ver_pos[p] += 1
        return 1e3 * tokens / ms, drafted

    base, _ = run("k0")
    print(f"{len(accepted)} recorded steps, fixed-K tau {1 + sum(accepted) / len(accepted):.3f}; "
          f"profile {profile}")
    rows = [("K = 0", run("k0")), ("fixed K = 7", run("fixed")),
            ("scheduler, fill", run("sched")), ("scheduler, trim", run("sched", True)),
            ("oracle", run("oracle"))]
    rows += [(f"always draft {dd}, trim", run("always", True, dd)) for dd in (1, 2, 3, 4, 7)]
    for name, (rate, drafted) in rows:
        print(f"{name:24s} {rate:7.1f} tok/s  {rate / base:.3f}x  drafted on {drafted} steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out")
    r.add_argument("--prompts", type=int, default=40)
    r.add_argument("--max-tokens", type=int, default=128)
    s = sub.add_parser("simulate")
    s.add_argument("path")
    s.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    s.add_argument("--forward-ms", type=float, nargs="+", required=True)
    s.add_argument("--draft-ms", type=float, default=3.8, help="drafting, fixed (depth 1)")
    s.add_argument("--per-position-ms", type=float, default=0.28)
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.out, args.prompts, args.max_tokens)
        return
    from dspark.shared.types import SpsProfile

    if len(args.rows) != len(args.forward_ms):
        ap.error("--rows and --forward-ms need the same number of values")
    simulate(args.path, SpsProfile(rows=tuple(args.rows), forward_ms=tuple(args.forward_ms),
                                   draft_fixed_ms=args.draft_ms,
                                   draft_per_position_ms=args.per_position_ms))


if __name__ == "__main__":
    main()
