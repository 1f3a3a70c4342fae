"""DSpark drafter: masking, Markov head, confidence, loss and checkpoint validation.

A tiny random Llama (tests/worker/conftest.py) provides the frozen embedding and LM
head; tap rows are random tensors of the right width (the drafter only sees rows).
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from dspark.worker.model.drafter import DrafterConfig, DSparkDrafter, pad_context
from dspark.worker.model.drafter_ckpt import CONFIG_FILE, WEIGHTS_FILE, load_drafter, save_drafter

K, W = 4, 8


pytestmark = pytest.mark.usefixtures("one_thread")


def make_config(llama, **kw) -> DrafterConfig:
    kw = dict(dict(target_layer_ids=(0, 1, 2), block_size=K, context_window=W,
                   num_draft_layers=2, markov_rank=8), **kw)
    return DrafterConfig.for_target(llama.args, "tiny-llama", **kw)


def make_drafter(llama, seed: int = 0, **kw) -> DSparkDrafter:
    """A drafter with every head randomised (W2 and the confidence head start at 0)."""
    torch.manual_seed(seed)
    dr = DSparkDrafter(make_config(llama, **kw)).bind_llama(llama)
    with torch.no_grad():
        if dr.config.markov_rank:
            dr.markov_w2.normal_(0, 1.0)
            dr.markov_w1.normal_(0, 1.0)
        dr.conf_w.normal_(0, 0.5)
    return dr


def batch(llama, lengths=(11, 5), seed=1):
    """Context rows at positions 0..n-1 and the anchor right after them."""
    g = torch.Generator().manual_seed(seed)
    width = 3 * llama.args.hidden_size
    rows = [torch.randn(n, width, generator=g) for n in lengths]
    pos = [torch.arange(n) for n in lengths]
    ctx, cpos, clen = pad_context(rows, pos)
    anchors = torch.randint(0, llama.args.vocab_size, (len(lengths),), generator=g)
    return ctx, cpos, clen, anchors, torch.tensor(lengths)


def test_config_validation_and_json(target):
    cfg = make_config(target)
    assert DrafterConfig.from_json(cfg.to_json()) == cfg
    for field, value, words in [("block_size", 0, "block_size"),
                                ("markov_rank", -1, "markov_rank"),
                                ("target_layer_ids", (1, 3), "final layer"),
                                ("target_layer_ids", (7,), "out of range"),
                                ("mask_token_id", 97, "mask_token_id"),
                                ("hidden_size", 32, "hidden_size")]:
        with pytest.raises(ValueError, match=words):
            replace(cfg, **{field: value})
    with pytest.raises(ValueError, match="unknown fields"):
        DrafterConfig.from_json(json.dumps(dict(json.loads(cfg.to_json()), bogus=1)))


def test_window_and_causality_masking(target):
    dr = make_drafter(target)
    ctx, cpos, clen, anchors, apos = batch(target, lengths=(11,))
    h0 = dr.backbone(ctx, cpos, clen, anchors, apos)
    for row, inside in [(1, False), (2, False), (3, True), (10, True)]:  # window = pos 3..10
        c2 = ctx.clone()
        c2[0, row] += 1.0
        h = dr.backbone(c2, cpos, clen, anchors, apos)
        assert torch.equal(h, h0) != inside, f"row {row}"
    # a stale row at/after the anchor position is never attended to
    p2 = cpos.clone()
    p2[0, 10] = 11
    c2 = ctx.clone()
    c2[0, 10] += 1.0
    torch.testing.assert_close(dr.backbone(c2, p2, clen, anchors, apos),
                               dr.backbone(ctx, p2, clen, anchors, apos))


def test_block_is_bidirectional(target):
    dr = make_drafter(target)
    args = batch(target, lengths=(6,))
    h0 = dr.backbone(*args)
    with torch.no_grad():
        dr.mask_embed.add_(1.0)  # changes slots 1..K-1 only as inputs
    h1 = dr.backbone(*args)
    assert all(not torch.allclose(h0[0, s], h1[0, s]) for s in range(K))  # slot 0 too
    ctx, cpos, clen, anchors, apos = args
    h2 = dr.backbone(ctx, cpos, clen, (anchors + 1) % 97, apos)  # the anchor: every slot
    assert all(not torch.allclose(h1[0, s], h2[0, s]) for s in range(K))


def test_padding_batch_equals_each_alone(target):
    dr = make_drafter(target)
    ctx, cpos, clen, anchors, apos = batch(target, lengths=(11, 3))
    ctx[1, 3:] = 100.0  # garbage in the padding
    both = dr.draft(ctx, cpos, clen, anchors, apos, temperature=1.0, return_dists=True,
                    generator=torch.Generator().manual_seed(0))
    h_both = dr.backbone(ctx, cpos, clen, anchors, apos)
    for i in range(2):
        n = int(clen[i])
        sl = slice(i, i + 1)
        h = dr.backbone(ctx[sl, :n], cpos[sl, :n], clen[sl], anchors[sl], apos[sl])
        torch.testing.assert_close(h_both[i], h[0], atol=1e-5, rtol=1e-5)
        g = dr.draft(ctx[sl, :n], cpos[sl, :n], clen[sl], anchors[sl], apos[sl])
        assert g.tokens.shape == (1, K)
    assert both.dists.shape == (2, K, 97)


def test_greedy_markov_drafting_equals_teacher_forcing(target):
    dr = make_drafter(target)
    args = batch(target)
    out = dr.draft(*args)
    base = dr.base_logits(dr.backbone(*args))
    prev = torch.cat([args[3].unsqueeze(1), out.tokens[:, :-1]], 1)
    tf = dr.corrected_logits(base, prev)
    assert torch.equal(tf.argmax(-1), out.tokens)
    assert torch.equal(out.probs, torch.ones_like(out.probs))  # temp 0: one-hot p_k
    assert not torch.equal(tf, base)  # the Markov head is live
    # sampled: the draft distribution is exactly softmax of the teacher-forced logits
    s = dr.draft(*args, temperature=1.0, return_dists=True,
                 generator=torch.Generator().manual_seed(3))
    prev = torch.cat([args[3].unsqueeze(1), s.tokens[:, :-1]], 1)
    torch.testing.assert_close(s.dists, torch.softmax(dr.corrected_logits(base, prev), -1))
    torch.testing.assert_close(s.probs, s.dists.gather(2, s.tokens.unsqueeze(2)).squeeze(2))


def test_rank_zero_is_plain_backbone(target):
    dr = make_drafter(target, markov_rank=0)
    args = batch(target)
    base = dr.base_logits(dr.backbone(*args))
    assert dr.corrected_logits(base, torch.zeros_like(base[..., 0], dtype=torch.long)) is base
    s = dr.draft(*args, temperature=0.7, return_dists=True,
                 generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(s.dists, torch.softmax(base / 0.7, -1))
    assert torch.equal(dr.draft(*args).tokens, base.argmax(-1))
    assert dr.conf_w.shape == (1, target.args.hidden_size)


def test_confidence_in_open_unit_interval_and_sampling_reproducible(target):
    dr = make_drafter(target)
    args = batch(target)
    runs = [dr.draft(*args, temperature=1.0, generator=torch.Generator().manual_seed(s))
            for s in (5, 5, 6, 7, 8)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert torch.equal(runs[0].probs, runs[1].probs)
    assert any(not torch.equal(runs[0].tokens, r.tokens) for r in runs[2:])
    c = runs[0].confidences
    assert c.shape == (2, K) and bool(((c > 0) & (c < 1)).all())
    assert len({round(v, 6) for v in c.flatten().tolist()}) > 1


def test_bf16_drafting(target):
    dr = make_drafter(target)
    args = batch(target)
    ref = dr.draft(*args)
    emb16 = target.embed.to(torch.bfloat16)
    dr16 = dr.to(torch.bfloat16).bind_target(emb16, target.lm_head.to(torch.bfloat16))
    out = dr16.draft(*args)
    assert out.tokens.shape == (2, K) and out.probs.dtype == torch.float32
    assert bool(((out.confidences > 0) & (out.confidences < 1)).all())
    assert (out.tokens == ref.tokens).float().mean() >= 0.5  # bf16 rounding may flip a few
    torch.testing.assert_close(out.confidences, ref.confidences, atol=0.05, rtol=0)


def test_loss_overfits_one_batch(target):
    dr = make_drafter(target, markov_rank=4)
    dr.init_from_target(target)
    # default: the target's last N = 2 layers (2, 3), its final norm and MASK row
    torch.testing.assert_close(dr.layers[0].w13, target.layers[2]["w13"])
    torch.testing.assert_close(dr.layers[1].wqkv, target.layers[3]["wqkv"])
    torch.testing.assert_close(dr.mask_embed, target.embed[dr.config.mask_token_id])
    ctx, cpos, clen, anchors, apos = batch(target, lengths=(11, 5, 9))
    g = torch.Generator().manual_seed(4)
    labels = torch.randint(0, 97, (3, K), generator=g)
    p_t = torch.full((3, K, 97), 0.1 / 96).scatter_(2, labels.unsqueeze(2), 0.9)
    live = torch.ones(3, K, dtype=torch.bool)
    live[1, 2:] = False  # past the end of request 1
    opt = torch.optim.AdamW(dr.parameters(), lr=3e-3)
    losses = []
    for _ in range(100):
        total, parts = dr.loss(ctx, cpos, clen, anchors, apos, labels, p_t, live)
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(dr.parameters(), 1.0)
        opt.step()
        losses.append(total.item())
    assert set(parts) == {"ce", "l1", "bce"}
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    # masked slots do not contribute
    l2 = labels.clone()
    l2[1, 2:] = (l2[1, 2:] + 1) % 97
    torch.testing.assert_close(dr.loss(ctx, cpos, clen, anchors, apos, l2, p_t, live)[0],
                               dr.loss(ctx, cpos, clen, anchors, apos, labels, p_t, live)[0])


def target_info(llama, **kw):
    a = llama.args
    return dict(dict(model_id="tiny-llama", vocab_size=a.vocab_size, hidden_size=a.hidden_size,
                     num_layers=a.num_layers, dtype=torch.float32, device="cpu"), **kw)


def test_checkpoint_round_trip(target, tmp_path):
    dr = make_drafter(target)
    save_drafter(tmp_path, dr, dr.config)
    names = set(json.loads((tmp_path / CONFIG_FILE).read_text()))
    assert {"block_size", "target_layer_ids", "mask_token_id", "markov_rank",
            "context_window", "num_draft_layers", "target_model_id"} <= names
    from safetensors import safe_open
    with safe_open(str(tmp_path / WEIGHTS_FILE), framework="pt") as f:
        assert not any("embed" == k or "lm_head" in k for k in f.keys())
    back = load_drafter(tmp_path, target_info(target, max_block_size=K)).bind_llama(target)
    assert back.config == dr.config
    args = batch(target)
    a, b = dr.draft(*args), back.draft(*args)
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.confidences, b.confidences)


def _edit_config(path, **kw):
    cfg = json.loads((path / CONFIG_FILE).read_text())
    cfg.update(kw)
    (path / CONFIG_FILE).write_text(json.dumps(cfg))


def _edit_tensors(path, fn):
    from safetensors.torch import load_file, save_file
    t = load_file(str(path / WEIGHTS_FILE))
    fn(t)
    save_file(t, str(path / WEIGHTS_FILE))


@pytest.mark.parametrize("case, pattern", [
    ("vocab", r"vocab_size 97 != target vocab_size 98"),
    ("hidden", r"hidden_size 64 != target hidden_size 32"),
    ("model_id", r"trained for target 'tiny-llama', not 'other'"),
    ("tap_final", r"tap layer 3 is the target's final layer"),
    ("tap_range", r"tap layer 5 is out of range"),
    ("k_too_large", r"K=8 exceeds .* block_size=4"),
    ("missing", r"missing tensor 'layers.1.w2'"),
    ("misshapen", r"'fc' has shape \[64, 100\], expected \[64, 192\]"),
    ("truncated", r"drafter.safetensors: corrupt or truncated"),
])
def test_load_validation_errors(target, tmp_path, case, pattern):
    dr = make_drafter(target)
    save_drafter(tmp_path, dr)
    info = target_info(target)
    if case == "vocab":
        info["vocab_size"] = 98
    elif case == "hidden":
        info["hidden_size"] = 32
    elif case == "model_id":
        info["model_id"] = "other"
    elif case == "tap_final":  # trained on a 6-layer target; layer 3 is final for ours
        _edit_config(tmp_path, target_layer_ids=[1, 3], target_num_layers=6)
    elif case == "tap_range":
        _edit_config(tmp_path, target_layer_ids=[1, 5], target_num_layers=8)
    elif case == "k_too_large":
        info["max_block_size"] = 8
    elif case == "missing":
        _edit_tensors(tmp_path, lambda t: t.pop("layers.1.w2"))
    elif case == "misshapen":
        _edit_tensors(tmp_path, lambda t: t.__setitem__("fc", torch.zeros(64, 100)))
    elif case == "truncated":
        data = (tmp_path / WEIGHTS_FILE).read_bytes()
        (tmp_path / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=pattern):
        load_drafter(tmp_path, info)


# ---- shared-context training path and pruned draft vocabulary ---------------------------
def test_shared_context_backbone_equals_per_anchor_windows(target):
    """backbone_shared (context fused once per sequence) == backbone on each window."""
    dr = make_drafter(target)
    g = torch.Generator().manual_seed(5)
    n = 20
    taps = torch.randn(n, 3 * target.args.hidden_size, generator=g)
    aps = torch.tensor([1, 4, 9, 15, 19])  # windows partly before position 0, full, ...
    toks = torch.randint(0, 97, (len(aps),), generator=g)
    shared = dr.backbone_shared(taps, toks, aps)
    rows = [taps[max(0, p - W):p] for p in aps.tolist()]
    pos = [torch.arange(max(0, p - W), p) for p in aps.tolist()]
    ctx, cpos, clen = pad_context(rows, pos)
    each = dr.backbone(ctx, cpos, clen, toks, aps)
    torch.testing.assert_close(shared, each, atol=2e-5, rtol=2e-5)
    # and gradients flow through the shared path to the fusion weights
    shared.sum().backward()
    assert dr.fc.grad is not None and dr.fc.grad.abs().sum() > 0


def test_pruned_draft_vocabulary(target, tmp_path):
    vocab = [5, 9, 2, 40, 41, 60, 61, 62, 70, 80, 90, 96]
    dr = make_drafter(target, draft_vocab_size=len(vocab))
    dr.set_draft_vocab(vocab)
    dr.bind_llama(target)  # re-bind: the head is the draft rows of the target's
    args = batch(target)
    out = dr.draft(*args, return_dists=True)
    assert set(out.tokens.flatten().tolist()) <= set(vocab)
    assert out.dists.shape == (2, K, 97)
    off = [t for t in range(97) if t not in vocab]
    assert float(out.dists[..., off].abs().sum()) == 0.0
    # the draft head's logits are the target head's rows of those tokens
    h = dr.backbone(*args)
    full = h @ target.lm_head.T
    torch.testing.assert_close(dr.base_logits(h), full[..., vocab])
    # loss: a label outside the draft vocab gets no CE, and p_t's mass off the vocab
    # counts in the L1 distance
    labels = torch.tensor([[5, 9, 2, 40], [1, 3, 4, 6]])  # row 1: nothing draftable
    tp = torch.softmax(torch.randn(2, K, 97), -1)
    total, parts = dr.loss(*args, labels=labels, target_probs=tp)
    assert torch.isfinite(total)
    pd, outside = dr.restrict_probs(tp)
    torch.testing.assert_close(outside, tp[..., off].sum(-1))
    assert float(parts["l1"]) >= float(outside.mean()) - 1e-6
    # round trip keeps the vocabulary
    save_drafter(tmp_path, dr)
    back = load_drafter(tmp_path, target_info(target)).bind_llama(target)
    assert back.draft_vocab.tolist() == vocab
    assert torch.equal(back.draft(*args).tokens, out.tokens)
    with pytest.raises(ValueError, match="distinct"):
        dr.set_draft_vocab([1] * len(vocab))


@pytest.mark.parametrize("packing", ["onednn", "native"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_packed_drafting_matches_plain(target, dtype, packing):
    """pack_for_inference (serving only: oneDNN-packed weights, or the native
    linear with its RMSNorm / SwiGLU product and the one-call Markov loop)
    drafts like the plain module of the same dtype."""
    from dspark.worker.model import native_attention
    from dspark.worker.model.llama import use_packed_linear
    from dspark.worker.model.native_linear import Bf16Linear, RowsLinear

    dr = make_drafter(target).to(dtype)
    dr.bind_target(target.embed.to(dtype), target.lm_head.to(dtype))
    pack = None
    if packing == "onednn" and not use_packed_linear(dr.fc):
        pytest.skip(f"no oneDNN {dtype} packed linear on this CPU")
    if packing == "native":
        ext = native_attention.load(build=True)
        if ext is None:
            pytest.skip(f"native kernels unavailable: {native_attention.unavailable_reason()}")
        if dtype == torch.bfloat16 and not ext.has_linear_bf16():
            pytest.skip("this CPU has no AVX512-BF16: no native bf16 linear")
        lin = Bf16Linear(ext) if dtype == torch.bfloat16 else RowsLinear(ext)
        pack = (lin.pack, lin)
    args = batch(target)
    ctx = args[0].to(dtype)
    plain = dr.draft(ctx, *args[1:])
    h_plain = dr.backbone(ctx, *args[1:])
    assert dr.pack_for_inference(pack)
    packed = dr.draft(ctx, *args[1:])
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(dr.backbone(ctx, *args[1:]), h_plain, atol=tol, rtol=tol)
    torch.testing.assert_close(packed.confidences, plain.confidences, atol=tol, rtol=tol)
    assert (packed.tokens == plain.tokens).float().mean() >= (0.9 if dtype == torch.bfloat16
                                                              else 1.0)
