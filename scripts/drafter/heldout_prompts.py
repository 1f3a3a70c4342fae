"""Write the first N held-out training prompts of some sets as eval-drafter
prompt files (the prompts whose answers the training curve scores), so the
real decoding loop can be measured on the text the curve measures.

usage: .venv/bin/python scripts/drafter/heldout_prompts.py OUT_DIR [N]
then:  dspark eval-drafter --prompts OUT_DIR/*.jsonl --no-ablation --no-check
"""
import gzip
import json
import sys
from pathlib import Path

SETS = ("gsm8k-train-split", "livecodebench", "arena-hard-v2")
out, n = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5
root = Path(__file__).resolve().parents[2]
recs = []
for f in sorted((root / "data/selfgen/SmolLM2-135M-Instruct").glob("shard-*.jsonl.gz")):
    with gzip.open(f, "rt") as fh:
        for line in fh:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r["split"] == "heldout":
                recs.append(r["id"])
out.mkdir(parents=True, exist_ok=True)
for s in SETS:
    lines = (root.parent / "shared/datasets/train" / f"{s}.jsonl").read_text().split("\n")
    ids = [int(i.split(":")[1]) for i in recs if i.startswith(s + ":")][:n]
    (out / f"heldout-{s}.jsonl").write_text("".join(lines[i] + "\n" for i in ids))
    print(s, ids)
