"""A compact Llama-family decoder over a paged KV cache (no HF dependency).

RMSNorm, RoPE (plain or llama3-scaled), grouped-query attention, SwiGLU, tied
or untied LM head. Weights are fused at load time (QKV into one matrix, gate and
up into one) so a layer is three matmuls plus the down projection.

The forward takes one flattened token batch ``[T]`` (prefill chunks and decode
rows of many sequences, see ``kv_cache.AttnMetadata``), returns the final hidden
state only for the rows that need logits, and optionally the hidden states after
chosen layers ("tap rows").

Tap layer ``i`` means the residual stream after decoder layer ``i`` (0-based),
i.e. HF's ``hidden_states[i + 1]``; the final layer is not allowed.
References: Llama (Touvron et al. 2023), gpt-fast's model.py.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .gguf_blocks import gguf_blocks
from .kv_cache import AttnMetadata, PagedKVCache, paged_attention


@dataclass(frozen=True)
class LlamaArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_hf_config(cls, cfg: dict) -> LlamaArgs:
        mt = cfg.get("model_type", "llama")
        if mt not in ("llama", "mistral") or cfg.get("attention_bias") or cfg.get("mlp_bias") \
                or cfg.get("hidden_act", "silu") != "silu" or cfg.get("sliding_window"):
            raise ValueError(f"unsupported model: model_type={mt!r}, "
                             f"attention_bias={cfg.get('attention_bias')}, "
                             f"mlp_bias={cfg.get('mlp_bias')}, "
                             f"hidden_act={cfg.get('hidden_act')!r}, "
                             f"sliding_window={cfg.get('sliding_window')} "
                             "(only bias-free Llama-style checkpoints load)")
        n_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        scaling = cfg.get("rope_scaling")
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("llama3", "default"):
                raise ValueError(f"unsupported rope_scaling type {kind!r} "
                                 "(only llama3 scaling is implemented)")
        return cls(
            vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]), num_heads=n_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or hidden // n_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope_scaling=scaling, bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos)


def rope_inv_freq(args: LlamaArgs) -> torch.Tensor:
    """[hd/2] inverse frequencies, llama3 scaling applied when configured."""
    hd = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    sc = args.rope_scaling
    if sc and sc.get("rope_type", sc.get("type")) == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w, 1)


def packed_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def use_packed_linear(like: torch.Tensor) -> bool:
    """CPU with oneDNN, bf16 or fp32, and the packed kernel agrees with F.linear
    (bf16: bit for bit; fp32: to rounding, the summation order differs)."""
    if like.device.type != "cpu" or like.dtype not in (torch.bfloat16, torch.float32) or \
            not torch.backends.mkldnn.is_available():
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(24, 16, generator=g).to(like.dtype)
        x = torch.randn(3, 16, generator=g).to(like.dtype)
        got, want = packed_linear(x, pack_weight(w)), F.linear(x, w)
        if like.dtype == torch.bfloat16:
            return bool(torch.equal(got, want))
        return bool(torch.allclose(got, want, rtol=1e-5, atol=1e-5))
    except (RuntimeError, AttributeError):
        return False


# Steps with at least this many rows run their linears in fp32 when
# `wide_gemm_faster_in_fp32` found that faster at load (below it, the weight
# upcast costs more than the GEMM saves).
FP32_ROWS = 128


def fp32_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T computed in fp32 (w upcast per call), result in x's dtype."""
    return F.linear(x.float(), w.float()).to(x.dtype)


def wide_gemm_faster_in_fp32(w: torch.Tensor, rows: int = 256) -> bool:
    """Measure once at load: on CPUs without native bf16 GEMM kernels (AVX512-BF16
    without AMX, as on this project's machines) a prefill-sized bf16 GEMM is
    ~1.5x slower than the same GEMM in fp32, upcast included."""
    import time

    x = torch.randn(rows, w.shape[1], dtype=w.dtype)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(lambda: fp32_linear(x, w)) < 0.9 * best(lambda: F.linear(x, w))


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _silu_mul(gu: torch.Tensor) -> torch.Tensor:
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


