"""The native fp32 linear over GGUF blocks (native/linear_gguf.cpp): the dense
fp32 result bit for bit, and models that load their matrices that way.

Kernel tests skip, with the reason, where the native kernels cannot be built
(no C++ compiler).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dspark.shared.config import WorkerConfig
from dspark.worker.model import native_attention, native_linear
from dspark.worker.model.kv_cache import PagedKVCache, build_metadata
from dspark.worker.model.gguf_blocks import GGUF_BLOCKS
from dspark.worker.model.llama import load_llama
from dspark.worker.model.native_linear import (GGUF_KINDS, dequantize_gguf, gguf_kind,
                                               pack_gguf, random_gguf_blocks)

from .conftest import TINY

EXT = native_attention.load(build=True)
needs_ext = pytest.mark.skipif(
    EXT is None, reason=f"native kernels unavailable: {native_attention.unavailable_reason()}")
CPU = torch.device("cpu")
Q4_1, Q8_0 = gguf_kind("q4_1"), gguf_kind("q8_0")


def random_blocks(kind: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    return random_gguf_blocks(kind, n, k, seed)


def test_dequantize_matches_the_gguf_package():
    """dequantize_gguf (the load-time check's reference) computes what the model's
    conversion computes with the gguf package, bit for bit."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    for kind, qt in ((Q4_1, GGMLQuantizationType.Q4_1), (Q8_0, GGMLQuantizationType.Q8_0)):
        raw = random_blocks(kind, 24, 96, seed=kind)
        ref = dequantize(raw.numpy(), qt).reshape(24, 96).astype(np.float32)
        assert torch.equal(dequantize_gguf(raw, kind), torch.from_numpy(ref))


@needs_ext
@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize("n,k", [(40, 64), (16, 32), (5, 576), (49, 96)])
def test_packed_weight_holds_the_dequantized_values(kind, n, k):
    """Packed and read back by the kernel's own dequantization: the float32
    matrix, element for element (outputs that do not fill a 16-wide unit too)."""
    lin = native_linear.RowsLinear(EXT)
    raw = random_blocks(kind, n, k, seed=n + k)
    w = lin.pack_gguf(raw, kind)
    assert w.shape == (n, k)
    assert torch.equal(lin.unpack(w), dequantize_gguf(raw, kind))


@needs_ext
@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 13, 64])
def test_linear_equals_the_dense_kernel_bit_for_bit(kind, m):
    """Every row count (registers up to 8 rows, the buffer beyond), partial
    units: the dense fp32 kernel's outputs exactly, and F.linear's to rounding."""
    lin = native_linear.RowsLinear(EXT)
    n, k = 49, 96
    raw = random_blocks(kind, n, k, seed=7)
    dense = dequantize_gguf(raw, kind)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = lin(x, lin.pack_gguf(raw, kind))
    assert got.shape == (m, n)
    assert torch.equal(got, lin(x, lin.pack(dense)))
    torch.testing.assert_close(got, F.linear(x, dense), atol=1e-4 * k ** 0.5, rtol=1e-4)


@needs_ext
def test_both_paths_and_every_batch_give_a_row_the_same_outputs():
    """A row's outputs do not depend on the batch it runs in, nor on which path
    (dequantized in registers, or into a buffer) the row count takes."""
    lin = native_linear.RowsLinear(EXT)
    w = lin.pack_gguf(random_blocks(Q4_1, 100, 64, seed=3), Q4_1)
    x = torch.randn(12, 64, generator=torch.Generator().manual_seed(4))
    alone = torch.cat([lin(x[i:i + 1], w) for i in range(12)])
    old = EXT.set_gguf_fused_rows(0)  # every row count through the buffer
    try:
        buffered = [lin(x[:m], w) for m in range(1, 13)]
    finally:
        EXT.set_gguf_fused_rows(old)
    for m in range(1, 13):
        assert torch.equal(lin(x[:m], w), alone[:m])
        assert torch.equal(buffered[m - 1], alone[:m])


@needs_ext
def test_shape_errors_name_what_is_wrong():
    lin = native_linear.RowsLinear(EXT)
    raw = random_blocks(Q4_1, 16, 64)
    with pytest.raises(ValueError, match="uint8 \\[n, blocks \\* 20\\]"):
        pack_gguf(raw[:, :30], Q4_1)
    with pytest.raises(ValueError, match="block type 'q5_k' is not supported"):
        gguf_kind("q5_k")
    w = lin.pack_gguf(raw, Q4_1)
    with pytest.raises(RuntimeError, match="K=32 needs"):
        EXT.linear_gguf(torch.zeros(1, 32), w.qp, 16, Q4_1)
    with pytest.raises(RuntimeError, match="kind=2 must be 0"):
        EXT.linear_gguf(torch.zeros(1, 64), w.qp, 16, 2)
    with pytest.raises(RuntimeError, match="N=17 does not match 1 units"):
        EXT.linear_gguf(torch.zeros(1, 64), w.qp, 17, Q4_1)


