"""Drafter training, part 3: online distillation from the frozen target (DSPARK.md 2).

For each step: take the next sequences of a shuffled round robin (prompt + the
target's own answer), compute their target features once (``features.py``;
kept in a small LRU), sample anchors p inside the answer with p+1 inside too,
and build the teacher-forced block:

* slot k (0-based) predicts the token at p+k+1; its label is the TARGET's argmax
  at position p+k (never the text token) and its target distribution is p_t at
  p+k; ``slot_mask`` is False once p+k+1 is past the end of the sequence;
* context = the tap rows of the last W positions strictly before p.

Then ``drafter.loss``, AdamW on the drafter's own parameters only (the target,
its embedding and LM head are frozen tensors, not parameters), clip 1.0, linear
warmup then cosine decay to ``min_lr_ratio * lr``.

Determinism: ``torch.manual_seed(seed)`` before the drafter is built and one
``random.Random(seed)`` for the sequence order and the anchors; with
``max_steps`` (and no time budget) two runs give identical weights, and a run
resumed from a checkpoint continues exactly as the uninterrupted one. With a
time budget the cosine horizon is the budget (elapsed time), which is not
bit-reproducible.

Checkpoint directory: ``drafter.safetensors`` + ``drafter_config.json``
(``save_drafter``; loadable with ``load_drafter``) + ``train_state.pt``
(optimizer, step, counters, RNG states, round-robin cursor). Written to a
temporary sibling and swapped in, so a kill never leaves a half-written one.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import sys
import time
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from dspark.worker.model.drafter import DrafterConfig, DSparkDrafter, pad_context
from dspark.worker.model.drafter_ckpt import load_drafter, save_drafter

from .features import Features, target_features

STATE_FILE = "train_state.pt"


@dataclass
class TrainConfig:
    out_dir: str | None = None          # checkpoints (None = none written)
    lr: float = 6e-4
    min_lr_ratio: float = 0.1           # cosine floor, as a fraction of lr
    warmup_steps: int = 100
    weight_decay: float = 0.01          # on matrices only (not norms / biases / MASK row)
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    batch_anchors: int = 32             # anchors per step
    seqs_per_step: int = 2              # sequences the anchors of one step come from
    seed: int = 0
    time_budget_s: float | None = None
    max_steps: int | None = None
    checkpoint_every: int = 500         # steps (0 = only at the end)
    log_every_s: float = 10.0
    feature_cache: int = 8              # sequences whose features stay cached (LRU)
    topk: int | None = None             # None = full fp16 p_t; k = top-k (features.py)
    chunk: int = 512                    # target prefill chunk
    max_seq_len: int | None = None      # truncate sequences (default: the target's max_len)
    drafter_overrides: dict = field(default_factory=dict)  # DrafterConfig.for_target kwargs
    init_from_target: bool = True       # copy the target's last layers into the draft layers
    # anchor_stride > 0: single-pass mode. Each step takes ``seqs_per_step`` whole
    # sequences and draws region_len // anchor_stride anchors from each (at most
    # batch_anchors per sequence), through the shared-context path (context fused
    # once per sequence). 0: ``batch_anchors`` anchors per step (the old mode).
    anchor_stride: int = 0
    eval_every_tokens: int = 0          # held-out tau every N new labelled tokens
    eval_anchors: int = 512
    # a data budget: stop once this many new labelled tokens have been seen (the
    # per-source comparisons give every arm the same one)
    max_data_tokens: int | None = None
    # a fresh drafter's pruned draft vocabulary, given (e.g. another checkpoint's) instead
    # of the most frequent tokens of this run's data: arms on different data share one
    draft_vocab: list[int] | None = None

    def validate(self) -> None:
        if self.max_steps is None and self.time_budget_s is None and \
                self.max_data_tokens is None:
            raise ValueError("TrainConfig: set max_steps, time_budget_s and/or "
                             "max_data_tokens")
        if self.max_data_tokens is not None and self.max_data_tokens < 1:
            raise ValueError(f"TrainConfig.max_data_tokens={self.max_data_tokens} must be >= 1")
        for name in ("batch_anchors", "seqs_per_step", "feature_cache", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)} must be >= 1")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"TrainConfig: lr={self.lr} must be > 0 and "
                             f"min_lr_ratio={self.min_lr_ratio} in [0, 1]")


# ---------------------------------------------------------------- data helpers
def prepare_sequences(records, max_len: int) -> list[tuple[str, int, list[int]]]:
    """(id, prompt_len, prompt + answer ids truncated to max_len) of every record whose
    answer keeps at least two tokens (an anchor p and p+1 both inside it)."""
    out = []
    for r in records:
        p = len(r["prompt_ids"])
        ids = (list(r["prompt_ids"]) + list(r["output_ids"]))[:max_len]
        if len(ids) - p >= 2:
            out.append((str(r.get("id", len(out))), p, ids))
    return out


def sample_anchors(rng: random.Random, prompt_len: int, seq_len: int, n: int,
                   full_block: int = 0) -> list[int]:
    """n anchors p with p and p+1 inside the answer [prompt_len, seq_len); with
    full_block=K also p+K < seq_len. Without replacement when the region allows."""
    hi = seq_len - 1 - max(full_block - 1, 0)  # exclusive upper bound for p
    region = range(prompt_len, hi)
    if len(region) <= 0:
        return []
    if n <= len(region):
        return sorted(rng.sample(region, n))
    return sorted(rng.choice(region) for _ in range(n))


def block_targets(feats: Features, anchors: list[int], k: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """labels [B, K] (target argmax at p+s), slot_mask [B, K] (p+s+1 < L) and the
    positions [B, K] of p_t (clamped to the sequence; masked slots are don't-care)."""
    n = len(feats)
    dev = feats.argmax.device
    pos = torch.tensor(anchors, dtype=torch.long, device=dev).unsqueeze(1) + \
        torch.arange(k, device=dev)
    mask = pos + 1 < n
    pos = pos.clamp_max(n - 1)
    labels = torch.where(mask, feats.argmax[pos], torch.zeros_like(pos))
    return labels, mask, pos


def context_rows(feats: Features, p: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The tap rows of the last ``window`` positions strictly before p, and their positions."""
    lo = max(0, p - window)
    return feats.taps[lo:p], torch.arange(lo, p, device=feats.taps.device)


def make_batch(items: list[tuple[Features, list[int], list[int]]], k: int, window: int,
               dtype: torch.dtype, with_probs: bool = True) -> dict:
    """items: (features, token ids, anchors) per sequence -> drafter.loss kwargs."""
    rows, rpos, anchors, apos, labels, masks, probs = [], [], [], [], [], [], []
    for feats, ids, ps in items:
        if not ps:
            continue
        lab, m, pos = block_targets(feats, ps, k)
        labels.append(lab)
        masks.append(m)
        if with_probs:
            probs.append(feats.dense_probs(pos))
        for p in ps:
            r, rp = context_rows(feats, p, window)
            rows.append(r.to(dtype))
            rpos.append(rp)
            anchors.append(ids[p])
            apos.append(p)
    dev = labels[0].device
    ctx, cpos, clen = pad_context(rows, rpos)
    out = dict(ctx_rows=ctx, ctx_positions=cpos, ctx_lengths=clen,
               anchors=torch.tensor(anchors, dtype=torch.long, device=dev),
               anchor_pos=torch.tensor(apos, dtype=torch.long, device=dev),
               labels=torch.cat(labels), slot_mask=torch.cat(masks))
    if with_probs:
        out["target_probs"] = torch.cat(probs)
    return out


def frequent_tokens(seqs, n: int, vocab_size: int) -> list[int]:
    """The n most frequent token ids over the sequences' labelled regions (ties and
    unseen ids by id): the pruned draft vocabulary."""
    counts = Counter()
    for _, plen, ids in seqs:
        counts.update(ids[plen:])
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:n]
    if len(ranked) < n:
        seen = set(ranked)
        ranked += [t for t in range(vocab_size) if t not in seen][:n - len(ranked)]
    return ranked


def restricted_probs(feats: Features, pos: torch.Tensor, drafter: DSparkDrafter
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """p_t at positions [B, K] on the drafter's vocabulary [B, K, Vd] and the mass of
    the stored p_t off it [B, K] (top-k form: of the kept support only)."""
    if feats.probs is not None or drafter.draft_vocab is None:
        return drafter.restrict_probs(feats.dense_probs(pos))
    rows = pos - feats.offset
    vals = feats.topk_vals[rows].float()  # [B, K, k]
    slots = drafter.vocab_index()[feats.topk_idx[rows].long()]  # [B, K, k]
    keep = slots >= 0
    out = vals.new_zeros(*pos.shape, drafter.draft_vocab_size)
    out.scatter_add_(-1, slots.clamp_min(0), vals * keep)
    return out, (vals * ~keep).sum(-1)


def bind_for_training(drafter: DSparkDrafter, llama) -> DSparkDrafter:
    """Bind the target's embedding and LM head in the drafter's dtype with a plain
    F.linear (a bf16 CPU target packs its LM head for oneDNN; training needs the
    plain matrix, which for a tied head is the embedding)."""
    dt = drafter.dtype
    lm = llama.lm_head
    if llama.linear is not F.linear:  # packed head
        if not llama.args.tie_word_embeddings:
            raise ValueError("the target's LM head is packed for oneDNN and not tied: "
                             "load the target in float32 for training")
        lm = llama.embed
    return drafter.bind_target(llama.embed.to(dt), lm.to(dt), F.linear)


# ---------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, llama, target_model_id: str, records, cfg: TrainConfig,
                 drafter: DSparkDrafter | None = None, log=sys.stderr,
                 resume_dir: str | Path | None = None, feature_llama=None):
        """feature_llama: the target copy whose forwards make the training
        sequences' features (default ``llama``; e.g. a bf16 copy, faster on a
        CPU); ``llama`` (float32) keeps the embedding and LM head the loss binds
        and scores the held-out set."""
        cfg.validate()
        self.llama, self.cfg, self.log = llama, cfg, log
        self.feature_llama = feature_llama if feature_llama is not None else llama
        self.target_model_id = target_model_id
        dev = llama.embed.device
        max_len = min(cfg.max_seq_len or llama.cos.shape[0], llama.cos.shape[0])
        self.seqs = prepare_sequences(records, max_len)
        if not self.seqs:
            raise ValueError("train: no sequence has an answer of >= 2 tokens")
        torch.manual_seed(cfg.seed)
        self.rng = random.Random(cfg.seed)
        self.order = list(range(len(self.seqs)))
        self.rng.shuffle(self.order)
        self.cursor = 0
        self.step_no = self.anchors_seen = self.labelled = self.tokens_seen = 0
        self.elapsed = 0.0
        if resume_dir is not None:
            drafter = load_drafter(resume_dir, self.target_info(drafter_dtype=torch.float32))
        elif drafter is None:
            dcfg = DrafterConfig.for_target(llama.args, target_model_id, **cfg.drafter_overrides)
            drafter = DSparkDrafter(dcfg).to(dev)
            if cfg.init_from_target:
                drafter.init_from_target(llama)
            if cfg.draft_vocab is not None:
                if len(cfg.draft_vocab) != dcfg.draft_vocab_size:
                    raise ValueError(f"TrainConfig.draft_vocab holds {len(cfg.draft_vocab)} "
                                     f"ids, draft_vocab_size is {dcfg.draft_vocab_size}")
                drafter.set_draft_vocab(list(cfg.draft_vocab))
            elif dcfg.draft_vocab_size:
                drafter.set_draft_vocab(frequent_tokens(self.seqs, dcfg.draft_vocab_size,
                                                        dcfg.target_vocab_size))
        if drafter.config.confidence_temperatures:
            # calibration belongs to the weights it was fitted on: training changes them
            from dataclasses import replace

            drafter.config = replace(drafter.config, confidence_temperatures=())
            print("[train] the confidence temperatures of the initial drafter are dropped "
                  "(re-run `dspark calibrate-drafter` after training)", file=log)
        self.drafter = bind_for_training(drafter, llama)
        self.drafter.train()
        decay = [p for p in self.drafter.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.drafter.parameters() if p.ndim < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)
        self._cache: OrderedDict[int, Features] = OrderedDict()
        self.last_parts: dict[str, float] = {}
        self.visited: set[int] = set()
        self.data_tokens = 0                # labelled positions of distinct sequences seen
        self.next_eval = cfg.eval_every_tokens
        self.heldout_items: list | None = None
        self.curve: list[dict] = []
        if resume_dir is not None:
            self._load_state(Path(resume_dir))
        elif cfg.out_dir:  # a fresh run starts a fresh learning curve
            self.curve_path().unlink(missing_ok=True)

    def target_info(self, drafter_dtype: torch.dtype) -> dict:
        a = self.llama.args
        return dict(model_id=self.target_model_id, vocab_size=a.vocab_size,
                    hidden_size=a.hidden_size, num_layers=a.num_layers,
                    dtype=drafter_dtype, device=str(self.llama.embed.device))

    def _data_id(self) -> str:
        h = hashlib.sha256()
        for sid, p, ids in self.seqs:
            h.update(f"{sid}:{p}:{len(ids)};".encode())
        return h.hexdigest()[:16]

    # ---- state ------------------------------------------------------------
    def save_train_state(self, directory: str | Path) -> Path:
        """Drafter checkpoint + optimizer/step/RNG state, swapped in atomically."""
        directory = Path(directory)
        tmp = directory.with_name(directory.name + ".tmp")
        old = directory.with_name(directory.name + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        save_drafter(tmp, self.drafter)
        torch.save({"step": self.step_no, "anchors": self.anchors_seen,
                    "visited": sorted(self.visited), "data_tokens": self.data_tokens,
                    "next_eval": self.next_eval, "curve": self.curve,
                    "labelled": self.labelled, "tokens_seen": self.tokens_seen,
                    "elapsed": self.elapsed, "cursor": self.cursor,
                    "optimizer": self.opt.state_dict(), "py_rng": self.rng.getstate(),
                    "torch_rng": torch.get_rng_state(), "data_id": self._data_id(),
                    "config": asdict(self.cfg)}, tmp / STATE_FILE)
        if directory.exists():
            shutil.rmtree(old, ignore_errors=True)
            directory.rename(old)
        tmp.rename(directory)
        shutil.rmtree(old, ignore_errors=True)
        return directory

    def _load_state(self, directory: Path) -> None:
        st = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
        if st["data_id"] != self._data_id():
            print(f"[train] warning: resuming on different data than {directory} was "
                  "trained on (the round robin restarts from its saved cursor)", file=self.log)
        self.step_no, self.anchors_seen = st["step"], st["anchors"]
        self.labelled, self.tokens_seen = st["labelled"], st["tokens_seen"]
        self.elapsed, self.cursor = st["elapsed"], st["cursor"]
        self.visited, self.data_tokens = set(st.get("visited", [])), st.get("data_tokens", 0)
        self.next_eval, self.curve = st.get("next_eval", self.next_eval), st.get("curve", [])
        self.opt.load_state_dict(st["optimizer"])
        self.rng.setstate(st["py_rng"])
        torch.set_rng_state(st["torch_rng"])

    # ---- schedule ---------------------------------------------------------
    def lr_at(self, step: int) -> float:
        c = self.cfg
        if step < c.warmup_steps:
            return c.lr * (step + 1) / c.warmup_steps
        frac = 0.0
        if c.max_steps:
            frac = (step - c.warmup_steps) / max(c.max_steps - c.warmup_steps, 1)
        if c.time_budget_s:
            frac = max(frac, self.elapsed / c.time_budget_s)
        if c.max_data_tokens:
            frac = max(frac, self.data_tokens / c.max_data_tokens)
        frac = min(max(frac, 0.0), 1.0)
        lo = c.lr * c.min_lr_ratio
        return lo + (c.lr - lo) * 0.5 * (1 + math.cos(math.pi * frac))

    def done(self) -> bool:
        c = self.cfg
        return (c.max_steps is not None and self.step_no >= c.max_steps) or \
            (c.time_budget_s is not None and self.elapsed >= c.time_budget_s) or \
            (c.max_data_tokens is not None and self.data_tokens >= c.max_data_tokens)

    # ---- one step ----------------------------------------------------------
    def features(self, i: int) -> Features:
        f = self._cache.get(i)
        if f is not None:
            self._cache.move_to_end(i)
            return f
        _, plen, ids = self.seqs[i]  # anchors p >= plen: p_t needed only from plen on
        f = target_features(self.feature_llama, ids, self.drafter.config.target_layer_ids,
                            chunk=self.cfg.chunk, topk=self.cfg.topk, logits_from=plen)
        self.tokens_seen += len(ids)
        if i not in self.visited:
            self.visited.add(i)
            self.data_tokens += len(ids) - plen
        self._cache[i] = f
        while len(self._cache) > self.cfg.feature_cache:
            self._cache.popitem(last=False)
        return f

    def step(self) -> dict[str, float]:
        if self.cfg.anchor_stride:
            return self.step_shared()
        c, dc = self.cfg, self.drafter.config
        n = min(c.seqs_per_step, len(self.order))
        picks = [self.order[(self.cursor + j) % len(self.order)] for j in range(n)]
        self.cursor = (self.cursor + n) % len(self.order)
        items = []
        for j, i in enumerate(picks):
            _, plen, ids = self.seqs[i]
            per = c.batch_anchors // n + (1 if j < c.batch_anchors % n else 0)
            items.append((self.features(i), ids, sample_anchors(self.rng, plen, len(ids), per)))
        batch = make_batch(items, dc.block_size, dc.context_window, self.drafter.dtype)
        lr = self.lr_at(self.step_no)
        for g in self.opt.param_groups:
            g["lr"] = lr
        total, parts = self.drafter.loss(**batch)
        self.opt.zero_grad(set_to_none=True)
        total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), c.clip)
        self.opt.step()
        self.step_no += 1
        self.anchors_seen += batch["anchors"].shape[0]
        self.labelled += int(batch["slot_mask"].sum())
        out = {"loss": float(total.detach()), **{k: float(v) for k, v in parts.items()},
               "lr": lr, "grad_norm": float(gnorm)}
        self.last_parts = out
        return out

    def step_shared(self) -> dict[str, float]:
        """Single-pass step: whole sequences, anchors every ``anchor_stride`` positions
        (randomly placed), context fused once per sequence."""
        c, dr = self.cfg, self.drafter
        k = dr.config.block_size
        n = min(c.seqs_per_step, len(self.order))
        picks = [self.order[(self.cursor + j) % len(self.order)] for j in range(n)]
        self.cursor = (self.cursor + n) % len(self.order)
        hs, anchors, labels, masks, probs, outs = [], [], [], [], [], []
        for i in picks:
            _, plen, ids = self.seqs[i]
            feats = self.features(i)
            region = len(ids) - 1 - plen
            want = min(max(1, region // c.anchor_stride), c.batch_anchors)
            ps = sample_anchors(self.rng, plen, len(ids), want)
            ps = sorted(set(ps))
            if not ps:
                continue
            lab, m, pos = block_targets(feats, ps, k)
            pd, out = restricted_probs(feats, pos, dr)
            apos = torch.tensor(ps, dtype=torch.long, device=lab.device)
            toks = torch.tensor([ids[p] for p in ps], dtype=torch.long, device=lab.device)
            hs.append(dr.backbone_shared(feats.taps[:ps[-1]], toks, apos))
            anchors.append(toks)
            labels.append(lab)
            masks.append(m)
            probs.append(pd)
            outs.append(out)
        lr = self.lr_at(self.step_no)
        for g in self.opt.param_groups:
            g["lr"] = lr
        labels_t, mask_t = torch.cat(labels), torch.cat(masks)
        total, parts = dr.loss_from_h(torch.cat(hs), torch.cat(anchors), labels_t,
                                      torch.cat(probs), torch.cat(outs), mask_t)
        self.opt.zero_grad(set_to_none=True)
        total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(dr.parameters(), c.clip)
        self.opt.step()
        self.step_no += 1
        self.anchors_seen += labels_t.shape[0]
        self.labelled += int(mask_t.sum())
        out = {"loss": float(total.detach()), **{n: float(v) for n, v in parts.items()},
               "lr": lr, "grad_norm": float(gnorm)}
        self.last_parts = out
        return out

    # ---- learning curve ---------------------------------------------------------------
    def set_heldout(self, records) -> None:
        """Held-out sequences for the curve's tau (their features are computed once)."""
        self.heldout_items = prepare_heldout(self.drafter, self.llama, records,
                                             self.cfg.eval_anchors, chunk=self.cfg.chunk)

    def maybe_eval(self, force: bool = False) -> dict | None:
        c = self.cfg
        if not self.heldout_items or not c.eval_every_tokens:
            return None
        if not force and self.data_tokens < self.next_eval:
            return None
        while self.next_eval <= self.data_tokens:
            self.next_eval += c.eval_every_tokens
        if self.curve and self.curve[-1]["data_tokens"] == self.data_tokens:
            return None
        r = tau_on_items(self.drafter, self.heldout_items)
        point = {"data_tokens": self.data_tokens, "seconds": round(self.elapsed, 1),
                 "steps": self.step_no, "target_tokens": self.tokens_seen,
                 "tau": round(r["tau"], 4), "accept": [round(a, 4) for a in r["accept"]],
                 "anchors": r["anchors"]}
        self.curve.append(point)
        print(f"[train] curve: {point['data_tokens']} labelled tokens, {point['seconds']:.0f}s "
              f"-> held-out tau {point['tau']:.3f} (pos-1 {point['accept'][0]:.2f})",
              file=self.log, flush=True)
        if c.out_dir:
            self.curve_path().parent.mkdir(parents=True, exist_ok=True)
            with open(self.curve_path(), "a") as f:
                f.write(json.dumps(point) + "\n")
        return point

    def curve_path(self) -> Path:
        """<out>.curve.jsonl beside the checkpoint folder (survives its atomic swaps)."""
        out = Path(self.cfg.out_dir)
        return out.parent / (out.name + ".curve.jsonl")

    def run(self) -> dict:
        c = self.cfg
        t_last = t_prev = time.perf_counter()
        since: dict[str, float] = {}
        n_since, anchors_at_log = 0, self.anchors_seen
        while not self.done():
            parts = self.step()
            now = time.perf_counter()
            self.elapsed += now - t_prev
            t_prev = now
            for k, v in parts.items():
                since[k] = since.get(k, 0.0) + v
            n_since += 1
            if self.maybe_eval():
                t_prev = time.perf_counter()  # evaluation time does not count
            if c.out_dir and c.checkpoint_every and self.step_no % c.checkpoint_every == 0:
                self.save_train_state(c.out_dir)
            if now - t_last >= c.log_every_s or self.done():
                self._progress(since, n_since, (self.anchors_seen - anchors_at_log) /
                               max(now - t_last, 1e-9))
                since, n_since, anchors_at_log, t_last = {}, 0, self.anchors_seen, now
                t_prev = time.perf_counter()  # logging time does not count
        self.maybe_eval(force=True)
        if c.out_dir:
            self.save_train_state(c.out_dir)
        return self.stats()

    def _progress(self, since: dict, n: int, anchors_per_s: float) -> None:
        c = self.cfg
        if not n:
            return
        avg = {k: v / n for k, v in since.items()}
        etas = []
        if c.max_steps:
            etas.append((c.max_steps - self.step_no) * self.elapsed / max(self.step_no, 1))
        if c.time_budget_s:
            etas.append(c.time_budget_s - self.elapsed)
        if c.max_data_tokens and self.data_tokens:
            etas.append((c.max_data_tokens - self.data_tokens) * self.elapsed / self.data_tokens)
        eta = max(min(etas), 0.0) if etas else float("nan")
        print(f"[train] step {self.step_no}"
              f"{'/' + str(c.max_steps) if c.max_steps else ''} "
              f"loss {avg['loss']:.4f} (ce {avg['ce']:.3f} l1 {avg['l1']:.3f} "
              f"bce {avg['bce']:.3f}) lr {avg['lr']:.2e} gnorm {avg['grad_norm']:.2f} | "
              f"{anchors_per_s:.1f} anchors/s, target tokens {self.tokens_seen}, "
              f"data tokens {self.data_tokens} | {self.elapsed:.0f}s, ETA {eta:.0f}s",
              file=self.log, flush=True)

    def stats(self) -> dict:
        return {"steps": self.step_no, "anchors": self.anchors_seen,
                "seconds": self.elapsed, "labelled_tokens": self.labelled,
                "target_tokens": self.tokens_seen, "final": dict(self.last_parts),
                "sequences": len(self.seqs), "data_tokens": self.data_tokens,
                "curve": list(self.curve)}


