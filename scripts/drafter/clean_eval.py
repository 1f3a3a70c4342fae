"""Eval prompts that no drafter-training prompt ever came near.

The first synthetic rounds held near copies of a few eval prompts (one of the
first five MBPP prompts, one of the first five HumanEval ones) before
services/worker/training/decontam.py filtered the answers; drafters trained
before that filter saw the target's answers to them. This writes, per eval
set, the first N prompts that no prompt of ../shared/datasets/train or
data/prompts-* (filtered or not) is near, for `dspark eval-drafter --prompts`.

usage: .venv/bin/python scripts/drafter/clean_eval.py OUT_DIR [N]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dspark.worker.training.decontam import EvalGuard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decontaminate import DATASETS, prompt_index  # noqa: E402

SETS = ("mt-bench", "humaneval", "mbpp", "gsm8k")


def touched(guard: EvalGuard) -> set[str]:
    """The eval turns some training prompt is near."""
    out = set()
    for turns in prompt_index().values():
        for t in filter(None, turns):
            m = guard.match(t)
            if m and m[1] is not None:
                out.add(m[1])
    return out


def main(argv: list[str]) -> int:
    out, n = Path(argv[0]), int(argv[1]) if len(argv) > 1 else 5
    guard = EvalGuard.from_dir(DATASETS / "eval")
    seen = touched(guard)
    out.mkdir(parents=True, exist_ok=True)
    for name in SETS:
        lines = [ln for ln in (DATASETS / "eval" / f"{name}.jsonl").read_text(encoding="utf-8").split("\n")
                 if ln.strip()]
        hit = [json.loads(ln)["turns"][0] in seen for ln in lines]
        kept = [ln for ln, h in zip(lines, hit) if not h][:n]
        (out / f"{name}.jsonl").write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
        print(f"{name}: {sum(hit)} of {len(lines)} touched; of the first {n}, lines "
              f"{[i for i, h in enumerate(hit[:n]) if h]} replaced", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
