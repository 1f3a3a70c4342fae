"""`dspark calibrate-drafter`: Sequential Temperature Scaling of the confidence head
(DSPARK.md 4.1).

The scheduler sizes each step's verification from estimated survivals
a_k = c_1 * ... * c_k (``dspark.scheduler.core.verify_budget``), so the
confidences must mean what they say. The confidence head is trained against a
soft target (1 - half the L1 distance of the two distributions), which is not
the probability that a draft survives the acceptance rule actually served.
Calibration fixes the scale per position:

1. Rollouts: the real decoding loop (scheduler core + ModelRunner, fixed K,
   in process) on prompts the drafter was not trained on (by default the
   held-out split of the self-generated data), recording for every verify step
   the drafter's z_1..z_K (the logits of its confidences, before any
   temperature) and how many drafts were accepted.
2. For k = 1..K in order, a grid search for the T_k minimising the expected
   calibration error (20 equal-width bins) of
   a_k = prod_{i<=k} sigmoid(z_i / T_i) against "drafts 1..k all accepted",
   with T_1..T_{k-1} fixed.
3. The temperatures go into the checkpoint's ``drafter_config.json``
   (``confidence_temperatures``), where drafting applies them.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

GRID = tuple(round(math.exp(x / 20), 4) for x in range(-60, 61))  # ~0.05 .. ~20


def ece(pred: torch.Tensor, label: torch.Tensor, bins: int = 20) -> float:
    """Expected calibration error with equal-width bins over [0, 1]."""
    pred, label = pred.double(), label.double()
    idx = (pred * bins).long().clamp_(0, bins - 1)
    n = pred.numel()
    total = 0.0
    for b in range(bins):
        m = idx == b
        c = int(m.sum())
        if c:
            total += c / n * abs(float(pred[m].mean()) - float(label[m].mean()))
    return total


def survival(z: torch.Tensor, temps) -> torch.Tensor:
    """a [N, k] = cumulative products of sigmoid(z_i / T_i) for the given T_1..T_k."""
    t = torch.tensor(temps, dtype=z.dtype)
    return torch.cumprod(torch.sigmoid(z[:, :len(temps)] / t), 1)


def fit_temperatures(z: torch.Tensor, accepted: torch.Tensor, grid=GRID, bins: int = 20,
                     min_positives: int = 20) -> tuple[list[float], list[float], list[float]]:
    """z [N, K] confidence logits, accepted [N] drafts accepted per step (0..K).

    Returns (T_1..T_K, ECE per position before, ECE per position after). A
    position with fewer than ``min_positives`` steps that reached it keeps the
    previous position's temperature: with (almost) no survivors the ECE is
    minimised by squashing every prediction to 0, which says nothing about how
    the head behaves once drafts do survive that far."""
    z = z.double()
    k_max = z.shape[1]
    temps: list[float] = []
    before, after = [], []
    ones = [1.0] * k_max
    for k in range(1, k_max + 1):
        label = (accepted >= k).double()
        before.append(ece(survival(z, ones[:k])[:, -1], label, bins))
        if int(label.sum()) < min_positives:
            temps.append(temps[-1] if temps else 1.0)
            after.append(ece(survival(z, temps)[:, -1], label, bins))
            continue
        best_t, best_e = 1.0, float("inf")
        for t in grid:
            e = ece(survival(z, temps + [t])[:, -1], label, bins)
            if e < best_e - 1e-12:
                best_t, best_e = t, e
        temps.append(best_t)
        after.append(best_e)
    return temps, before, after


def collect_rollouts(runner, prompts: list[tuple[str, list[int]]], max_tokens: int,
                     temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Run each prompt through the real loop (fixed K) and return, per verify step
    where all K drafts were judged, the confidence logits z [N, K] and the number
    of drafts accepted [N]."""
    from dspark.shared.acceptance import accept
    from dspark.shared.types import SamplingParams
    from dspark.worker.training.engine import OfflineEngine

    k = runner.info().num_speculative_tokens
    zs: list[list[float]] = []
    acc: list[int] = []
    step = runner.step

    def recording_step(plan):
        out = step(plan)
        for s, o in zip(plan.seqs, out.outputs):
            if len(o.draft_tokens) != k or len(o.confidences) != k:
                continue
            last = runner._last.get(o.request_id)
            if last is None or last[0] != "verify":
                continue
            _, res, _a, greedy, _seed = last
            n = len(accept(res, greedy=greedy).tokens) - 1  # drafts accepted
            c = torch.tensor(o.confidences, dtype=torch.float64).clamp(1e-7, 1 - 1e-7)
            zs.append(torch.log(c / (1 - c)).tolist())  # logit of the uncalibrated c
            acc.append(n)
        return out

    runner.step = recording_step
    try:
        eng = OfflineEngine(runner, max_num_seqs=1)
        items = [(pid, ids, SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                           seed=i))
                 for i, (pid, ids) in enumerate(prompts)]
        for _ in eng.generate(items):
            pass
    finally:
        runner.step = step
    return torch.tensor(zs, dtype=torch.float64).view(-1, k), torch.tensor(acc)