# ---- a model that computes from its blocks ---------------------------------------------

def write_gguf_llama(path, seed: int = 0, tied: bool = True):
    """A tiny Llama whose matrices are GGUF blocks (Q4_1, the embedding / head
    Q8_0): model.safetensors holds their dequantized values, GGUF_BLOCKS the
    blocks, as the default model's conversion writes them."""
    from safetensors.torch import save_file

    cfg = dict(TINY, model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu",
               tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)
    d, i, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    blocks, types, dense = {}, {}, {}

    def mat(name, n, k, kind=Q4_1):
        raw = random_blocks(kind, n, k, seed=seed + len(blocks))
        blocks[name], types[name] = raw, GGUF_KINDS[kind][0]
        dense[name] = dequantize_gguf(raw, kind)

    mat("model.embed_tokens.weight", cfg["vocab_size"], d, Q8_0)
    if not tied:
        mat("lm_head.weight", cfg["vocab_size"], d, Q8_0)
    dense["model.norm.weight"] = torch.ones(d)
    for li in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{li}."
        dense[p + "input_layernorm.weight"] = torch.ones(d)
        dense[p + "post_attention_layernorm.weight"] = torch.ones(d)
        for name, n, k in (("self_attn.q_proj", h * hd, d), ("self_attn.k_proj", kv * hd, d),
                           ("self_attn.v_proj", kv * hd, d), ("self_attn.o_proj", d, h * hd),
                           ("mlp.gate_proj", i, d), ("mlp.up_proj", i, d),
                           ("mlp.down_proj", d, i)):
            mat(p + name + ".weight", n, k)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(dense, str(path / "model.safetensors"))
    save_file(blocks, str(path / GGUF_BLOCKS), metadata={"gguf_types": json.dumps(types)})
    return path


@pytest.fixture(scope="module")
def gguf_model_dir(tmp_path_factory):
    return write_gguf_llama(tmp_path_factory.mktemp("gguf") / "tiny-gguf")


def _logits(model, tokens: list[int]) -> torch.Tensor:
    """Prefill of ``tokens`` and one decode row: the logits of every row."""
    a = model.args
    kv = PagedKVCache(a.num_layers, 8, 16, a.num_kv_heads, a.head_dim, torch.float32, CPU)
    out = []
    for start, ids in ((0, tokens[:-1]), (len(tokens) - 1, tokens[-1:])):
        meta = build_metadata([(start, len(ids), [0, 1])], 16, a.num_heads // a.num_kv_heads,
                              CPU, native=EXT)
        t = torch.tensor(ids)
        out.append(model.forward(t, meta, kv, torch.arange(len(ids))))
    return torch.cat(out)


@needs_ext
@pytest.mark.parametrize("tied", [True, False])
def test_model_on_blocks_computes_what_the_dense_model_computes(tmp_path, tied):
    """Every matrix (the fused QKV and gate/up, o, down, and the head) loads from
    its blocks, and the logits of a prefill and a decode step equal the dense
    fp32 model's bit for bit."""
    path = write_gguf_llama(tmp_path / "m", seed=5, tied=tied)
    lin = native_linear.RowsLinear(EXT)
    on = load_llama(path, torch.float32, CPU, 64, pack=True, rows_linear=lin,
                    gguf_weights="on")
    off = load_llama(path, torch.float32, CPU, 64, pack=True, rows_linear=lin,
                     gguf_weights="off")
    assert on.gguf_matrices == 4 * TINY["num_hidden_layers"] + 1
    assert off.gguf_matrices == 0
    tokens = [5, 17, 3, 88, 42, 9, 60]
    assert torch.equal(_logits(on, tokens), _logits(off, tokens))


@needs_ext
def test_auto_uses_blocks_only_where_they_can_be_used(gguf_model_dir, tiny_model_dir):
    lin = native_linear.RowsLinear(EXT)
    assert load_llama(gguf_model_dir, torch.float32, CPU, 64, pack=True, rows_linear=lin,
                      gguf_weights="auto").gguf_matrices == 17
    # no blocks file, no native linear, not packed: the dense weights
    assert load_llama(tiny_model_dir, torch.float32, CPU, 64, pack=True, rows_linear=lin,
                      gguf_weights="auto").gguf_matrices == 0
    assert load_llama(gguf_model_dir, torch.float32, CPU, 64, pack=True,
                      gguf_weights="auto").gguf_matrices == 0
    assert load_llama(gguf_model_dir, torch.float32, CPU, 64,
                      gguf_weights="auto").gguf_matrices == 0


