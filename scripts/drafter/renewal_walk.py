"""Diagnostic: teacher-forced accepted length at EVERY answer position of the
held-out self-generated answers, then the renewal walk the real decoding loop
makes over the same text (step from p to p + L(p) + 1). If the walk's tokens per
step equals the real loop's tau on such text, heterogeneity (hard stretches
weigh more per step) explains the gap to the uniform-anchor tau; if the real
loop is lower still, there is a train/serve skew.

usage: .venv/bin/python scripts/drafter/renewal_walk.py DRAFTER_DIR [N_SEQS] > out.json
"""
import json
import sys
from pathlib import Path

import torch

from dspark.shared.config import default_model_dir
from dspark.worker.model.drafter_ckpt import load_drafter
from dspark.worker.model.llama import load_llama
from dspark.worker.runner import model_fingerprint
from dspark.worker.training.features import target_features
from dspark.worker.training.selfgen import read_records
from dspark.worker.training.train import bind_for_training, make_batch, prepare_sequences

torch.set_num_threads(1)
ddir, nseq = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 24
md = default_model_dir()
llama = load_llama(md, torch.float32, torch.device("cpu"), max_len=4096)
a = llama.args
dr = load_drafter(ddir, dict(model_id=model_fingerprint(md), vocab_size=a.vocab_size,
                             hidden_size=a.hidden_size, num_layers=a.num_layers,
                             dtype=torch.float32, device="cpu"))
bind_for_training(dr, llama)
dr.eval()
k, w = dr.config.block_size, dr.config.context_window
recs = list(read_records(Path("data/selfgen/SmolLM2-135M-Instruct"), "heldout"))[:nseq]
all_l, walk_tokens, walk_steps, per = [], 0, 0, []
with torch.no_grad():
    for _, plen, ids in prepare_sequences(recs, llama.cos.shape[0]):
        ps = list(range(plen, len(ids) - k))
        if len(ps) < 8:
            continue
        feats = target_features(llama, ids, dr.config.target_layer_ids, topk=1, logits_from=plen)
        ls = []
        for s in range(0, len(ps), 64):
            b = make_batch([(feats, ids, ps[s:s + 64])], k, w, dr.dtype, with_probs=False)
            out = dr.draft(b["ctx_rows"], b["ctx_positions"], b["ctx_lengths"], b["anchors"],
                           b["anchor_pos"])
            cum = ((out.tokens == b["labels"]) & b["slot_mask"]).long().cumprod(1)
            ls += cum.sum(1).tolist()
        L = dict(zip(ps, ls))
        p, toks, steps = plen, 0, 0
        while p in L:
            toks += L[p] + 1
            steps += 1
            p += L[p] + 1
        all_l += ls
        walk_tokens += toks
        walk_steps += steps
        per.append({"uniform": sum(x + 1 for x in ls) / len(ls), "walk": toks / steps})
        print(f"seq {len(per)}: uniform {per[-1]['uniform']:.3f} walk {per[-1]['walk']:.3f}",
              file=sys.stderr, flush=True)
print(json.dumps({"drafter": ddir, "sequences": len(per), "positions": len(all_l),
                  "uniform_tau": sum(x + 1 for x in all_l) / len(all_l),
                  "walk_tau": walk_tokens / walk_steps, "walk_steps": walk_steps,
                  "per_sequence": per}, indent=1))