def write_temperatures(drafter_dir: Path, temps: list[float]) -> None:
    """Set ``confidence_temperatures`` in a checkpoint's config (validated first)."""
    from dspark.worker.model.drafter import DrafterConfig
    from dspark.worker.model.drafter_ckpt import CONFIG_FILE

    path = Path(drafter_dir) / CONFIG_FILE
    d = json.loads(path.read_text())
    d["confidence_temperatures"] = [float(t) for t in temps]
    DrafterConfig.from_json(json.dumps(d))  # refuses a bad value before writing
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(d, indent=2, sort_keys=True))
    tmp.replace(path)


def main(args) -> int:
    from dataclasses import replace

    from dspark.shared.config import DEFAULT_MODEL_NAME, WorkerConfig, shipped_drafter_dir
    from dspark.worker.runner import ModelRunner
    from dspark.worker.training.selfgen import read_records
    from dspark.worker.training.setup import prepare_offline

    prepare_offline(args)
    drafter_dir = Path(args.drafter or shipped_drafter_dir(DEFAULT_MODEL_NAME))
    spec = json.dumps({"method": "dspark", "num_speculative_tokens": args.k})
    cfg = WorkerConfig(model=args.model, dtype=args.dtype, speculative_config=spec,
                       drafter=str(drafter_dir), num_leases=1, num_kv_blocks=args.kv_blocks)
    runner = ModelRunner(cfg)
    # rollouts measure the raw head: any temperatures already stored are undone
    runner.drafter.config = replace(runner.drafter.config, confidence_temperatures=())
    recs = [r for r in read_records(Path(args.data), "heldout")]
    if args.limit:
        recs = recs[:args.limit]
    if not recs:
        print(f"calibrate-drafter: no held-out records in {args.data}", file=sys.stderr)
        return 1
    z, accepted = collect_rollouts(runner, [(r["id"], r["prompt_ids"]) for r in recs],
                                   args.max_tokens, args.temperature)
    if z.shape[0] < 50:
        print(f"calibrate-drafter: only {z.shape[0]} verify steps (need >= 50)",
              file=sys.stderr)
        return 1
    temps, before, after = fit_temperatures(z, accepted)
    res = {"drafter": str(drafter_dir), "prompts": len(recs), "steps": int(z.shape[0]),
           "temperature": args.temperature,
           "mean_accepted_length": round(float(accepted.double().mean()) + 1, 4),
           "observed_survival": [round(float((accepted >= k).double().mean()), 4)
                                 for k in range(1, z.shape[1] + 1)],
           "mean_confidence_before": [round(float(x), 4) for x in
                                      survival(z, [1.0] * z.shape[1]).mean(0)],
           "mean_confidence_after": [round(float(x), 4) for x in survival(z, temps).mean(0)],
           "temperatures": temps, "ece_before": [round(e, 4) for e in before],
           "ece_after": [round(e, 4) for e in after], "written": bool(args.write)}
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if args.write:
        write_temperatures(drafter_dir, temps)
        print(f"calibrate-drafter: wrote confidence_temperatures to {drafter_dir}",
              file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("calibrate-drafter",
                       help="fit the confidence head's per-position temperatures (DSPARK 4.1)")
    c.add_argument("--drafter", default="", help="checkpoint (default: the shipped one)")
    c.add_argument("--data", default="data/selfgen/SmolLM2-135M-Instruct",
                   help="self-generated shards: their held-out prompts are the rollouts")
    c.add_argument("--limit", type=int, default=0, help="at most this many prompts")
    c.add_argument("--max-tokens", type=int, default=128)
    c.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of the rollouts (the served one)")
    c.add_argument("--k", type=int, default=7)
    c.add_argument("--dtype", default="auto")
    c.add_argument("--kv-blocks", type=int, default=256)
    c.add_argument("--model", default="", help="target (default: the default model)")
    c.add_argument("--threads", type=int, default=0)
    c.add_argument("--json", default=None)
    c.add_argument("--write", action="store_true",
                   help="store the temperatures in the checkpoint's drafter_config.json")
    c.set_defaults(fn=main)
