"""Held-out teacher-forced tau of drafter checkpoints on the same anchors (the
figure `train-drafter` reports at the end of a run), so drafters trained on
different data pools compare on one held-out set.

usage: .venv/bin/python scripts/drafter/heldout_tau.py [--anchors N] [--data DIR] [--threads T]
       DRAFTER_DIR... > out.json
"""
import argparse
import json
from pathlib import Path

import torch

from dspark.shared.config import default_model_dir
from dspark.worker.model.drafter_ckpt import load_drafter
from dspark.worker.model.llama import load_llama
from dspark.worker.runner import model_fingerprint
from dspark.worker.training.selfgen import read_records
from dspark.worker.training.train import heldout_tau

ap = argparse.ArgumentParser()
ap.add_argument("drafters", nargs="+")
ap.add_argument("--anchors", type=int, default=1024)
ap.add_argument("--data", default="data/selfgen/SmolLM2-135M-Instruct")
ap.add_argument("--threads", type=int, default=1)
args = ap.parse_args()
torch.set_num_threads(args.threads)
md = default_model_dir()
llama = load_llama(md, torch.float32, torch.device("cpu"), max_len=4096)
a = llama.args
held = list(read_records(Path(args.data), "heldout"))
out = {"heldout_sequences": len(held),
       "heldout_tokens": sum(len(r["output_ids"]) for r in held), "drafters": {}}
for d in args.drafters:
    dr = load_drafter(d, dict(model_id=model_fingerprint(md), vocab_size=a.vocab_size,
                              hidden_size=a.hidden_size, num_layers=a.num_layers,
                              dtype=torch.float32, device="cpu"))
    with torch.no_grad():
        out["drafters"][d] = heldout_tau(dr, llama, held, max_anchors=args.anchors)
print(json.dumps(out, indent=1))