@needs_ext
def test_on_without_blocks_or_kernel_is_a_clear_error(gguf_model_dir, tiny_model_dir):
    lin = native_linear.RowsLinear(EXT)
    with pytest.raises(ValueError, match=f"gguf_weights='on' is unavailable: .*no {GGUF_BLOCKS}"):
        load_llama(tiny_model_dir, torch.float32, CPU, 64, pack=True, rows_linear=lin,
                   gguf_weights="on")
    with pytest.raises(ValueError, match="gguf_weights='on' is unavailable: only the native fp32"):
        load_llama(gguf_model_dir, torch.float32, CPU, 64, pack=True, gguf_weights="on")
    with pytest.raises(ValueError, match="gguf_weights='maybe' is invalid"):
        load_llama(gguf_model_dir, torch.float32, CPU, 64, pack=True, rows_linear=lin,
                   gguf_weights="maybe")
    with pytest.raises(ValueError, match="gguf_weights"):
        WorkerConfig(gguf_weights="maybe")


@needs_ext
def test_stale_blocks_are_refused(tmp_path):
    """A blocks file that does not hold the model's weights (another conversion)
    is an error naming the matrix, never a silently different model."""
    from safetensors.torch import load_file, save_file

    path = write_gguf_llama(tmp_path / "m", seed=1)
    w = load_file(str(path / "model.safetensors"))
    w["model.layers.2.mlp.up_proj.weight"][0, 0] += 1.0
    save_file(w, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="does not match the model's weights "
                                         "\\(model.layers.2.mlp.gate_proj.weight, "
                                         "model.layers.2.mlp.up_proj.weight\\)"):
        load_llama(path, torch.float32, CPU, 64, pack=True,
                   rows_linear=native_linear.RowsLinear(EXT), gguf_weights="auto")


# ---- the default model -------------------------------------------------------------------

@pytest.mark.model
def test_default_model_blocks_hold_its_weights(default_model_dir):
    """The conversion keeps every Q4_1 / Q8_0 matrix's blocks (211: 7 a layer and
    the embedding), and they dequantize to the converted float32 weights exactly
    (the Q and K rows unpermuted like them)."""
    from safetensors import safe_open

    with safe_open(str(default_model_dir / GGUF_BLOCKS), framework="pt") as f, \
            safe_open(str(default_model_dir / "model.safetensors"), framework="pt") as g:
        types = json.loads(f.metadata()["gguf_types"])
        assert len(f.keys()) == 211 and types["model.embed_tokens.weight"] == "q8_0"
        for name in f.keys():
            assert torch.equal(dequantize_gguf(f.get_tensor(name), gguf_kind(types[name])),
                               g.get_tensor(name)), name


@pytest.mark.model
@needs_ext
def test_default_model_decodes_the_same_tokens_from_its_blocks(default_model_dir):
    """A worker's runner on the blocks (the default: auto) and one on the dense
    weights decode the same greedy tokens with the same logprobs."""
    from dspark.shared.types import SeqStep, StepPlan
    from dspark.worker.runner import ModelRunner

    def decode(gguf: str) -> tuple[int, list[tuple[int, float]]]:
        r = ModelRunner(WorkerConfig(model=str(default_model_dir), dtype="float32",
                                     num_kv_blocks=16, linear="native", gguf_weights=gguf,
                                     speculative_config='{"method": "dspark", '
                                                        '"num_speculative_tokens": 0}'))
        ids = [1, 504, 3458, 282, 4649, 314, 2, 28, 253]
        o = r.step(StepPlan(0, [SeqStep("a", ids, 0, [0, 1, 2], sample=True)])).outputs[0]
        out, pos = [(o.token_id, o.logprob)], len(ids)
        for step in range(1, 24):
            o = r.step(StepPlan(step, [SeqStep("a", [out[-1][0]], pos, [0, 1, 2],
                                               sample=True)])).outputs[0]
            out.append((o.token_id, o.logprob))
            pos += 1
        return r.model.gguf_matrices, out

    n_on, on = decode("auto")
    n_off, off = decode("off")
    assert (n_on, n_off) == (121, 0)
    assert on == off


def test_packed_bytes_and_the_bench_figure(gguf_model_dir):
    """packed_gguf_bytes is the packed tensor's size, and the bench's bytes read a
    step count the blocks' packed bytes instead of the matrices' float32 ones."""
    from dspark.shared.bench import weight_bytes_read
    from dspark.worker.model.native_linear import packed_gguf_bytes

    for kind in (Q4_1, Q8_0):
        for n, k in ((40, 64), (16, 96)):
            assert pack_gguf(random_blocks(kind, n, k), kind).numel() == \
                packed_gguf_bytes(n, k, kind)
    t = TINY
    d, i, hd = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    layer = [(t["num_attention_heads"] * hd, d), (t["num_key_value_heads"] * hd, d),
             (t["num_key_value_heads"] * hd, d), (d, t["num_attention_heads"] * hd),
             (i, d), (i, d), (d, i)]
    q4 = sum(packed_gguf_bytes(n, k, Q4_1) - 4 * n * k for n, k in layer)
    q8 = packed_gguf_bytes(t["vocab_size"], d, Q8_0) - 4 * t["vocab_size"] * d
    assert weight_bytes_read(gguf_model_dir, 10 ** 7, True) == \
        10 ** 7 + t["num_hidden_layers"] * q4 + q8
    assert weight_bytes_read(gguf_model_dir, 10 ** 7, False) == 10 ** 7
