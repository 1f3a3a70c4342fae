"""Drafter training: target features, anchors/labels, training, determinism, resume,
held-out tau. Tiny random Llama (conftest.py), fp32, tiny drafter (K=3, W=6)."""
from __future__ import annotations

import io
import random

import pytest
import torch

from dspark.worker.model.drafter import DraftOutput
from dspark.worker.model.drafter_ckpt import load_drafter
from dspark.worker.training.features import target_features
from dspark.worker.training.train import (STATE_FILE, TrainConfig, Trainer, block_targets,
                                          heldout_tau, make_batch, sample_anchors, train)

from .reference import dense_forward, load_weights

K, W = 3, 6
TAPS = (0, 1, 2)
OVR = dict(target_layer_ids=TAPS, block_size=K, context_window=W, num_draft_layers=1,
           markov_rank=8)


pytestmark = pytest.mark.usefixtures("one_thread")


def records(n=3, seed=0):
    g = random.Random(seed)
    return [{"id": f"r{i}", "split": "train",
             "prompt_ids": [g.randrange(3, 96) for _ in range(5 + i)],
             "output_ids": [g.randrange(3, 96) for _ in range(14 + 3 * i)], "finish": "STOP"}
            for i in range(n)]


def cfg(**kw):
    base = dict(lr=3e-3, warmup_steps=2, max_steps=8, batch_anchors=8, seqs_per_step=2,
                seed=0, log_every_s=1e9, drafter_overrides=OVR, chunk=7)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("chunk,topk,start", [(512, None, 0), (5, None, 0), (8, 10, 0),
                                              (4, None, 9), (7, 5, 7)])
def test_target_features_match_dense_forward(tiny_model_dir, target, chunk, topk, start):
    c, w = load_weights(tiny_model_dir)
    toks = records(1)[0]["prompt_ids"] + records(1)[0]["output_ids"]
    logits, hidden = dense_forward(c, w, toks)
    f = target_features(target, toks, TAPS, chunk=chunk, topk=topk, logits_from=start)
    n = len(toks)
    assert f.taps.shape == (n, 3 * 64) and f.taps.dtype == torch.float32
    torch.testing.assert_close(f.taps, torch.cat([hidden[i] for i in TAPS], -1),
                               atol=1e-4, rtol=1e-4)
    assert torch.equal(f.argmax[start:], logits[start:].argmax(-1))
    assert (f.argmax[:start] == -1).all()
    p = torch.softmax(logits, -1)[start:]
    dense = f.dense_probs(torch.arange(start, n))
    if start:
        with pytest.raises(IndexError, match="offset"):
            f.dense_probs(torch.tensor([start - 1]))
    if topk is None:
        torch.testing.assert_close(dense, p, atol=2e-3, rtol=0)
    else:
        v, i = p.topk(topk, -1)
        torch.testing.assert_close(dense.gather(1, i), v, atol=2e-3, rtol=0)
        assert (dense > 0).sum(-1).le(topk).all()  # zeros off the support, not renormalised
        assert f.nbytes == n * (3 * 64 * 4 + 8) + (n - start) * 6 * topk


def test_anchors_labels_and_context(target):
    rng = random.Random(0)
    for _ in range(50):
        ps = sample_anchors(rng, 5, 12, rng.randrange(1, 12))
        assert all(5 <= p and p + 1 < 12 for p in ps)
    assert sample_anchors(rng, 5, 6, 3) == []  # answer of one token: no anchor
    assert all(p + K < 12 for p in sample_anchors(rng, 5, 12, 20, full_block=K))
    r = records(1)[0]
    ids = r["prompt_ids"] + r["output_ids"]
    f = target_features(target, ids, TAPS)
    n = len(ids)
    ps = [5, n - 3, n - 2]
    labels, mask, _ = block_targets(f, ps, K)
    assert mask.tolist() == [[True] * 3, [True, True, False], [True, False, False]]
    assert labels[0].tolist() == f.argmax[5:8].tolist()  # target argmax, not the text
    b = make_batch([(f, ids, ps)], K, W, torch.float32)
    assert b["anchors"].tolist() == [ids[p] for p in ps]
    assert b["target_probs"].shape == (3, K, 97)
    torch.testing.assert_close(b["target_probs"][0, 1], f.dense_probs(torch.tensor(6)))
    for j, p in enumerate(ps):  # context = last W rows strictly before p
        m = int(b["ctx_lengths"][j])
        assert m == min(W, p)
        assert b["ctx_positions"][j, :m].tolist() == list(range(p - m, p))
        assert torch.equal(b["ctx_rows"][j, :m], f.taps[p - m:p])


def test_training_lowers_loss_and_is_deterministic(target):
    log = io.StringIO()
    tr = Trainer(target, "tiny-llama", records(), cfg(max_steps=1, lr=1e-9), log=log)
    tr.drafter.eval()
    fixed = make_batch([(tr.features(i), tr.seqs[i][2],
                         list(range(tr.seqs[i][1], len(tr.seqs[i][2]) - 1)))
                        for i in range(3)], K, W, torch.float32)

    def eval_loss(dr):
        with torch.no_grad():
            return float(dr.loss(**fixed)[0])

    before = eval_loss(tr.drafter)
    s1 = train(target, "tiny-llama", records(), cfg(max_steps=25), log=log)
    s2 = train(target, "tiny-llama", records(), cfg(max_steps=25), log=io.StringIO())
    assert s1["steps"] == 25 and s1["anchors"] == 25 * 8
    assert 0 < s1["labelled_tokens"] <= 25 * 8 * K and s1["target_tokens"] > 0
    assert set(s1["final"]) >= {"loss", "ce", "l1", "bce"}
    assert eval_loss(s1["drafter"]) < 0.9 * before
    for (n, a), (_, b) in zip(s1["drafter"].state_dict().items(),
                              s2["drafter"].state_dict().items()):
        assert torch.equal(a, b), n
    assert "[train] step 25/25" in log.getvalue()


