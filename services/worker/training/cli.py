"""`dspark train-drafter`: train (or resume training) the DSpark drafter on the
self-generated data, then report the held-out teacher-forced tau."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(args) -> int:
    import torch

    from dspark.worker.model.llama import load_llama
    from dspark.worker.runner import model_fingerprint, resolve_device
    from dspark.worker.training.selfgen import read_records
    from dspark.worker.training.setup import prepare_offline
    from dspark.worker.training.train import TrainConfig, Trainer, heldout_tau

    model_dir = prepare_offline(args)
    try:  # an unavailable device is a one-line error, as in the services
        device = resolve_device(args.device)
    except (RuntimeError, ValueError) as e:
        print(f"train-drafter: --device {args.device}: {e}", file=sys.stderr)
        return 2
    folders = [Path(d) for d in (args.data or [DEFAULT_DATA])]
    data = ", ".join(map(str, folders))
    train_recs = [r for d in folders for r in read_records(d, "train")]
    # held out: the first folder's split only (the greedy answers), so the
    # held-out tau of runs with and without extra folders stays comparable
    held = list(read_records(folders[0], "heldout"))
    if not train_recs and not held:
        print(f"train-drafter: no records in {data} (run `dspark gen-drafter-data`)",
              file=sys.stderr)
        return 1
    if args.selfgen_tokens is not None:
        # a cap on the self-generated answers (whole sequences, a seeded random subset
        # so every prompt set is represented; 0 = none):
        # with --text-sources it makes one-source-at-a-time runs (the held-out split
        # still scores them all)
        train_recs = take_tokens(train_recs, args.selfgen_tokens, seed=args.seed)
    if not train_recs and not args.text_tokens:
        print(f"train-drafter: no training data (no records in {data} and no --text-tokens)",
              file=sys.stderr)
        return 1
    # The target runs in fp32 for training: its embedding and LM head are bound
    # into the drafter's loss, and the held-out tau stays comparable across runs.
    llama = load_llama(model_dir, torch.float32, device, max_len=args.max_seq_len)
    feature_llama = None
    if args.feature_dtype == "bfloat16":
        # The training sequences' features (tap rows, soft labels) from a second,
        # bf16 copy of the target: the features are ~80% of a step in fp32, and
        # the default serving dtype is bf16 anyway. On a CPU its linears are the
        # native bf16 kernel when built (AVX512-BF16), oneDNN's otherwise.
        from dspark.worker.model import native_linear

        try:
            rows_linear = native_linear.resolve("auto", device, torch.bfloat16)
        except (RuntimeError, ValueError) as e:
            print(f"train-drafter: --feature-dtype bfloat16: {e}", file=sys.stderr)
            return 2
        feature_llama = load_llama(model_dir, torch.bfloat16, device,
                                   max_len=args.max_seq_len, pack=device.type == "cpu",
                                   rows_linear=rows_linear)
        print(f"[train] training features in bfloat16 ("
              f"{'native bf16 linears' if rows_linear is not None else 'default linears'}); "
              f"held-out features stay float32", file=sys.stderr)
    if args.text_tokens:
        from tokenizers import Tokenizer

        from dspark.worker.training.corpus import text_records

        sources = args.text_sources
        per = {src: args.text_tokens // len(sources) for src in sources}
        text = text_records(Tokenizer.from_file(str(model_dir / "tokenizer.json")),
                            Path(args.prompts), per, seq_len=args.text_seq_len,
                            seed=args.seed)
        counts: dict[str, int] = {}
        for r in text:
            counts[r["source"]] = counts.get(r["source"], 0) + len(r["output_ids"])
        print(f"[train] prefill-mode text: {len(text)} pieces, labelled tokens per source "
              f"{counts}", file=sys.stderr)
        train_recs = train_recs + text
    out = Path(args.out)
    resume = out if args.resume and (out / "train_state.pt").is_file() else None
    cfg = TrainConfig(out_dir=str(out), seed=args.seed, lr=args.lr,
                      batch_anchors=args.batch_anchors, seqs_per_step=args.seqs_per_step,
                      time_budget_s=args.time_budget_min * 60 if args.time_budget_min else None,
                      max_steps=args.max_steps, checkpoint_every=args.checkpoint_every,
                      feature_cache=args.feature_cache, topk=args.topk or None,
                      anchor_stride=args.anchor_stride,
                      eval_every_tokens=args.eval_every_tokens,
                      eval_anchors=args.eval_anchors,
                      max_data_tokens=args.max_data_tokens,
                      drafter_overrides=_drafter_overrides(args))
    if args.draft_vocab_from:
        try:
            cfg.draft_vocab = draft_vocab_of(Path(args.draft_vocab_from))
        except ValueError as e:
            print(f"train-drafter: --draft-vocab-from {args.draft_vocab_from}: {e}",
                  file=sys.stderr)
            return 2
        n = cfg.drafter_overrides.setdefault("draft_vocab_size", len(cfg.draft_vocab))
        if n != len(cfg.draft_vocab):
            print(f"train-drafter: --draft-vocab-size {n} but --draft-vocab-from "
                  f"{args.draft_vocab_from} holds {len(cfg.draft_vocab)} tokens", file=sys.stderr)
            return 2
    init = None
    if args.init_from and resume is None:
        # Warm start: the weights of an existing drafter (for example the shipped one),
        # a fresh optimizer and schedule, so CPU hours accumulate across runs even when
        # a train state was lost.
        from dspark.worker.model.drafter_ckpt import load_drafter

        a = llama.args
        init = load_drafter(args.init_from, dict(
            model_id=model_fingerprint(model_dir), vocab_size=a.vocab_size,
            hidden_size=a.hidden_size, num_layers=a.num_layers, dtype=torch.float32,
            device=str(device)))
        if cfg.drafter_overrides or cfg.draft_vocab is not None:
            print("train-drafter: --init-from takes the architecture of the checkpoint; "
                  f"drop {sorted(cfg.drafter_overrides)}", file=sys.stderr)
            return 2
    print(f"[train] {len(train_recs)} training / {len(held)} held-out sequences from {data}; "
          f"{'resuming from ' + str(out) if resume else ('weights from ' + args.init_from) if init else 'fresh drafter'}",
          file=sys.stderr)
    tr = Trainer(llama, model_fingerprint(model_dir), train_recs, cfg, drafter=init,
                 resume_dir=resume, feature_llama=feature_llama)
    if tr.drafter.draft_vocab is not None and held:
        vocab = set(tr.drafter.draft_vocab.tolist())
        toks = [t for r in held for t in r["output_ids"]]
        print(f"[train] draft vocabulary {len(vocab)} tokens covers "
              f"{sum(t in vocab for t in toks) / max(len(toks), 1):.2%} of the held-out "
              "answer tokens", file=sys.stderr)
    if held and args.eval_every_tokens:
        tr.set_heldout(held)
    stats = tr.run()
    tr.save_train_state(out)
    result = {k: v for k, v in stats.items() if k != "drafter"}
    if held and args.eval_anchors:
        result["heldout"] = heldout_tau(tr.drafter, llama, held, max_anchors=args.eval_anchors)
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def take_tokens(records: list[dict], budget: int, seed: int = 0) -> list[dict]:
    """A seeded random subset of whole records whose answers hold ``budget`` labelled
    tokens (the last record taken may pass the budget)."""
    import random

    order = list(records)
    random.Random(seed).shuffle(order)
    out, n = [], 0
    for r in order:
        if n >= budget:
            break
        out.append(r)
        n += len(r["output_ids"])
    return out


def draft_vocab_of(directory: Path) -> list[int]:
    """The pruned draft vocabulary of an existing drafter checkpoint (ValueError when it
    drafts the full vocabulary or cannot be read)."""
    from safetensors import safe_open

    from dspark.worker.model.drafter_ckpt import WEIGHTS_FILE

    f = directory / WEIGHTS_FILE
    try:
        with safe_open(str(f), framework="pt") as st:
            if "draft_vocab" not in st.keys():
                raise ValueError("that drafter drafts the full vocabulary (no draft_vocab "
                                 "tensor)")
            return st.get_tensor("draft_vocab").tolist()
    except ValueError:
        raise
    except Exception as e:  # missing or corrupt file
        raise ValueError(f"cannot read {f} ({e})") from None


def _drafter_overrides(args) -> dict:
    """DrafterConfig fields given on the command line (a fresh drafter only)."""
    out = {}
    for name in ("block_size", "markov_rank", "context_window", "num_draft_layers",
                 "draft_vocab_size"):
        if getattr(args, name) is not None:
            out[name] = getattr(args, name)
    if args.tap_layer_ids:
        out["target_layer_ids"] = tuple(args.tap_layer_ids)
    return out


DEFAULT_DATA = "data/selfgen/SmolLM2-135M-Instruct"


def add_parser(sub) -> None:
    t = sub.add_parser("train-drafter", help="train the DSpark drafter on self-generated data")
    t.add_argument("--data", action="append", default=None,
                   help=f"shards written by `dspark gen-drafter-data` (default {DEFAULT_DATA}); "
                        "repeat for more folders: every folder's training split is trained "
                        "on, the held-out split is the first folder's; a folder named twice "
                        "is drawn twice as often")
    t.add_argument("--out", default="runs/drafter-SmolLM2-135M-Instruct",
                   help="checkpoint folder (drafter + resumable train state); ship it with "
                        "`dspark export-drafter`")
    t.add_argument("--model", default="", help="target checkpoint (default: the default model)")
    t.add_argument("--resume", action=argparse_bool(), default=True,
                   help="continue from --out when it holds a train state (default: yes)")
    t.add_argument("--init-from", default="",
                   help="start from this drafter checkpoint's weights (fresh optimizer and "
                        "schedule; ignored when resuming --out)")
    t.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"],
                   help="where the target features and the drafter run (default cpu)")
    t.add_argument("--time-budget-min", type=float, default=0.0)
    t.add_argument("--max-steps", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--lr", type=float, default=6e-4)
    t.add_argument("--batch-anchors", type=int, default=64)
    t.add_argument("--seqs-per-step", type=int, default=2)
    t.add_argument("--feature-cache", type=int, default=64)
    t.add_argument("--checkpoint-every", type=int, default=200)
    t.add_argument("--max-seq-len", type=int, default=2048)
    t.add_argument("--eval-anchors", type=int, default=512, help="held-out anchors for tau")
    t.add_argument("--threads", type=int, default=0)
    t.add_argument("--tap-layer-ids", type=int, nargs="+", default=None,
                   help="target layers feeding the drafter (default 8 16 24)")
    t.add_argument("--block-size", type=int, default=None, help="K (default 7)")
    t.add_argument("--markov-rank", type=int, default=None, help="r (default 64; 0 = DFlash)")
    t.add_argument("--context-window", type=int, default=None, help="W (default 128)")
    t.add_argument("--num-draft-layers", type=int, default=None, help="N (default 2)")
    t.add_argument("--draft-vocab-size", type=int, default=None,
                   help="prune the draft vocabulary to the N most frequent training tokens "
                        "(default: the full vocabulary)")
    t.add_argument("--anchor-stride", type=int, default=4,
                   help="single-pass mode: an anchor per N labelled positions of each "
                        "sequence, at most --batch-anchors per sequence (0 = a fixed "
                        "--batch-anchors per step)")
    t.add_argument("--topk", type=int, default=32,
                   help="keep the target's top-k probabilities as soft labels (0 = all)")
    t.add_argument("--text-tokens", type=int, default=0,
                   help="add this many labelled tokens of existing text (prefill-mode "
                        "distillation), split evenly over --text-sources")
    t.add_argument("--text-sources", nargs="+",
                   default=["train-prompts", "python-stdlib", "package-docs"])
    t.add_argument("--text-seq-len", type=int, default=512)
    t.add_argument("--prompts", default=str(_datasets_train()),
                   help="training prompt files (the train-prompts text source)")
    t.add_argument("--selfgen-tokens", type=int, default=None,
                   help="use at most this many labelled tokens of the self-generated answers "
                        "(default: all; 0 = none, e.g. for a text-only run)")
    t.add_argument("--max-data-tokens", type=int, default=None,
                   help="data budget: stop after this many new labelled tokens")
    t.add_argument("--draft-vocab-from", default="",
                   help="a fresh drafter takes the pruned draft vocabulary of this checkpoint "
                        "(instead of this run's most frequent tokens)")
    t.add_argument("--eval-every-tokens", type=int, default=0,
                   help="learning curve: held-out tau every N new labelled tokens")
    t.add_argument("--feature-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="dtype of the target forwards that make the training features "
                        "(bfloat16: measured 1.7x the steps per minute on a 2-core "
                        "AVX512-BF16 CPU, may be slower on CPUs without bf16 instructions; "
                        "labels follow the bf16 target; held-out tau is always scored on "
                        "float32 features)")
    t.add_argument("--json", default=None, help="write the stats here")
    t.set_defaults(fn=main)


def export_main(args) -> int:
    import torch

    from dspark.worker.model.drafter_ckpt import export_drafter

    dt = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    out = export_drafter(args.src, args.dst, dt)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"exported {args.src} -> {out} ({args.dtype}, {size:.1f} MiB)")
    return 0


def add_export_parser(sub) -> None:
    from dspark.shared.config import DEFAULT_MODEL_NAME, shipped_drafter_dir

    e = sub.add_parser("export-drafter",
                       help="copy a trained drafter (weights only) to where serving finds it")
    e.add_argument("src", help="a train-drafter --out folder")
    e.add_argument("dst", nargs="?", default=str(shipped_drafter_dir(DEFAULT_MODEL_NAME)),
                   help="destination (default: the shipped drafter of the default model)")
    e.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    e.set_defaults(fn=export_main)


def _datasets_train() -> Path:
    from dspark.shared.cli import _datasets_dir

    return _datasets_dir() / "train"


def argparse_bool():
    import argparse

    return argparse.BooleanOptionalAction
