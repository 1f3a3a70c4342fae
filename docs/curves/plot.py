"""Plot the drafter learning curves kept here (held-out teacher-forced tau
against labelled training tokens and against training time) into curves.png.

    .venv/bin/python docs/curves/plot.py

Each *.curve.jsonl is the `<out>.curve.jsonl` a `dspark train-drafter` run
writes (one line per evaluation: data_tokens, seconds, tau, ...); the card
(docs/DRAFTER.md) says which run each one is.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
# warm-started runs start where their weights' training left off: (labelled
# tokens, minutes) before their first point
OFFSETS = {"s12-d3": (1.05e6 + 216_318, 106 + 95),
           "s13-t1": (1.05e6 + 216_318 + 590_000, 106 + 95 + 80),
           "s14-t1": (1.05e6 + 216_318 + 590_000 + 268_302, 106 + 95 + 80 + 34),
           "s15-t1": (1.05e6 + 216_318 + 590_000 + 268_302 + 257_645,
                      106 + 95 + 80 + 34 + 40),
           "s16-t1": (1.05e6 + 216_318 + 590_000 + 268_302 + 257_645,
                      106 + 95 + 80 + 34 + 40),
           "s17-t1": (1.05e6 + 216_318 + 590_000 + 268_302 + 257_645 + 686_247,
                      106 + 95 + 80 + 34 + 40 + 55),
           "s18-t1": (1.05e6 + 216_318 + 590_000 + 268_302 + 257_645 + 686_247,
                      106 + 95 + 80 + 34 + 40 + 55),
           "s19-t1": (1.05e6 + 216_318 + 590_000 + 268_302 + 257_645 + 686_247 + 775_484,
                      106 + 95 + 80 + 34 + 40 + 55 + 65),
           "s20-t1": (1.05e6 + 216_318 + 590_000 + 268_302 + 257_645 + 686_247 + 775_484
                      + 1_107_781, 106 + 95 + 80 + 34 + 40 + 55 + 65 + 55)}
# file stem -> legend label (the card's names for the runs)
RUNS = {
    "s20-t1": "s20: warm from s19, + a 4th round, 80% chat (shipped)",
    "s19-t1": "s19: warm from s18, + a 3rd round, decontaminated, bf16 features (shipped before)",
    "s18-t1": "s18: warm from s16, + answers to a 2nd round of synthetic prompts (shipped before)",
    "s17-t1": "s17: warm from s16, same mix, 30 min more (a candidate)",
    "s16-t1": "s16: warm from s14, + answers to synthetic prompts (shipped before)",
    "s15-t1": "s15: warm from s14, all 2,747 T = 1 answers (a candidate)",
    "s14-t1": "s14: warm from s13, half the draws T = 1 answers (shipped before)",
    "s13-t1": "s13: warm from s12 + the first T = 1 answers (a candidate)",
    "s12-d3": "s12: warm from s10 + a 2nd pass, 2x the answers (new held-out set)",
    "s10-mix": "s10: from scratch, answers + prompts' text",
    "d2": "d2: warm start, 45% stdlib code (shipped before)",
    "s9-src-selfgen": "s9 arm: answers only",
    "s9-src-train-prompts": "s9 arm: prompts' text only",
    "s9-src-package-docs": "s9 arm: package docs only",
    "s9-src-python-stdlib": "s9 arm: stdlib code only",
}


def main(out: Path = HERE / "curves.png") -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for stem, label in RUNS.items():
        f = HERE / f"{stem}.curve.jsonl"
        if not f.is_file():
            continue
        pts = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        x0, t0 = OFFSETS.get(stem, (0, 0))
        xs = [(x0 + p["data_tokens"]) / 1e6 for p in pts]
        ts = [t0 + p["seconds"] / 60 for p in pts]
        ys = [p["tau"] for p in pts]
        style = dict(marker="o", ms=4, label=label, lw=2.5 if "shipped)" in label else 1.2)
        ax.plot(xs, ys, **style)
        ax2.plot(ts, ys, **style)
    ax.set_xlabel("new target-labelled training tokens (millions)")
    ax.set_ylabel("held-out tau (teacher-forced, greedy, K = 7)")
    ax2.set_xlabel("training time (minutes; 2 threads for s10/d2, 1 for the s9 arms)")
    ax.set_title("Held-out tau vs data")
    ax2.set_title("Held-out tau vs training time")
    ax.legend(fontsize=8)
    for a in (ax, ax2):
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(*(Path(a) for a in sys.argv[1:2])))
