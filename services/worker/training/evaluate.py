"""`dspark eval-drafter`: the DSpark decoding loop of DSPARK.md section 3, offline.

Each prompt runs alone (one request, in process, no services): the real
scheduler core (acceptance, stop truncation, fallback) drives the real
ModelRunner (lease ring, drafting, verify rows in the target forward), i.e.
exactly the serving code path without gRPC. Per prompt it runs

* K = 7 with the Markov head (DSpark),
* K = 7 with the Markov head switched off (the DFlash ablation),
* at greedy, K = 0 plain decoding, and checks the speculative output is
  token-for-token identical (meaningful in float32: bf16 rounds 1-row and
  8-row forwards differently).

Reports the mean accepted length tau (tokens committed per verify step, bonus
included, over all verify steps) and the per-position conditional acceptance
rates, overall and per prompt file.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from dspark.shared.types import SamplingParams, SpecSummary


def load_eval_prompts(files: list[str], limit: int) -> list[tuple[str, str, str]]:
    """(set name, prompt id, first turn) of the first ``limit`` prompts of each file."""
    out = []
    for f in files:
        path = Path(f)
        rows = [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()]
        if limit:
            rows = rows[:limit]
        for i, ln in enumerate(rows):
            rec = json.loads(ln)
            turns = rec.get("turns") or [rec.get("prompt", "")]
            out.append((path.stem, f"{path.stem}:{i}", turns[0]))
    return out


def _merge(acc: SpecSummary, s: SpecSummary) -> None:
    acc.verify_steps += s.verify_steps
    acc.num_draft_tokens += s.num_draft_tokens
    acc.num_accepted_tokens += s.num_accepted_tokens
    acc.committed_in_verify += s.committed_in_verify
    acc.fallback_steps += s.fallback_steps
    if not acc.accepted_per_pos:
        acc.accepted_per_pos = [0] * len(s.accepted_per_pos)
    for i, n in enumerate(s.accepted_per_pos):
        acc.accepted_per_pos[i] += n


def _report(s: SpecSummary) -> dict:
    return {"mean_accepted_length": round(s.mean_accepted_length, 4),
            "per_position_acceptance": [round(x, 4) for x in s.per_position_acceptance],
            "num_steps": s.verify_steps, "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens, "fallback_steps": s.fallback_steps}


def evaluate(runner, tokenizer, prompts, max_tokens: int, temperature: float,
             ablation: bool = True, check: bool = True, log=sys.stderr) -> dict:
    from dspark.worker.training.engine import OfflineEngine

    info = runner.info()
    if not info.num_speculative_tokens:
        raise ValueError("eval-drafter: the runner has no drafter (K = 0)")
    plain_info = replace(info, num_speculative_tokens=0, num_leases=0)
    greedy = temperature == 0
    check = check and greedy
    modes = [("dspark", True)] + ([("no_markov", False)] if ablation else [])
    total = {m: SpecSummary() for m, _ in modes}
    per_set: dict[str, dict[str, SpecSummary]] = {}
    mismatches, timing = [], {m: [0, 0.0] for m, _ in modes + [("plain", None)]}
    for n, (set_name, pid, text) in enumerate(prompts):
        ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=n)
        outs = {}
        for mode, markov in modes:
            runner.use_markov = markov
            eng = OfflineEngine(runner, max_num_seqs=1)
            t = time.perf_counter()
            (_, toks, _), = list(eng.generate([(pid, ids, params)]))
            timing[mode][0] += len(toks)
            timing[mode][1] += time.perf_counter() - t
            outs[mode] = toks
            st = eng.core.spec_totals
            _merge(total[mode], st)
            _merge(per_set.setdefault(set_name, {m: SpecSummary() for m, _ in modes})[mode], st)
        runner.use_markov = True
        if check:
            eng = OfflineEngine(runner, max_num_seqs=1, info=plain_info)
            t = time.perf_counter()
            (_, plain, _), = list(eng.generate([(pid, ids, params)]))
            timing["plain"][0] += len(plain)
            timing["plain"][1] += time.perf_counter() - t
            if any(outs[m] != plain for m in outs):
                mismatches.append(pid)
        d = total["dspark"]
        print(f"[eval] {n + 1}/{len(prompts)} {pid}: tau so far {d.mean_accepted_length:.3f}"
              + (f" (no Markov {total['no_markov'].mean_accepted_length:.3f})"
                 if ablation else "") + (f", mismatches {len(mismatches)}" if check else ""),
              file=log, flush=True)
    main = total["dspark"]
    result = {"mean_accepted_length": round(main.mean_accepted_length, 4),
              "per_position_acceptance": [round(x, 4) for x in main.per_position_acceptance],
              "num_prompts": len(prompts), "num_steps": main.verify_steps,
              "temperature": temperature, "max_tokens": max_tokens,
              "num_speculative_tokens": info.num_speculative_tokens,
              "drafter": info.drafter_id, "dtype": info.dtype,
              "per_set": {k: {m: _report(v[m]) for m in v} for k, v in per_set.items()},
              "tokens_per_s": {m: round(n / s, 2) if s else None
                               for m, (n, s) in timing.items()}}
    if ablation:
        ab = total["no_markov"]
        result["ablation_no_markov"] = {
            "mean_accepted_length": round(ab.mean_accepted_length, 4),
            "per_position_acceptance": [round(x, 4) for x in ab.per_position_acceptance],
            "num_steps": ab.verify_steps}
    result["exact_match"] = (not mismatches) if check else None
    result["mismatched_prompts"] = mismatches
    return result


def main(args) -> int:
    from dspark.router.tokenizer import Tokenizer
    from dspark.shared.config import WorkerConfig
    from dspark.worker.runner import ModelRunner
    from dspark.worker.training.setup import prepare_offline

    prepare_offline(args)
    spec = json.dumps({"method": "dspark", "num_speculative_tokens": args.k})
    cfg = WorkerConfig(model=args.model, dtype=args.dtype, speculative_config=spec,
                       drafter=args.drafter, num_leases=1, num_kv_blocks=args.kv_blocks)
    runner = ModelRunner(cfg)
    tok = Tokenizer.from_dir(cfg.model_dir)
    prompts = load_eval_prompts(args.prompts, args.limit)
    if not prompts:
        print("eval-drafter: no prompts", file=sys.stderr)
        return 1
    res = evaluate(runner, tok, prompts, args.max_tokens, args.temperature,
                   ablation=args.ablation, check=args.check)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)
    return 0 if res["exact_match"] in (True, None) else 3


def add_parser(sub, datasets_dir: Path) -> None:
    e = sub.add_parser("eval-drafter",
                       help="offline DSpark decoding: tau, per-position acceptance, ablation")
    e.add_argument("--prompts", nargs="+",
                   default=[str(datasets_dir / "eval" / f"{n}.jsonl")
                            for n in ("mt-bench", "humaneval", "mbpp", "gsm8k")],
                   help="JSONL prompt files ({\"turns\": [...]} per line)")
    e.add_argument("--max-tokens", type=int, default=256)
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--limit", type=int, default=0, help="first N prompts of each file (0 = all)")
    e.add_argument("--json", default=None)
    e.add_argument("--model", default="", help="target (default: the default model)")
    e.add_argument("--drafter", default="", help="drafter checkpoint (default: the shipped one)")
    e.add_argument("--k", type=int, default=7, help="num_speculative_tokens")
    e.add_argument("--dtype", default="float32",
                   help="float32 (default: exactness is checked) or bfloat16/auto")
    e.add_argument("--kv-blocks", type=int, default=256)
    e.add_argument("--threads", type=int, default=0)
    e.add_argument("--ablation", action="store_true", default=True)
    e.add_argument("--no-ablation", dest="ablation", action="store_false")
    e.add_argument("--check", action="store_true", default=True,
                   help="greedy: check the output equals plain decoding (default on)")
    e.add_argument("--no-check", dest="check", action="store_false")
    e.set_defaults(fn=main)