class Llama(torch.nn.Module):
    """Weights + a functional forward. Fused: wqkv [(H+2KV)*hd, d], w13 [2I, d]."""

    def __init__(self, args: LlamaArgs, weights: dict[str, torch.Tensor], max_len: int,
                 pack: bool = False, rows_linear=None,
                 gguf: dict[str, tuple[torch.Tensor, int]] | None = None):
        super().__init__()
        self.args = args
        a = args
        self.q_dim, self.kv_dim = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        self.embed = weights["embed"]  # [V, d]
        self.lm_head = weights.get("lm_head", self.embed)  # [V, d]; packed when serving
        # the plain [V, d] head (the embedding when tied), for row subsets such as a
        # drafter's pruned vocabulary; untied and packed, it is kept as a second copy
        self.lm_head_plain = self.lm_head
        self.norm = weights["norm"]  # [d]
        self.layers = [{k: weights[f"{i}.{k}"] for k in ("ln1", "wqkv", "wo", "ln2", "w13", "w2")}
                       for i in range(a.num_layers)]
        self.linear = F.linear
        self.rms_norm, self.silu_mul = _rms_norm, _silu_mul  # native ones with the kernel
        self.rope: Callable | None = None  # the native RoPE (native linear only)
        # native: x += add in place, then RMSNorm, one call (None: the two ops)
        self.add_rms_norm: Callable | None = None
        # native: a decode / verify step's RoPE, K/V write and attention in one call
        # per layer, and the residual updates fused into the norms (False: the
        # separate ops, the same values; for comparisons)
        self.fused_ops = True
        # (pack, linear) of the serving layout, for other weights that use this
        # model's linear (a drafter's head rows and layers); None = plain F.linear
        self.packing: tuple[Callable, Callable] | None = None
        # Layers used for steps of >= FP32_ROWS rows (prefill chunks), with
        # their linear; None = the same as for decode.
        self.wide_layers: list[dict] | None = None
        # pack (serving only: packed weights have no autograd and no plain layout,
        # which training reads). fp32 on CPU with the native kernels built: their
        # layout (native_linear: 1.5x oneDNN for 1 row, 1.9x for 8, 1.6x for 64,
        # 1.3x for 256; a row's result independent of the batch); bf16 on a CPU
        # with AVX512-BF16 likewise (1.8x oneDNN for 1 row, 1.3x for 8, 1.05-1.1x
        # for 32-512, so every step, prefill included, runs on it). Otherwise
        # oneDNN's blocked layout, faster than F.linear on a plain [out, in]
        # matrix for every row count a step has: bf16 GEMV 1.5-3.5x with
        # bit-identical results; fp32 (AVX2, no bf16) 1.35x for 1 row, 1.3x for
        # 8, 1.1-1.25x for 32-256, and the 49152-row LM head 2x at every row count.
        if pack and rows_linear is not None and self.embed.dtype == rows_linear.dtype and \
                self.embed.device.type == "cpu":
            self.packing = (rows_linear.pack, rows_linear)
            self.rms_norm, self.silu_mul = rows_linear.rms_norm, rows_linear.silu_mul
            self.rope = rows_linear.rope
            self.add_rms_norm = rows_linear.add_rms_norm
        elif pack and use_packed_linear(self.embed):
            self.packing = (pack_weight, packed_linear)
            if self.embed.dtype == torch.bfloat16 and \
                    wide_gemm_faster_in_fp32(self.layers[0]["w13"]):
                # Keep the plain bf16 matrices (+1x the layer weights in memory)
                # for prefill chunks, computed in fp32; decode uses the packed ones.
                self.wide_layers = [dict(w) for w in self.layers]
        # gguf: the matrices' GGUF blocks (load_llama), which the native fp32 linear
        # computes from instead of the dense copy: the same values, ~1/5 the bytes
        self.gguf_matrices = 0
        # the head's blocks, for row subsets of it (pack_head_rows: a drafter's head)
        self.gguf_head: tuple[torch.Tensor, int] | None = None
        if self.packing is not None:
            pack_fn, self.linear = self.packing
            gguf = gguf if gguf and self.packing[1] is rows_linear and \
                hasattr(rows_linear, "pack_gguf") else {}

            def pack_one(key: str, dense: torch.Tensor):
                if key in gguf:
                    self.gguf_matrices += 1
                    return rows_linear.pack_gguf(*gguf[key])
                return pack_fn(dense)

            for i, w in enumerate(self.layers):
                for k in ("wqkv", "wo", "w13", "w2"):
                    w[k] = pack_one(f"{i}.{k}", w[k])
            self.lm_head = pack_one("lm_head", self.lm_head)  # a packed copy when tied
            self.gguf_head = gguf.get("lm_head")
        # RoPE tables in float32 like HF, cast to the model dtype: [max_len, hd]
        pos = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(pos, rope_inv_freq(a))  # [max_len, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        dt, dev = self.embed.dtype, self.embed.device
        self.cos = emb.cos().to(dt).to(dev)
        sin = emb.sin()
        half = a.head_dim // 2
        self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], -1).to(dt).to(dev)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def pack_head_rows(self, ids: torch.Tensor):
        """The LM head's rows ``ids`` packed for ``self.linear`` (serving only): from
        the head's GGUF blocks when the model computes from them (the same values,
        ~1/4 of the bytes), else from the plain matrix."""
        if self.gguf_head is not None:
            raw, kind = self.gguf_head
            return self.packing[1].pack_gguf(raw[ids.to(raw.device)].contiguous(), kind)
        plain = self.lm_head_plain
        return self.packing[0](plain[ids.to(plain.device)].contiguous())

    def forward(self, tokens: torch.Tensor, meta: AttnMetadata, kv: PagedKVCache,
                logit_rows: torch.Tensor | None, tap_layers: tuple[int, ...] = (),
                taps_out: torch.Tensor | None = None,
                float_logits: bool = True) -> torch.Tensor | None:
        """tokens: [T]; logit_rows: [S] rows that need logits (None = none).

        Returns logits [S, V] in float32 (or None; ``float_logits=False``: in the
        model dtype, for callers that convert only the rows they need). When tap_layers are given,
        taps_out [T, len(tap_layers) * d] receives the residual stream after
        each of those layers.
        """
        a = self.args
        t = tokens.shape[0]
        h, kvh, hd, d = a.num_heads, a.num_kv_heads, a.head_dim, a.hidden_size
        qk_dim, eps, lin = self.q_dim + self.kv_dim, a.rms_norm_eps, self.linear
        norm, silu_mul = self.rms_norm, self.silu_mul
        layers = self.layers
        if self.wide_layers is not None and t >= FP32_ROWS:
            layers, lin = self.wide_layers, fp32_linear
        x = F.embedding(tokens, self.embed)  # [T, d]
        cos = self.cos.index_select(0, meta.positions)  # [T, hd]
        sin = self.sin_signed.index_select(0, meta.positions)
        rope = self.rope if self.rope is not None and layers is self.layers else None
        if rope is None:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, hd]
        tap_slot = {layer: j for j, layer in enumerate(tap_layers)}
        # native, a step of short windows only (decode and verify): each layer's
        # RoPE, K/V write and attention are one call (the same values)
        ng = meta.native
        fused = self.fused_ops and layers is self.layers
        one_call = fused and rope is not None and ng is not None and not meta.long \
            and meta.short is None
        scale = 1.0 / math.sqrt(hd)
        add_norm = self.add_rms_norm if fused else None

        def residual_norm(x, y, w):  # (x + y, norm(x + y)); native: x updated in place
            if add_norm is not None:
                return x, add_norm(x, y, w, eps)
            x = x + y
            return x, norm(x, w, eps)

        mlp = None  # the last layer's SwiGLU output, not yet added to x
        for i, w in enumerate(layers):
            if mlp is None:
                xn = norm(x, w["ln1"], eps)
            else:
                x, xn = residual_norm(x, mlp, w["ln1"])
            qkv = lin(xn, w["wqkv"])  # [T, (H+2KV)*hd]
            if one_call:
                o = ng.ext.rope_write_attention(qkv, cos, sin, kv.k[i], kv.v[i], ng.info,
                                                ng.tables, scale, h, kvh)
            else:
                if rope is not None:  # one call: the same values as the three ops below
                    qk = rope(qkv, cos, sin, h + kvh)
                else:
                    qk = qkv[:, :qk_dim].view(t, h + kvh, hd)
                    # RoPE (rotate-half layout): roll swaps the halves, sin_signed has -sin first
                    qk = torch.addcmul(qk * cos, qk.roll(hd // 2, -1), sin)
                v = qkv[:, qk_dim:].view(t, kvh, hd)
                o = paged_attention(qk[:, :h], qk[:, h:], v, kv.k[i], kv.v[i], meta)
            x, xn = residual_norm(x, lin(o, w["wo"]), w["ln2"])  # o: [T, H*hd]
            mlp = lin(silu_mul(lin(xn, w["w13"])), w["w2"])  # SwiGLU
            if i in tap_slot:
                x, mlp = x + mlp, None
                j = tap_slot[i]
                taps_out[:, j * d:(j + 1) * d] = x
        if mlp is not None:
            x = x + mlp
        if logit_rows is None:
            return None
        xs = x.index_select(0, logit_rows) if logit_rows.shape[0] != t else x
        # logits for a few rows: the (packed) decode head
        logits = self.linear(norm(xs, self.norm, eps), self.lm_head)  # [S, V]
        return logits.float() if float_logits else logits


def load_llama(model_dir: Path, dtype: torch.dtype, device: torch.device,
               max_len: int, pack: bool = False, rows_linear=None,
               gguf_weights: str = "off") -> Llama:
    """Load an HF-format Llama checkpoint (config.json + *.safetensors, sharded or not).

    pack: serving layout for the linears (``Llama``); rows_linear: the native
    fp32 linear (``native_linear.resolve``) to pack for, or None for oneDNN.
    gguf_weights (``WorkerConfig.gguf_weights``): "auto" computes the matrices
    that have GGUF blocks beside the weights (``gguf_blocks.GGUF_BLOCKS``) from those
    blocks where the native fp32 linear packs them; "on" requires it; "off"
    packs the dense weights. The blocks are checked against the dense weights
    (a stale blocks file is an error, not a different model)."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    args = LlamaArgs.from_hf_config(json.loads((model_dir / "config.json").read_text()))
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    raw: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                # cast one tensor at a time: peak memory stays ~ final size. To be
                # packed, a tensor already in the dtype is copied: memory of tensors
                # straight from get_tensor was not given back when packing dropped
                # them (measured: the plain wo/w2 stayed resident, +140 MiB in fp32)
                t = sf.get_tensor(name)
                raw[name] = t.clone() if pack and t.dtype == dtype else t.to(dtype=dtype)

    def take(name: str) -> torch.Tensor:
        try:
            return raw.pop(name)
        except KeyError:
            raise ValueError(f"checkpoint {model_dir} lacks tensor {name!r}") from None

    w: dict[str, torch.Tensor] = {"embed": take("model.embed_tokens.weight"),
                                  "norm": take("model.norm.weight")}
    if "lm_head.weight" in raw and not args.tie_word_embeddings:
        w["lm_head"] = take("lm_head.weight")
    elif "lm_head.weight" in raw:
        raw.pop("lm_head.weight")
    elif not args.tie_word_embeddings:
        raise ValueError(f"checkpoint {model_dir} lacks lm_head.weight and is not tied")
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        w[f"{i}.ln1"] = take(p + "input_layernorm.weight")
        w[f"{i}.ln2"] = take(p + "post_attention_layernorm.weight")
        w[f"{i}.wqkv"] = torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        w[f"{i}.wo"] = take(p + "self_attn.o_proj.weight")
        w[f"{i}.w13"] = torch.cat([take(p + "mlp.gate_proj.weight"),
                                   take(p + "mlp.up_proj.weight")])
        w[f"{i}.w2"] = take(p + "mlp.down_proj.weight")
    w = {k: v.to(device).contiguous() for k, v in w.items()}
    gguf = gguf_blocks(model_dir, args, w, dtype, device, pack, rows_linear, gguf_weights)
    return Llama(args, w, max_len, pack=pack, rows_linear=rows_linear, gguf=gguf)
