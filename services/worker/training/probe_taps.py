"""`dspark probe-taps`: which target layers should feed the drafter, measured cheaply.

Training one drafter per candidate tap set costs hours on a CPU, so the choice
is first narrowed with a linear probe that needs one target forward over some
held-out text and a few ridge regressions:

For anchor position p (the drafter's slot 0 sits on the anchor token x_p and
its context ends at p - 1), the probe's input is the concatenated tap rows of
position p - 1 (a candidate layer set S) plus the embedding of x_p, and its
goal for offset j = 0..J-1 is the target's greedy token after position p + j
(what draft slot j must produce). A ridge regression maps the input onto the
LM-head row of that token (the embedding matrix is tied for the default
model, so the row *is* the token's output direction); the prediction is the
argmax of ``E @ y`` over the vocabulary. Probe accuracy on held-out positions
ranks the sets by how much linearly readable information about the next
tokens their rows carry. It is a proxy: the drafter also attends to W context
rows through its own layers, so absolute numbers are far below its tau, and
the ranking, not the level, is what the probe is for.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

DEFAULT_SETS = ("8,16,24", "4,14,24", "2,15,28", "20,24,28", "26,27,28", "12,20,28",
                "8", "16", "24", "28")


def parse_sets(specs, num_layers: int) -> list[tuple[int, ...]]:
    """'8,16,24' -> (8, 16, 24); every layer must be tappable (not the final one)."""
    out = []
    for spec in specs:
        try:
            s = tuple(int(x) for x in str(spec).split(",") if x.strip())
        except ValueError:
            raise ValueError(f"--sets: {spec!r} is not a comma-separated list of "
                             "layer ids") from None
        if not s or any(not 0 <= x < num_layers - 1 for x in s):
            raise ValueError(f"--sets: {spec!r} is invalid: each layer must be in "
                             f"[0, {num_layers - 2}] (the final layer cannot be tapped)")
        out.append(s)
    return out


def ridge_fit(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """W minimising ||x W - y||^2 + lam * n * ||W||^2 (x standardised by the caller)."""
    n, f = x.shape
    a = x.T @ x + lam * n * torch.eye(f, dtype=x.dtype)
    return torch.linalg.solve(a, x.T @ y)


def probe_accuracy(feats_tr: torch.Tensor, goals_tr: torch.Tensor, feats_te: torch.Tensor,
                   goals_te: torch.Tensor, out_rows: torch.Tensor, lam: float = 1e-3
                   ) -> float:
    """Fit on (feats_tr -> out_rows[goals_tr]) and return top-1 accuracy on the test
    split, where a prediction y is decoded as argmax(out_rows @ y)."""
    mu, sd = feats_tr.mean(0), feats_tr.std(0).clamp_min(1e-6)
    xt, xe = (feats_tr - mu) / sd, (feats_te - mu) / sd
    ones_t = torch.ones(xt.shape[0], 1, dtype=xt.dtype)
    ones_e = torch.ones(xe.shape[0], 1, dtype=xe.dtype)
    w = ridge_fit(torch.cat([xt, ones_t], 1), out_rows[goals_tr], lam)
    pred = (torch.cat([xe, ones_e], 1) @ w) @ out_rows.T
    return float((pred.argmax(-1) == goals_te).float().mean())


@torch.no_grad()
def collect(llama, sequences: list[tuple[int, list[int]]], max_positions: int,
            layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Tap rows of every candidate layer at p - 1, the anchor token x_p and the target's
    greedy tokens after p + j, for anchors p inside the answers.

    sequences: (prompt length, token ids). Returns taps [N, len(layers), d] float32,
    anchor ids [N], goals [N, J] (J = 3) and N.
    """
    from .features import target_features

    j_max = 3
    taps, anchors, goals, n = [], [], [], 0
    for plen, ids in sequences:
        if n >= max_positions:
            break
        f = target_features(llama, ids, layers, topk=1, logits_from=plen)
        last = len(ids) - j_max  # argmax at p + j must exist (p + j <= len - 1)
        ps = list(range(max(plen, 1), last))[:max_positions - n]
        if not ps:
            continue
        p = torch.tensor(ps)
        d = llama.args.hidden_size
        taps.append(f.taps[p - 1].float().view(len(ps), len(layers), d))
        anchors.append(torch.tensor([ids[i] for i in ps]))
        goals.append(torch.stack([f.argmax[p + j] for j in range(j_max)], 1))
        n += len(ps)
    return torch.cat(taps), torch.cat(anchors), torch.cat(goals), n


