"""The native linear kernels (native/linear_rows.cpp fp32, native/linear_bf16.cpp
bf16 on AVX512-BF16) against the float product, and how a worker chooses them.

Kernel tests skip, with the reason, where the native kernels cannot be built
(no C++ compiler).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SeqStep, StepPlan
from dspark.worker.model import native_attention, native_linear
from dspark.worker.runner import ModelRunner

EXT = native_attention.load(build=True)
needs_ext = pytest.mark.skipif(
    EXT is None, reason=f"native kernels unavailable: {native_attention.unavailable_reason()}")
CPU = torch.device("cpu")


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@needs_ext
@pytest.mark.parametrize("n,k", [(40, 24), (16, 8), (49, 37), (3072, 576), (5, 1536)])
@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 8, 13, 64])
def test_matches_f_linear(m, n, k):
    """Every row count, outputs that do not fill a 16-wide unit (n = 49, 5), and
    a k that is not a multiple of the 8 lanes (37): equal to F.linear to fp32
    rounding."""
    lin = native_linear.RowsLinear(EXT)
    w, x = _rand(n, k, seed=1), _rand(m, k, seed=2)
    got = lin(x, lin.pack(w))
    assert got.shape == (m, n)
    torch.testing.assert_close(got, F.linear(x, w), atol=1e-4 * k ** 0.5, rtol=1e-4)


@needs_ext
def test_row_results_do_not_depend_on_the_batch():
    """A row's outputs are bit for bit the same alone, in any slice of the batch
    and at any offset in it (the property that makes a verify window's rows equal
    the same rows decoded one at a time)."""
    lin = native_linear.RowsLinear(EXT)
    w = lin.pack(_rand(100, 72, seed=3))
    x = _rand(40, 72, seed=4)
    full = lin(x, w)
    for i in range(40):
        assert torch.equal(lin(x[i:i + 1], w), full[i:i + 1])
    for a, b in ((3, 11), (0, 8), (7, 40), (13, 19)):
        assert torch.equal(lin(x[a:b], w), full[a:b])


@needs_ext
def test_any_rank_and_dtype_of_x():
    """x [..., k] of any rank comes back [..., n]; a bf16 x is computed in fp32
    and returned in bf16."""
    lin = native_linear.RowsLinear(EXT)
    w = _rand(24, 16, seed=5)
    pw = lin.pack(w)
    assert pw.shape == (24, 16)
    x = _rand(2, 3, 16, seed=6)
    torch.testing.assert_close(lin(x, pw), F.linear(x, w), atol=1e-5, rtol=1e-5)
    xb = x.bfloat16()
    got = lin(xb, pw)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.linear(xb.float(), w).bfloat16())
    assert lin(_rand(0, 16), pw).shape == (0, 24)


@needs_ext
def test_kernel_refuses_bad_inputs():
    lin = native_linear.RowsLinear(EXT)
    pw = lin.pack(_rand(24, 16))
    with pytest.raises(RuntimeError, match="columns"):
        EXT.linear_rows(_rand(2, 15), pw.wp, 24)
    with pytest.raises(RuntimeError, match="N=40"):
        EXT.linear_rows(_rand(2, 16), pw.wp, 40)
    with pytest.raises(RuntimeError, match="float32"):
        EXT.linear_rows(_rand(2, 16).double(), pw.wp, 24)


HAS_BF16 = EXT is not None and EXT.has_linear_bf16()
needs_bf16 = pytest.mark.skipif(
    not HAS_BF16, reason="no native bf16 linear: " + (
        "this CPU has no AVX512-BF16" if EXT is not None
        else f"native kernels unavailable: {native_attention.unavailable_reason()}"))


@needs_bf16
@pytest.mark.parametrize("n,k", [(40, 24), (49, 38), (5, 1536), (3072, 576), (576, 1536),
                                 (33, 37)])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 9, 13, 64])
def test_bf16_matches_the_float_product(m, n, k):
    """The AVX512-BF16 kernel: every row count (its microkernels take 1-8 rows),
    outputs that do not fill a 16-wide unit, an odd k (a zero pair is padded):
    the float product of the bf16 operands, rounded to bf16 once (to within
    one bf16 step: the sums run in another order than the reference's)."""
    lin = native_linear.Bf16Linear(EXT)
    w, x = _rand(n, k, seed=1).bfloat16(), _rand(m, k, seed=2).bfloat16()
    got = lin(x, lin.pack(w))
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    ref = x.float() @ w.float().T
    torch.testing.assert_close(got.float(), ref, atol=2e-4 * k ** 0.5, rtol=2 ** -7)


@needs_bf16
def test_bf16_row_results_do_not_depend_on_the_batch():
    """At the default model's shapes (the 1536-wide down projection is one that
    oneDNN's bf16 GEMM computes differently for 1 and 8 rows), a row's outputs
    are the same bits alone, in any slice of the batch and at any offset."""
    lin = native_linear.Bf16Linear(EXT)
    for n, k in ((576, 1536), (3072, 576), (49152, 576)):
        w = lin.pack((_rand(n, k, seed=3) * 0.05).bfloat16())
        x = _rand(24, k, seed=4).bfloat16()
        full = lin(x, w)
        for i in range(24):
            assert torch.equal(lin(x[i:i + 1], w), full[i:i + 1])
        for a, b in ((3, 11), (0, 8), (7, 24), (13, 19)):
            assert torch.equal(lin(x[a:b], w), full[a:b])


@needs_bf16
def test_bf16_kernel_refuses_bad_inputs():
    lin = native_linear.Bf16Linear(EXT)
    pw = lin.pack(_rand(24, 16).bfloat16())
    assert pw.shape == (24, 16)
    with pytest.raises(RuntimeError, match="columns"):
        EXT.linear_bf16(_rand(2, 14).bfloat16(), pw.wp, 24)
    with pytest.raises(RuntimeError, match="N=40"):
        EXT.linear_bf16(_rand(2, 16).bfloat16(), pw.wp, 40)
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        EXT.linear_bf16(_rand(2, 16), pw.wp, 24)
    with pytest.raises(RuntimeError, match="odd"):
        EXT.pack_bf16_weight(_rand(4, 15).bfloat16())
    # x of any rank and dtype: computed in bf16, returned in x's dtype
    x = _rand(2, 3, 16, seed=6)
    got = lin(x, pw)
    assert got.shape == (2, 3, 24) and got.dtype == torch.float32
    assert lin(_rand(0, 16).bfloat16(), pw).shape == (0, 24)


def test_resolve_choices():
    """torch: never; auto: the fp32 kernel for fp32 on CPU, the bf16 one for bf16
    on a CPU with AVX512-BF16, else None without an error; native: a start-up
    error that names why; anything else: an error naming the field."""
    assert native_linear.resolve("torch", CPU, torch.float32) is None
    assert native_linear.resolve("torch", CPU, torch.bfloat16) is None
    assert native_linear.resolve("auto", torch.device("cuda"), torch.float32) is None
    assert native_linear.resolve("auto", CPU, torch.float16) is None
    with pytest.raises(ValueError, match="linear='native' is unavailable: .*float16"):
        native_linear.resolve("native", CPU, torch.float16)
    if HAS_BF16:
        assert isinstance(native_linear.resolve("auto", CPU, torch.bfloat16),
                          native_linear.Bf16Linear)
        assert isinstance(native_linear.resolve("native", CPU, torch.bfloat16),
                          native_linear.Bf16Linear)
    elif EXT is not None:
        assert native_linear.resolve("auto", CPU, torch.bfloat16) is None
        with pytest.raises(ValueError, match="linear='native' is unavailable: .*AVX512-BF16"):
            native_linear.resolve("native", CPU, torch.bfloat16)
    with pytest.raises(ValueError, match="device is cuda"):
        native_linear.resolve("native", torch.device("cuda"), torch.float32)
    with pytest.raises(ValueError, match="linear='fast' is invalid"):
        native_linear.resolve("fast", CPU, torch.float32)
    with pytest.raises(ValueError, match="linear"):
        WorkerConfig(linear="fast")
    if EXT is not None:
        assert isinstance(native_linear.resolve("auto", CPU, torch.float32),
                          native_linear.RowsLinear)


@needs_ext
def test_float32_worker_serves_on_the_native_linear(tiny_model_dir):
    """An fp32 CPU worker (``--linear auto``, kernels built) packs its layers and
    head for the native kernel and, given a drafter, the drafter's too; its
    logits (RoPE from the native row ops as well) equal the oneDNN worker's to
    rounding and it picks the same tokens;
    a bf16 worker keeps oneDNN."""
    from dspark.worker.model.llama import packed_linear, use_packed_linear

    def runner(dtype, linear):
        return ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype=dtype, block_size=8,
                                        num_kv_blocks=16, tap_layer_ids=(), linear=linear))

    nat, ref = runner("float32", "auto"), runner("float32", "torch")
    assert isinstance(nat.model.linear, native_linear.RowsLinear)
    assert isinstance(nat.model.lm_head, native_linear.RowsWeight)
    assert nat.model.packing[1] is nat.model.linear
    assert nat.model.rope is not None and ref.model.rope is None  # RoPE native too
    assert not isinstance(ref.model.linear, native_linear.RowsLinear)
    toks = [int(t) for t in _rand(20, seed=7).abs().mul(30).long() % 97]
    logits = {}
    for name, r in (("native", nat), ("ref", ref)):
        orig = r.model.forward
        r.model.forward = lambda *a, _o=orig, _n=name, **k: logits.setdefault(
            _n, []).append(_o(*a, **k)) or logits[_n][-1]
        outs = [r.step(StepPlan(0, [SeqStep("q", toks[:12], 0, [0, 1], sample=True)]))]
        for i in range(12, 20):  # then one row at a time
            outs.append(r.step(StepPlan(i, [SeqStep("q", toks[i:i + 1], i, [0, 1, 2],
                                                    sample=True)])))
        logits[name + "_tokens"] = [o.outputs[0].token_id for o in outs]
    for a, b in zip(logits["native"], logits["ref"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert logits["native_tokens"] == logits["ref_tokens"]
    bf = runner("bfloat16", "auto")
    assert not isinstance(bf.model.linear, native_linear.RowsLinear)
    if HAS_BF16:  # the bf16 kernel, for every step (no fp32 prefill layers)
        assert isinstance(bf.model.linear, native_linear.Bf16Linear)
        assert bf.model.wide_layers is None
    elif use_packed_linear(bf.model.embed):
        assert bf.model.linear is packed_linear
    bt = runner("bfloat16", "torch")
    assert not isinstance(bt.model.linear, (native_linear.RowsLinear, native_linear.Bf16Linear))


@needs_ext
@pytest.mark.parametrize("draft_vocab", [0, 41])
def test_drafter_packs_like_its_target(target, draft_vocab):
    """bind_llama + pack_for_inference on a natively packed target: the drafter's
    layers, fusion, Markov W2 and (pruned) head use the native kernel and draft
    what the plain module drafts."""
    from dspark.worker.model.llama import Llama

    from .test_drafter import batch, make_drafter

    lin = native_linear.RowsLinear(EXT)
    weights = {"embed": target.embed, "norm": target.norm}
    for i, w in enumerate(target.layers):
        weights.update({f"{i}.{k}": v for k, v in w.items()})
    if target.lm_head is not target.embed:
        weights["lm_head"] = target.lm_head
    served = Llama(target.args, weights, 64, pack=True, rows_linear=lin)
    dr = make_drafter(target, **({"draft_vocab_size": draft_vocab} if draft_vocab else {}))
    if draft_vocab:  # a pruned head: 41 rows (not a multiple of the kernel's 16)
        dr.set_draft_vocab(torch.randperm(97, generator=torch.Generator().manual_seed(0))
                           [:draft_vocab].sort().values)
    dr.bind_llama(target)
    args = batch(target)
    plain = dr.draft(*args)
    dr.bind_llama(served)
    assert dr.pack_for_inference()
    assert dr._packed_linear is lin and isinstance(dr._packed_fc, native_linear.RowsWeight)
    assert isinstance(dr._lm_head, native_linear.RowsWeight)
    assert dr._lm_head.shape == (draft_vocab or 97, target.args.hidden_size)
    got = dr.draft(*args)
    torch.testing.assert_close(got.confidences, plain.confidences, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.tokens, plain.tokens)


@needs_ext
@pytest.mark.parametrize("t,d", [(1, 576), (8, 64), (33, 37), (300, 576)])
def test_row_ops_match_pytorch(t, d):
    """RMSNorm and the SwiGLU product (native/row_ops.cpp) equal PyTorch's to
    fp32 rounding, for widths that are not a multiple of the 8 lanes and for
    gates far out in both tails (exp clamped, no inf or nan)."""
    lin = native_linear.RowsLinear(EXT)
    x, w = _rand(t, d, seed=8) * 3, 1 + _rand(d, seed=9) * 0.1
    torch.testing.assert_close(lin.rms_norm(x, w, 1e-5), F.rms_norm(x, (d,), w, 1e-5),
                               atol=1e-5, rtol=1e-5)
    gu = _rand(t, 2 * d, seed=10) * 4
    gu[0, :4] = torch.tensor([-200.0, -90.0, 90.0, 200.0])
    gate, up = gu.chunk(2, dim=-1)
    got = lin.silu_mul(gu)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, F.silu(gate) * up, atol=1e-5, rtol=1e-5)
    # each row on its own: the same bits alone as in the batch
    assert torch.equal(lin.rms_norm(x[t // 2:t // 2 + 1], w, 1e-5),
                       lin.rms_norm(x, w, 1e-5)[t // 2:t // 2 + 1])
    assert torch.equal(lin.silu_mul(gu[-1:]), got[-1:])


@needs_ext
@pytest.mark.parametrize("t,d", [(1, 576), (8, 64), (33, 37), (300, 576)])
def test_bf16_row_ops_match_pytorch(t, d):
    """RMSNorm and the SwiGLU product in bf16 (the native bf16 worker's): the
    float result rounded once, so within one bf16 step of PyTorch's (which rounds
    between its ops); NaN stays NaN, the exp tails stay finite; rows on their own."""
    lin = native_linear.Bf16Linear(EXT)
    x, w = (_rand(t, d, seed=8) * 3).bfloat16(), (1 + _rand(d, seed=9) * 0.1).bfloat16()
    ref = F.rms_norm(x.float(), (d,), w.float(), 1e-5)
    got = lin.rms_norm(x, w, 1e-5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, atol=1e-2, rtol=2 ** -8)
    assert (got.float() - ref).abs().max() <= (ref.abs() * 2 ** -8).max()
    gu = (_rand(t, 2 * d, seed=10) * 4).bfloat16()
    gu[0, :4] = torch.tensor([-200.0, -90.0, 90.0, 200.0])
    gate, up = gu.float().chunk(2, dim=-1)
    out = lin.silu_mul(gu)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), F.silu(gate) * up, atol=1e-2, rtol=2 ** -8)
    assert torch.equal(lin.rms_norm(x[t // 2:t // 2 + 1], w, 1e-5), got[t // 2:t // 2 + 1])
    assert torch.equal(lin.silu_mul(gu[-1:]), out[-1:])
    nan = x.clone()
    nan[0, 0] = float("nan")
    assert torch.isnan(lin.rms_norm(nan, w, 1e-5)[0]).all()
    with pytest.raises(RuntimeError, match="x and w alike"):
        EXT.rms_norm_rows(x, w.float(), 1e-5)


@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,heads,hd,width", [(1, 12, 64, 960), (8, 12, 64, 960),
                                              (5, 3, 16, 80), (3, 2, 12, 30)])
def test_rope_rows_equal_the_pytorch_ops(dtype, t, heads, hd, width):
    """The native RoPE of the query and key heads (llama.py's forward with the
    native linear): bit for bit the values of mul + roll + addcmul, from the
    first heads of a wider qkv row (the V columns untouched), at real positions
    of the model's tables; rows on their own."""
    from dspark.worker.model.llama import LlamaArgs, rope_inv_freq

    g = torch.Generator().manual_seed(21)
    qkv = (torch.randn(t, width, generator=g) * 3).to(dtype)
    args = LlamaArgs(vocab_size=8, hidden_size=hd, intermediate_size=8, num_layers=1,
                     num_heads=1, num_kv_heads=1, head_dim=hd, rms_norm_eps=1e-5,
                     rope_theta=10000.0, max_position_embeddings=4096,
                     tie_word_embeddings=True)
    pos = torch.randint(0, 4000, (t,), generator=g)
    freqs = torch.outer(pos.float(), rope_inv_freq(args))
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(dtype), emb.sin()
    sin_signed = torch.cat([-sin[:, :hd // 2], sin[:, hd // 2:]], -1).to(dtype)
    qk = qkv[:, :heads * hd].view(t, heads, hd)
    ref = torch.addcmul(qk * cos[:, None], qk.roll(hd // 2, -1), sin_signed[:, None])
    lin = native_linear.Bf16Linear(EXT) if dtype == torch.bfloat16 else \
        native_linear.RowsLinear(EXT)
    got = lin.rope(qkv, cos, sin_signed, heads)
    assert got.shape == (t, heads, hd) and got.dtype == dtype
    assert torch.equal(got, ref)
    assert torch.equal(lin.rope(qkv[-1:], cos[-1:], sin_signed[-1:], heads), got[-1:])
    with pytest.raises(RuntimeError, match="heads \\* hd <= W"):
        lin.rope(qkv, cos, sin_signed, width // hd + 1)
    with pytest.raises(RuntimeError, match="one dtype"):
        lin.rope(qkv, cos.double(), sin_signed, heads)