def train(llama, target_model_id: str, records, cfg: TrainConfig,
          drafter: DSparkDrafter | None = None, log=sys.stderr,
          resume_dir: str | Path | None = None, feature_llama=None) -> dict:
    """Train (or continue training) a drafter; returns stats (``drafter`` key: the model).

    records: selfgen records ({"prompt_ids", "output_ids", ...}); drafter: start from
    this one (default: a fresh one from ``cfg.drafter_overrides``); resume_dir: a
    checkpoint written by this trainer (its drafter, optimizer, step and RNG state);
    feature_llama: see ``Trainer``.
    """
    tr = Trainer(llama, target_model_id, records, cfg, drafter, log, resume_dir,
                 feature_llama=feature_llama)
    stats = tr.run()
    stats["drafter"] = tr.drafter
    return stats


# ---------------------------------------------------------------- evaluation
@torch.no_grad()
def prepare_heldout(drafter: DSparkDrafter, llama, records, max_anchors: int = 256,
                    seed: int = 0, chunk: int = 512) -> list:
    """(features, ids, anchors) of held-out sequences for ``tau_on_items``."""
    k = drafter.config.block_size
    seqs = prepare_sequences(records, llama.cos.shape[0])
    rng = random.Random(seed)
    per = max(1, -(-max_anchors // max(len(seqs), 1)))
    items, left = [], max_anchors
    for _, plen, ids in seqs:
        if left <= 0:
            break
        ps = sorted(set(sample_anchors(rng, plen, len(ids), min(per, left), full_block=k)))
        if not ps:
            continue
        left -= len(ps)
        feats = target_features(llama, ids, drafter.config.target_layer_ids, chunk=chunk,
                                topk=1, logits_from=plen)
        items.append((feats, ids, ps))
    return items


@torch.no_grad()
def tau_on_items(drafter: DSparkDrafter, items, batch: int = 64,
                 use_markov: bool = True) -> dict:
    """Teacher-forced greedy tau over prepared held-out anchors (see heldout_tau)."""
    k, w = drafter.config.block_size, drafter.config.context_window
    taus, cums = [], []
    was_training = drafter.training
    drafter.eval()
    for feats, ids, ps in items:
        for s in range(0, len(ps), batch):
            b = make_batch([(feats, ids, ps[s:s + batch])], k, w, drafter.dtype,
                           with_probs=False)
            out = drafter.draft(b["ctx_rows"], b["ctx_positions"], b["ctx_lengths"],
                                b["anchors"], b["anchor_pos"], use_markov=use_markov)
            match = (out.tokens == b["labels"]) & b["slot_mask"]
            cum = match.long().cumprod(1)  # [B, K]: slots 1..k all accepted
            cums.append(cum)
            taus.append(cum.sum(1).float() + 1)
    drafter.train(was_training)
    if not taus:
        return {"tau": float("nan"), "anchors": 0, "accept": [float("nan")] * k}
    cum = torch.cat(cums)
    reached = torch.cat([torch.full_like(cum[:, :1], 1), cum[:, :-1]], 1).sum(0)
    accept = (cum.sum(0).float() / reached.clamp_min(1).float()).tolist()
    return {"tau": float(torch.cat(taus).mean()), "anchors": int(cum.shape[0]),
            "accept": accept}


@torch.no_grad()
def heldout_tau(drafter: DSparkDrafter, llama, records, max_anchors: int = 256,
                seed: int = 0, chunk: int = 512, batch: int = 64) -> dict:
    """Teacher-forced mean accepted length on held-out sequences.

    For anchors p in the answer with a full block inside the sequence, greedy-draft
    K tokens and count the prefix that equals the target's argmax labels (argmax p_t
    at p..p+K-1, conditioned on the text prefix); tau = accepted + 1 (the bonus
    token), in [1, K+1]. Exact speculative greedy acceptance when the text is the
    target's own greedy output; otherwise an approximation (the verifier would
    condition on the drafted tokens, not the text). Returns {"tau", "anchors",
    "accept": [P(slot k accepted | slots < k accepted) for k = 1..K]}.
    """
    bind_for_training(drafter, llama)  # plain-matrix head in the drafter's dtype
    items = prepare_heldout(drafter, llama, records, max_anchors, seed, chunk)
    return tau_on_items(drafter, items, batch)