def run_probe(llama, sequences, sets: list[tuple[int, ...]], max_positions: int = 12000,
              test_fraction: float = 0.25, lam: float = 1e-2, log=sys.stderr) -> dict:
    """Probe accuracies per tap set and offset; the split is by position order
    (the last ``test_fraction`` of positions, i.e. whole later sequences, is held out)."""
    layers = tuple(sorted({x for s in sets for x in s}))
    taps, anchors, goals, n = collect(llama, sequences, max_positions, layers)
    if n < 100:
        raise ValueError(f"probe-taps: only {n} anchor positions (need >= 100)")
    cut = int(n * (1 - test_fraction))
    emb = llama.embed.float()
    out_rows = (llama.lm_head if not llama.lm_head.is_mkldnn else llama.embed).float()
    anchor_emb = emb[anchors]
    col = {x: i for i, x in enumerate(layers)}
    results = []
    for s in sets:
        x = torch.cat([taps[:, [col[i] for i in s]].flatten(1), anchor_emb], 1)
        accs = [probe_accuracy(x[:cut], goals[:cut, j], x[cut:], goals[cut:, j], out_rows, lam)
                for j in range(goals.shape[1])]
        row = {"layers": list(s), "accuracy": [round(a, 4) for a in accs],
               "mean": round(sum(accs) / len(accs), 4)}
        results.append(row)
        print(f"[probe] taps {','.join(map(str, s)):>10s}: accuracy at offsets 0..2 "
              f"{' '.join(f'{a:.3f}' for a in accs)} (mean {row['mean']:.3f})",
              file=log, flush=True)
    # reference: the anchor embedding alone (no context rows at all)
    accs = [probe_accuracy(anchor_emb[:cut], goals[:cut, j], anchor_emb[cut:], goals[cut:, j],
                           out_rows, lam) for j in range(goals.shape[1])]
    return {"positions": n, "train_positions": cut, "test_positions": n - cut,
            "sets": sorted(results, key=lambda r: -r["mean"]),
            "anchor_only": [round(a, 4) for a in accs]}


def main(args) -> int:
    from dspark.worker.model.llama import load_llama
    from dspark.worker.training.selfgen import read_records
    from dspark.worker.training.setup import prepare_offline

    model_dir = prepare_offline(args)
    llama = load_llama(model_dir, torch.float32, torch.device("cpu"), max_len=2048)
    sets = parse_sets(args.sets, llama.args.num_layers)
    recs = list(read_records(Path(args.data), args.split))
    if not recs:
        print(f"probe-taps: no {args.split} records in {args.data}", file=sys.stderr)
        return 1
    seqs = [(len(r["prompt_ids"]), r["prompt_ids"] + r["output_ids"]) for r in recs]
    res = run_probe(llama, seqs, sets, max_positions=args.max_positions, lam=args.ridge)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("probe-taps", help="rank candidate drafter tap layers with a "
                                          "linear probe (one target forward, minutes)")
    p.add_argument("--data", default="data/selfgen/SmolLM2-135M-Instruct",
                   help="shards written by `dspark gen-drafter-data`")
    p.add_argument("--split", default="train", choices=["train", "heldout"],
                   help="which records' answers to probe on (the probe's own train/test "
                        "split is by position order inside them)")
    p.add_argument("--model", default="", help="target checkpoint (default: the default model)")
    p.add_argument("--sets", nargs="+", default=list(DEFAULT_SETS),
                   help="candidate tap sets, each a comma-separated list of layer ids")
    p.add_argument("--max-positions", type=int, default=12000)
    p.add_argument("--ridge", type=float, default=1e-2, help="ridge strength (x n)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", default=None)
    p.set_defaults(fn=main)