def test_bf16_feature_target_makes_the_training_features(tiny_model_dir, target):
    """feature_llama (`--feature-dtype bfloat16`): the training sequences'
    features come from the bf16 copy (tap rows in bf16, within its rounding of
    the fp32 ones), the held-out set is still scored on the fp32 target, and
    training still learns."""
    from dspark.worker.model.llama import load_llama

    t16 = load_llama(tiny_model_dir, torch.bfloat16, torch.device("cpu"), max_len=64)
    tr = Trainer(target, "tiny-llama", records(), cfg(max_steps=1, lr=1e-9), log=io.StringIO(),
                 feature_llama=t16)
    f16 = tr.features(0)
    f32 = target_features(target, tr.seqs[0][2], TAPS, logits_from=tr.seqs[0][1])
    assert f16.taps.dtype == torch.bfloat16 and f32.taps.dtype == torch.float32
    assert not torch.equal(f16.taps.float(), f32.taps)
    rel = float((f16.taps.float() - f32.taps).norm() / f32.taps.norm())
    assert rel < 0.03, rel  # bf16 rounding through three layers, not another forward
    assert (f16.argmax[tr.seqs[0][1]:] == f32.argmax[tr.seqs[0][1]:]).float().mean() > 0.8
    held = [dict(r, split="heldout") for r in records(2, seed=5)]
    tr.set_heldout(held)
    # held-out items are prepared from the fp32 target: equal to a run without the copy
    ref = Trainer(target, "tiny-llama", records(), cfg(max_steps=1, lr=1e-9), log=io.StringIO())
    ref.set_heldout(held)
    assert len(tr.heldout_items) == len(ref.heldout_items) > 0
    for (fa, ids_a, ps_a), (fb, ids_b, ps_b) in zip(tr.heldout_items, ref.heldout_items):
        assert fa.taps.dtype == torch.float32 and torch.equal(fa.taps, fb.taps)
        assert (ids_a, ps_a) == (ids_b, ps_b)
    s = train(target, "tiny-llama", records(), cfg(max_steps=25), log=io.StringIO(),
              feature_llama=t16)
    fixed = make_batch([(f32, tr.seqs[0][2], list(range(tr.seqs[0][1], len(tr.seqs[0][2]) - 1)))],
                       K, W, torch.float32)
    with torch.no_grad():
        before = float(tr.drafter.eval().loss(**fixed)[0])
        after = float(s["drafter"].eval().loss(**fixed)[0])
    assert after < 0.9 * before


def test_resume_continues_and_matches_uninterrupted(target, tmp_path):
    full = train(target, "tiny-llama", records(), cfg(max_steps=6), log=io.StringIO())
    out = tmp_path / "ckpt"
    a = train(target, "tiny-llama", records(), cfg(max_steps=3, out_dir=str(out)),
              log=io.StringIO())
    assert a["steps"] == 3 and (out / STATE_FILE).is_file()
    b = train(target, "tiny-llama", records(), cfg(max_steps=6, out_dir=str(out)),
              log=io.StringIO(), resume_dir=out)
    assert b["steps"] == 6 and b["anchors"] == 6 * 8
    for (n, x), (_, y) in zip(full["drafter"].state_dict().items(),
                              b["drafter"].state_dict().items()):
        assert torch.equal(x, y), n  # bit-exact continuation
    info = dict(model_id="tiny-llama", vocab_size=97, hidden_size=64, num_layers=4,
                dtype=torch.float32, device="cpu")
    dr = load_drafter(out, info)
    for n, t in b["drafter"].state_dict().items():
        assert torch.equal(dr.state_dict()[n], t), n
    assert not (tmp_path / "ckpt.tmp").exists() and not (tmp_path / "ckpt.old").exists()


def test_checkpoint_every_and_time_budget(target, tmp_path):
    out = tmp_path / "c"
    s = train(target, "tiny-llama", records(2), cfg(max_steps=None, time_budget_s=0.5,
                                                    checkpoint_every=2, out_dir=str(out)),
              log=io.StringIO())
    assert s["steps"] >= 1 and s["seconds"] >= 0.5 and (out / STATE_FILE).is_file()
    with pytest.raises(ValueError, match="max_steps"):
        TrainConfig().validate()


def test_heldout_tau_bounds_and_oracle(target, monkeypatch):
    tr = Trainer(target, "tiny-llama", records(), cfg(), log=io.StringIO())
    dr = tr.drafter
    held = records(2, seed=5)
    r = heldout_tau(dr, target, held, max_anchors=20)
    assert r["anchors"] > 0 and 1 <= r["tau"] <= K + 1 and len(r["accept"]) == K
    assert all(0 <= a <= 1 for a in r["accept"])

    for rec in held:  # oracle drafter: drafts exactly the target's argmax labels
        ids = rec["prompt_ids"] + rec["output_ids"]
        am = target_features(target, ids, TAPS).argmax

        def oracle(ctx_rows, ctx_positions, ctx_lengths, anchors, anchor_pos, am=am, **kw):
            b = anchors.shape[0]
            toks = torch.stack([am[anchor_pos + s] for s in range(K)], 1)
            return DraftOutput(toks, torch.ones(b, K), None, torch.ones(b, K))

        monkeypatch.setattr(dr, "draft", oracle)
        r = heldout_tau(dr, target, [rec], max_anchors=10)
        assert r["anchors"] == 10 and r["tau"] == K + 1 and r["accept"] == [1.0] * K
