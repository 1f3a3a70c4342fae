"""Drafter training data, part 1: the target's own answers to the training
prompts, generated with the batched engine and kept (as token ids) in the
repository so later runs on any machine reuse them.

Output: gzip JSON-lines shards, one record per prompt:
  {"id": "gsm8k-train-split:17", "split": "train" | "heldout",
   "prompt_ids": [...], "output_ids": [...], "finish": "STOP" | "LENGTH" | "DEADLINE"}
Resumable: prompts whose id is already in a shard are skipped; each run
writes a new shard, flushed record by record.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dspark.shared.types import SamplingParams

HELDOUT_FRACTION = 0.05


def split_of(prompt_id: str, heldout_fraction: float = HELDOUT_FRACTION) -> str:
    """A stable split by hash of the prompt id (never changes between runs)."""
    h = int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:8], "big")
    return "heldout" if h / 2**64 < heldout_fraction else "train"


def load_prompts(train_dir: Path) -> list[tuple[str, str]]:
    """(id, first turn) of every prompt in train_dir/*.jsonl, id = "<file stem>:<line>"."""
    out = []
    for f in sorted(Path(train_dir).glob("*.jsonl")):
        # split on "\n" only: str.splitlines() also breaks at U+2028 inside strings
        for i, line in enumerate(f.read_text(encoding="utf-8").split("\n")):
            if line.strip():
                out.append((f"{f.stem}:{i}", json.loads(line)["turns"][0]))
    return out


def drop_near_eval(prompts: list[tuple[str, str]], eval_dir: Path
                   ) -> tuple[list[tuple[str, str]], int]:
    """The prompts that may be trained on (decontam.py), and how many were not.
    Ids stay "<file stem>:<line>", so the train / held-out split is unchanged."""
    if not Path(eval_dir).is_dir():
        return prompts, 0
    from .decontam import EvalGuard

    guard = EvalGuard.from_dir(eval_dir)
    kept = [(pid, p) for pid, p in prompts if not guard.near(p)]
    return kept, len(prompts) - len(kept)


def done_ids(out_dir: Path) -> set[str]:
    ids = set()
    for shard in sorted(Path(out_dir).glob("shard-*.jsonl.gz")):
        try:
            with gzip.open(shard, "rt", encoding="utf-8") as f:
                for line in f:
                    ids.add(json.loads(line)["id"])
        except (EOFError, OSError, json.JSONDecodeError):
            pass  # a shard cut short by a kill: its complete records still count
    return ids


def read_records(out_dir: Path, split: str | None = None):
    """Every complete record of the shards in out_dir (optionally one split)."""
    for shard in sorted(Path(out_dir).glob("shard-*.jsonl.gz")):
        try:
            with gzip.open(shard, "rt", encoding="utf-8") as f:
                for line in f:
                    rec = json.loads(line)
                    if split is None or rec["split"] == split:
                        yield rec
        except (EOFError, OSError, json.JSONDecodeError):
            continue


@dataclass
class GenConfig:
    max_tokens: int = 256  # answer length cap
    max_prompt_tokens: int = 1024  # longer prompts are skipped
    batch: int = 32  # requests in flight
    temperature: float = 0.0  # 0 = the target's greedy answers
    seed: int = 0  # prompt order and sampling seeds
    time_budget_s: float = 0.0  # 0 = until every prompt is done; else a hard stop
    limit: int = 0  # at most this many new prompts (0 = all)


def generate(runner, tokenizer, prompts: list[tuple[str, str]], out_dir: Path,
             cfg: GenConfig, log=sys.stderr) -> dict:
    """Answer the prompts not yet in out_dir; return run statistics."""
    from dspark.worker.training.engine import OfflineEngine

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = done_ids(out_dir)
    todo = [p for p in prompts if p[0] not in done]
    random.Random(cfg.seed).shuffle(todo)
    if cfg.limit:
        todo = todo[:cfg.limit]
    n_shard = len(list(out_dir.glob("shard-*.jsonl.gz")))
    shard = out_dir / f"shard-{n_shard:04d}.jsonl.gz"
    engine = OfflineEngine(runner, max_num_seqs=cfg.batch)
    prompt_ids: dict[str, list[int]] = {}
    t0 = time.monotonic()
    stats = {"prompts_done": 0, "skipped_long": 0, "cut_at_deadline": 0, "output_tokens": 0,
             "shard": str(shard)}

    def items():
        for pid, text in todo:
            ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user",
                                                                   "content": text}]))
            if len(ids) > cfg.max_prompt_tokens:
                stats["skipped_long"] += 1
                continue
            prompt_ids[pid] = ids
            seed = int.from_bytes(hashlib.sha256(f"{cfg.seed}:{pid}".encode()).digest()[:7], "big")
            yield pid, ids, SamplingParams(temperature=cfg.temperature, seed=seed,
                                           max_tokens=cfg.max_tokens)

    last = t0
    with gzip.open(shard, "at", encoding="utf-8") as f:
        # the budget cuts the answers still running (kept: each is a prefix of
        # the target's answer, finish "DEADLINE") and drops the queued prompts
        deadline = t0 + cfg.time_budget_s if cfg.time_budget_s else None
        for pid, out_ids, finish in engine.generate(items(), deadline=deadline):
            rec = {"id": pid, "split": split_of(pid), "prompt_ids": prompt_ids.pop(pid),
                   "output_ids": out_ids, "finish": finish}
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            f.flush()
            stats["prompts_done"] += 1
            stats["cut_at_deadline"] += finish == "DEADLINE"
            stats["output_tokens"] += len(out_ids)
            now = time.monotonic()
            if now - last > 15:
                last = now
                rate = stats["output_tokens"] / (now - t0)
                left = len(todo) - stats["prompts_done"] - stats["skipped_long"]
                eta = left * (stats["output_tokens"] / max(1, stats["prompts_done"])) / max(rate, 1e-9)
                print(f"[selfgen] {stats['prompts_done']}/{len(todo)} prompts, "
                      f"{stats['output_tokens']} tokens, {rate:.1f} tok/s, ETA {eta / 60:.0f} min",
                      file=log, flush=True)
    stats["seconds"] = time.monotonic() - t0
    stats["tokens_per_s"] = stats["output_tokens"] / max(stats["seconds"], 1e-9)
    return stats


def worker_config(args):
    """The target alone (K = 0: nothing of a drafter is loaded). With the default
    speculative config the shipped drafter would draft and verify K tokens per
    step, which at a large batch costs more than it earns and, in bf16, makes the
    answers differ from the target's plain greedy ones."""
    from dspark.shared.config import WorkerConfig

    return WorkerConfig(model=args.model, dtype=args.dtype, device=args.device,
                        speculative_config=json.dumps({"method": "dspark",
                                                       "num_speculative_tokens": 0}))


def main(args) -> int:
    """`dspark gen-drafter-data`: answer ../shared/datasets/train prompts."""
    from dspark.router.tokenizer import Tokenizer
    from dspark.shared.cli import _datasets_dir
    from dspark.worker.runner import ModelRunner
    from dspark.worker.training.setup import prepare_offline

    prepare_offline(args)
    wcfg = worker_config(args)
    runner = ModelRunner(wcfg)
    runner.warmup()
    tok = Tokenizer.from_dir(wcfg.model_dir)
    prompts = load_prompts(Path(args.prompts))
    prompts, near = drop_near_eval(prompts, _datasets_dir() / "eval")
    if near:
        print(f"[selfgen] skipping {near} prompts equal to or near an eval prompt",
              file=sys.stderr)
    cfg = GenConfig(max_tokens=args.max_tokens, batch=args.batch, temperature=args.temperature,
                    seed=args.seed, time_budget_s=args.time_budget_min * 60, limit=args.limit)
    out = Path(args.out) / runner.info().model_name
    print(f"[selfgen] {len(prompts)} prompts, {len(done_ids(out))} already done, "
          f"writing to {out}", file=sys.stderr)
    stats = generate(runner, tok, prompts, out, cfg)
    print(json.dumps(stats, indent=1))
    return 0
