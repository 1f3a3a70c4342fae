"""Drop, from committed drafter-training answers, every record whose prompt is
an eval prompt or a near copy of one (services/worker/training/decontam.py).

usage: .venv/bin/python scripts/drafter/decontaminate.py [--dry-run] DATA_DIR...
Record ids are "<prompt file stem>:<line>" of the prompt sets in
../shared/datasets/train and data/prompts-*; ids are kept, so the train /
held-out split of every other record stays the same.
"""
from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path

from dspark.worker.training.decontam import EvalGuard

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ROOT.parent / "shared/datasets"


def prompt_index() -> dict[str, list[str]]:
    """file stem -> its lines' first turns (by line number, blank lines kept as "")."""
    out = {}
    for d in [DATASETS / "train", *sorted((ROOT / "data").glob("prompts-*"))]:
        for f in sorted(d.glob("*.jsonl")):
            out[f.stem] = [json.loads(ln)["turns"][0] if ln.strip() else ""
                           for ln in f.read_text(encoding="utf-8").split("\n")]
    return out


def prompt_of(index: dict[str, list[str]], rid: str) -> str | None:
    stem, line = rid.split(":")[:2]
    lines = index.get(stem)
    return lines[int(line)] if lines is not None and int(line) < len(lines) else None


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    dirs = [Path(a) for a in argv if a != "--dry-run"]
    guard = EvalGuard.from_dir(DATASETS / "eval")
    index = prompt_index()
    for d in dirs:
        for shard in sorted(d.rglob("shard-*.jsonl.gz")):
            with gzip.open(shard, "rt", encoding="utf-8") as f:
                lines = [ln for ln in f if ln.strip()]
            keep, why = [], Counter()
            for ln in lines:
                p = prompt_of(index, json.loads(ln)["id"])
                w = guard.why(p) if p is not None else None
                if w:
                    why[w] += 1
                else:
                    keep.append(ln)
            print(f"{shard}: {len(lines)} records, dropping {len(lines) - len(keep)} {dict(why)}")
            if not dry and len(keep) < len(lines):
                with gzip.GzipFile(shard, "wb", mtime=0) as g:
                    g.write("".join(keep).encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
