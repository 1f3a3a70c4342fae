"""The DSpark drafter: parallel backbone + sequential Markov head + confidence head.

See shared/design/DSPARK.md sections 1-2. One backbone forward turns the fused
target tap rows of the last W committed positions plus the block
``[anchor, MASK x (K-1)]`` into base logits U_1..U_K (slot s -> U_{s+1}); a rank-r
bigram bias ``B(x) = W2 @ W1[x]`` then corrects them left to right, and a
linear confidence head estimates per-slot survival.

The target's embedding and LM head are frozen and shared: they are bound with
``bind_target``/``bind_llama`` and are never parameters or checkpoint tensors.

Context layout (batched over requests): ``ctx_rows [B, C, m*d]`` left-aligned,
``ctx_positions [B, C]`` absolute positions, ``ctx_lengths [B]`` valid rows.
A context row is attended to iff it is valid (index < length), strictly before
the anchor, and inside the window ``[anchor_pos - W, anchor_pos)``; so padded
rows, rows past the window and stale rows at or after the anchor never count.
References: DSpark (Cheng et al. 2026), DFlash, gpt-fast's model.py.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from types import SimpleNamespace
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from . import native_markov
from .llama import rope_inv_freq
from .native_argmax import argmax_rows
from .native_attention import LANES

# Loss mixture of DSPARK.md section 2.4.
CE_WEIGHT, L1_WEIGHT, BCE_WEIGHT, SLOT_DECAY = 0.1, 0.9, 1.0, 4.0


@dataclass(frozen=True)
class DrafterConfig:
    """Drafter hyper-parameters plus the identity of the target it was trained for."""
    mask_token_id: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_model_id: str
    target_vocab_size: int
    target_hidden_size: int
    target_num_layers: int
    block_size: int = 7
    target_layer_ids: tuple[int, ...] = (8, 16, 24)
    markov_rank: int = 64
    context_window: int = 128
    num_draft_layers: int = 2
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    # 0 = draft over the full target vocabulary; n = over n target tokens (the
    # checkpoint's ``draft_vocab`` ids): a cheaper head and Markov head, but a
    # token outside it can never be drafted.
    draft_vocab_size: int = 0
    # Sequential temperature scaling of the confidence head (DSPARK.md 4.1):
    # c_k = sigmoid(z_k / T_k) when drafting; () = uncalibrated (every T_k = 1).
    # Fitted by `dspark calibrate-drafter`; training ignores them.
    confidence_temperatures: tuple[float, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        try:
            temps = tuple(float(t) for t in self.confidence_temperatures)
        except (TypeError, ValueError):
            raise ValueError("DrafterConfig.confidence_temperatures="
                             f"{self.confidence_temperatures!r}: must be a list of numbers") from None
        object.__setattr__(self, "confidence_temperatures", temps)

        def bad(name: str, why: str):
            raise ValueError(f"DrafterConfig.{name}={getattr(self, name)!r}: {why}")

        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "target_vocab_size", "target_hidden_size", "target_num_layers",
                     "block_size", "context_window", "num_draft_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(name, "must be a positive integer")
        if not isinstance(self.draft_vocab_size, int) or \
                not 0 <= self.draft_vocab_size <= self.target_vocab_size:
            bad("draft_vocab_size", f"must be in [0, {self.target_vocab_size}] (0 = full)")
        if not isinstance(self.markov_rank, int) or self.markov_rank < 0:
            bad("markov_rank", "must be an integer >= 0 (0 = no Markov head)")
        if not isinstance(self.target_model_id, str) or not self.target_model_id:
            bad("target_model_id", "must be a non-empty string")
        if not 0 <= self.mask_token_id < self.target_vocab_size:
            bad("mask_token_id", f"must be in [0, {self.target_vocab_size})")
        if self.hidden_size != self.target_hidden_size:
            bad("hidden_size", f"must equal target_hidden_size={self.target_hidden_size} "
                "(the drafter shares the target's embedding and LM head)")
        if self.num_heads % self.num_kv_heads:
            bad("num_heads", f"must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            bad("head_dim", "must be even (RoPE rotate-half)")
        if not self.rms_norm_eps > 0:
            bad("rms_norm_eps", "must be > 0")
        if not self.rope_theta > 0:
            bad("rope_theta", "must be > 0")
        temps = self.confidence_temperatures
        if temps and (len(temps) != self.block_size or not all(0 < t < 1e3 for t in temps)):
            bad("confidence_temperatures", f"must be empty or {self.block_size} values "
                "(one per draft position) in (0, 1000)")
        ids = self.target_layer_ids
        if not ids or len(set(ids)) != len(ids):
            bad("target_layer_ids", "must be a non-empty list of distinct layers")
        for i in ids:
            if not 0 <= i < self.target_num_layers:
                bad("target_layer_ids", f"layer {i} out of range [0, {self.target_num_layers})")
            if i == self.target_num_layers - 1:
                bad("target_layer_ids", f"layer {i} is the target's final layer "
                    f"(target_num_layers={self.target_num_layers}); tap a non-final layer")

    @property
    def tap_width(self) -> int:
        """Width of one tap row: the tapped layers' hidden states side by side."""
        return len(self.target_layer_ids) * self.target_hidden_size

    @classmethod
    def for_target(cls, args, target_model_id: str, **overrides) -> DrafterConfig:
        """Backbone dims copied from a target's ``LlamaArgs``; anything overridable."""
        base = dict(mask_token_id=args.vocab_size - 1, hidden_size=args.hidden_size,
                    num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
                    head_dim=args.head_dim, intermediate_size=args.intermediate_size,
                    target_model_id=target_model_id, target_vocab_size=args.vocab_size,
                    target_hidden_size=args.hidden_size, target_num_layers=args.num_layers,
                    rms_norm_eps=args.rms_norm_eps, rope_theta=args.rope_theta,
                    rope_scaling=args.rope_scaling)
        return cls(**{**base, **overrides})

    def to_json(self) -> str:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        d["confidence_temperatures"] = list(self.confidence_temperatures)
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DrafterConfig:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"drafter config is not valid JSON: {e}") from None
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"drafter config has unknown fields {unknown}")
        try:
            return cls(**d)
        except TypeError as e:  # a missing required field
            raise ValueError(f"drafter config incomplete: {e}") from None


class DraftOutput(NamedTuple):
    tokens: torch.Tensor                # [B, K] int64 drafts d_1..d_K
    probs: torch.Tensor                 # [B, K] float32 p_k(d_k)
    dists: torch.Tensor | None          # [B, K, V] float32 p_k (when asked for)
    confidences: torch.Tensor           # [B, K] float32 c_k = sigmoid(z_k)


def packed_rows(linear: Callable, x: torch.Tensor, w) -> torch.Tensor:
    """``linear(x, w)`` for a packed weight, x [..., d] of any rank."""
    return linear(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)


def pad_context(rows: list[torch.Tensor], positions: list[torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-request ``[n_i, m*d]`` rows / ``[n_i]`` positions -> left-aligned padded batch."""
    n = max([r.shape[0] for r in rows] + [1])
    b, width = len(rows), rows[0].shape[-1]
    out = rows[0].new_zeros(b, n, width)
    pos = torch.zeros(b, n, dtype=torch.long, device=rows[0].device)
    for i, (r, p) in enumerate(zip(rows, positions)):
        out[i, :r.shape[0]] = r
        pos[i, :r.shape[0]] = p
    lengths = torch.tensor([r.shape[0] for r in rows], dtype=torch.long, device=out.device)
    return out, pos, lengths


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float,
             native: Callable | None = None) -> torch.Tensor:
    """F.rms_norm over the last dim, or the native kernel's (``native``: the
    serving linear's ``rms_norm``, one call where F.rms_norm is ~8 ops)."""
    if native is not None:
        return native(x.reshape(-1, x.shape[-1]), w, eps).view(x.shape)
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    # rotate-half layout as in llama.py: roll swaps halves, sin_signed = [-sin, sin]
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)


class DraftLayer(torch.nn.Module):
    """One draft decoder layer; weights laid out like llama.py's fused target layers."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.h, self.kvh, self.hd, self.eps = c.num_heads, c.num_kv_heads, hd, c.rms_norm_eps
        self.q_dim = c.num_heads * hd
        std = 0.02
        self.ln1 = torch.nn.Parameter(torch.ones(d))
        qkv_rows = (c.num_heads + 2 * c.num_kv_heads) * hd
        self.wqkv = torch.nn.Parameter(torch.randn(qkv_rows, d) * std)
        self.wo = torch.nn.Parameter(torch.randn(d, self.q_dim) * std)
        self.ln2 = torch.nn.Parameter(torch.ones(d))
        self.w13 = torch.nn.Parameter(torch.randn(2 * c.intermediate_size, d) * std)
        self.w2 = torch.nn.Parameter(torch.randn(d, c.intermediate_size) * std)
        self._packed: dict[str, object] | None = None  # serving: packed copies
        self._packed_linear: Callable | None = None
        # serving with the native linear: its one-call RMSNorm and SwiGLU product
        self._rows_norm: Callable | None = None
        self._rows_silu_mul: Callable | None = None
        self._attention: Callable | None = None  # and its drafter attention
        # and its one-call RoPE (rope_rows) and residual-update-and-norm
        self._rows_rope: Callable | None = None
        self._rows_add_norm: Callable | None = None

    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ W.T for W in wqkv / wkv (the K/V rows of wqkv) / wo / w13 / w2."""
        if self._packed is not None:
            return packed_rows(self._packed_linear, x, self._packed[name])
        w = self.wqkv[self.q_dim:] if name == "wkv" else getattr(self, name)
        return F.linear(x, w)

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, w, self.eps, self._rows_norm)

    def _swiglu(self, gu: torch.Tensor) -> torch.Tensor:
        """[gate | up] -> silu(gate) * up."""
        if self._rows_silu_mul is not None:
            return self._rows_silu_mul(gu.reshape(-1, gu.shape[-1])).view(*gu.shape[:-1], -1)
        gate, up = gu.chunk(2, -1)
        return F.silu(gate) * up

    @torch.no_grad()
    def pack(self, packing: tuple[Callable, Callable]) -> None:
        """Inference only: weights in a serving layout, ``packing`` = (pack, linear)
        (oneDNN: bf16 several times faster than plain bf16 F.linear on CPUs without
        AMX, fp32 ~1.3x; or the native kernels, whose RMSNorm and SwiGLU product
        the layer then uses too). Training never calls this."""
        pack_fn, self._packed_linear = packing
        self._rows_norm = getattr(self._packed_linear, "rms_norm", None)
        self._rows_silu_mul = getattr(self._packed_linear, "silu_mul", None)
        self._attention = getattr(self._packed_linear, "drafter_attention", None) \
            if self.hd % LANES == 0 else None
        self._rows_rope = getattr(self._packed_linear, "rope", None)
        self._rows_add_norm = getattr(self._packed_linear, "add_rms_norm", None)
        self._packed = {n: pack_fn((self.wqkv[self.q_dim:] if n == "wkv"
                                    else getattr(self, n)).contiguous())
                        for n in ("wqkv", "wkv", "wo", "w13", "w2")}

    def ctx_kv(self, ctx: torch.Tensor, rope_ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """Context rows' own K/V: ctx [..., C, d] -> kc, vc [..., C, KV, hd] (kc roped).

        Context rows are projected by this layer's K/V weights only (they do not pass
        through the layer), so they can be computed once per row and cached."""
        kvh, hd = self.kvh, self.hd
        kvc = self._lin(ctx, "wkv")
        shape = (*ctx.shape[:-1], kvh, hd)
        if self._rows_rope is not None:  # one call, the same values
            cos, sin = rope_ctx
            kc = self._rows_rope(kvc.reshape(-1, kvc.shape[-1]), cos.reshape(-1, hd),
                                 sin.reshape(-1, hd), kvh).view(shape)
        else:
            kc = _apply_rope(kvc[..., :kvh * hd].reshape(shape), *rope_ctx)
        return kc, kvc[..., kvh * hd:].reshape(shape)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, rope_blk, rope_ctx,
                valid: torch.Tensor) -> torch.Tensor:
        """x: [B, K, d] block rows; ctx: [B, C, d] fused context; valid: [B, C]."""
        return self.attend(x, *self.ctx_kv(ctx, rope_ctx), rope_blk, valid)

    def attend(self, x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, rope_blk,
               valid: torch.Tensor) -> torch.Tensor:
        """x: [B, K, d]; kc, vc: [B, C, KV, hd] context K/V; valid: [B, C] bool, the
        context rows each request sees (every block row sees the whole block).
        Serving with the native kernels, a contiguous x is updated in place (the
        residual stream's first update, fused into the second norm)."""
        b, k, d = x.shape
        h, kvh, hd, qd = self.h, self.kvh, self.hd, self.q_dim
        qkv = self._lin(self._norm(x, self.ln1), "wqkv")  # [B, K, (H+2KV)hd]
        if self._rows_rope is not None:  # serving, native: one call each, the same values
            cos, sin = (t.reshape(b * k, hd) for t in rope_blk)
            rows = qkv.view(b * k, -1)
            q = self._rows_rope(rows, cos, sin, h).view(b, k, h, hd)
            kb = self._rows_rope(rows[:, qd:], cos, sin, kvh).view(b, k, kvh, hd)
        else:
            q = _apply_rope(qkv[..., :qd].view(b, k, h, hd), *rope_blk)
            kb = _apply_rope(qkv[..., qd:qd + kvh * hd].view(b, k, kvh, hd), *rope_blk)
        vb = qkv[..., qd + kvh * hd:].view(b, k, kvh, hd)
        if self._attention is not None:  # serving, native: one call, no mask or copies
            o = self._attention(q, kc.contiguous(), vc.contiguous(), kb, vb.contiguous(),
                                valid.contiguous())  # [B, K, H, hd]
        else:
            kk = torch.cat([kc, kb], 1).transpose(1, 2)  # [B, KV, C+K, hd]
            vv = torch.cat([vc, vb], 1).transpose(1, 2)
            mask = torch.cat([valid, valid.new_ones(b, k)], 1)[:, None, None, :]  # [B,1,1,C+K]
            o = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=mask,
                                               enable_gqa=h != kvh).transpose(1, 2)
        ao = self._lin(o.reshape(b, k, qd), "wo")
        if self._rows_add_norm is not None and x.is_contiguous():
            # serving: x += ao (x is this forward's own tensor), then the norm, one call
            xn = self._rows_add_norm(x.view(b * k, d), ao.reshape(b * k, d), self.ln2,
                                     self.eps).view(b, k, d)
        else:
            x = x + ao
            xn = self._norm(x, self.ln2)
        return x + self._lin(self._swiglu(self._lin(xn, "w13")), "w2")

    def forward_shared(self, x: torch.Tensor, ctx: torch.Tensor, rope_blk, rope_ctx,
                       valid: torch.Tensor) -> torch.Tensor:
        """x: [A, K, d] block rows of A anchors sharing one context ctx [L, d];
        valid [A, L] says which context rows each anchor sees. Same math as
        ``forward`` (GQA attention over [context ; own block]), without copying the
        context per anchor."""
        a, k, d = x.shape
        n = ctx.shape[0]
        h, kvh, hd, qd = self.h, self.kvh, self.hd, self.q_dim
        g = h // kvh
        qkv = F.linear(F.rms_norm(x, (d,), self.ln1, self.eps), self.wqkv)
        q = _apply_rope(qkv[..., :qd].view(a, k, h, hd), *rope_blk)
        kb = _apply_rope(qkv[..., qd:qd + kvh * hd].view(a, k, kvh, hd), *rope_blk)
        vb = qkv[..., qd + kvh * hd:].view(a, k, kvh, hd)
        kvc = F.linear(ctx, self.wqkv[qd:])  # [L, 2*KV*hd]
        kc = _apply_rope(kvc[..., :kvh * hd].view(n, kvh, hd), *rope_ctx)  # [L, KV, hd]
        vc = kvc[..., kvh * hd:].view(n, kvh, hd)
        scale = 1.0 / math.sqrt(hd)
        qg = q.view(a, k, kvh, g, hd)
        # context scores: [KV, A*K*g, L] with one bmm per KV head group
        q_ctx = qg.permute(2, 0, 1, 3, 4).reshape(kvh, a * k * g, hd)
        s_ctx = torch.bmm(q_ctx, kc.permute(1, 2, 0)) * scale
        s_ctx = s_ctx.view(kvh, a, k, g, n).masked_fill(
            ~valid.view(1, a, 1, 1, n), float("-inf"))
        # block scores: [A, KV, K*g, K] (bidirectional inside the block)
        q_blk = qg.permute(0, 2, 1, 3, 4).reshape(a, kvh, k * g, hd)
        s_blk = torch.matmul(q_blk, kb.permute(0, 2, 3, 1)) * scale
        s_blk = s_blk.view(a, kvh, k, g, k).permute(1, 0, 2, 3, 4)  # [KV, A, K, g, K]
        p = torch.softmax(torch.cat([s_ctx, s_blk], -1).float(), -1).to(x.dtype)
        p_ctx = p[..., :n].reshape(kvh, a * k * g, n)
        p_blk = p[..., n:].permute(1, 0, 2, 3, 4).reshape(a, kvh, k * g, k)
        o = torch.bmm(p_ctx, vc.permute(1, 0, 2)).view(kvh, a, k, g, hd).permute(1, 2, 0, 3, 4)
        o = o + torch.matmul(p_blk, vb.permute(0, 2, 1, 3)).view(a, kvh, k, g, hd) \
            .permute(0, 2, 1, 3, 4)
        x = x + F.linear(o.reshape(a, k, qd), self.wo)
        gate, up = F.linear(F.rms_norm(x, (d,), self.ln2, self.eps), self.w13).chunk(2, -1)
        return x + F.linear(F.silu(gate) * up, self.w2)


class DSparkDrafter(torch.nn.Module):
    """Trainable drafter weights; the target's embedding and LM head are bound, not owned."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        c = self.config = config
        d, m, r = c.hidden_size, len(c.target_layer_ids), c.markov_rank
        self.fc = torch.nn.Parameter(torch.randn(d, m * d) / math.sqrt(m * d))  # W_c
        self.ctx_norm = torch.nn.Parameter(torch.ones(d))
        self.mask_embed = torch.nn.Parameter(torch.randn(d) * 0.02)  # MASK slot input
        self.layers = torch.nn.ModuleList(DraftLayer(c) for _ in range(c.num_draft_layers))
        self.norm = torch.nn.Parameter(torch.ones(d))
        vd = c.draft_vocab_size or c.target_vocab_size
        if c.draft_vocab_size:
            # draft slot j <-> target token draft_vocab[j]; set by set_draft_vocab
            self.register_buffer("draft_vocab", torch.arange(vd, dtype=torch.long))
        else:
            self.draft_vocab = None
        if r:
            # W1 is indexed by the previous token (any target token), W2 spans the drafts
            self.markov_w1 = torch.nn.Parameter(torch.randn(c.target_vocab_size, r) * 0.02)
            # W2 = 0: the Markov bias starts at zero, drafting starts as the plain backbone
            self.markov_w2 = torch.nn.Parameter(torch.zeros(vd, r))
        self.conf_w = torch.nn.Parameter(torch.zeros(1, d + r))
        self.conf_b = torch.nn.Parameter(torch.zeros(1))
        # fp32 on purpose, kept out of the state dict and out of Module.to(dtype)
        with torch.device("cpu"):  # also when built under a meta-device context
            self._inv_freq = rope_inv_freq(SimpleNamespace(
                head_dim=c.head_dim, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling))
        self._embed: torch.Tensor | None = None
        self._lm_head: torch.Tensor | None = None
        self._linear: Callable = F.linear
        self._target_packing: tuple[Callable, Callable] | None = None  # bind_llama
        self._rows_norm: Callable | None = None  # serving: the native RMSNorm, if packed so

    # ---- draft vocabulary --------------------------------------------------------------
    @property
    def draft_vocab_size(self) -> int:
        return self.config.draft_vocab_size or self.config.target_vocab_size

    @torch.no_grad()
    def set_draft_vocab(self, token_ids) -> None:
        """Choose the draftable target tokens (a pruned vocabulary only)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long)
        if self.draft_vocab is None:
            raise ValueError("set_draft_vocab: this drafter drafts the full vocabulary")
        if ids.shape != self.draft_vocab.shape or len(set(ids.tolist())) != ids.numel() or \
                int(ids.min()) < 0 or int(ids.max()) >= self.config.target_vocab_size:
            raise ValueError(f"set_draft_vocab: need {self.draft_vocab.numel()} distinct "
                             f"ids in [0, {self.config.target_vocab_size})")
        self.draft_vocab.copy_(ids.to(self.draft_vocab.device))
        self._vocab_index = None
        self._w1_slot = None

    def vocab_index(self) -> torch.Tensor:
        """[V] long: the draft slot of each target token, -1 when not draftable."""
        if self.draft_vocab is None:
            return torch.arange(self.config.target_vocab_size, device=self.fc.device)
        idx = getattr(self, "_vocab_index", None)
        if idx is None or idx.device != self.draft_vocab.device:
            idx = torch.full((self.config.target_vocab_size,), -1, dtype=torch.long,
                             device=self.draft_vocab.device)
            idx[self.draft_vocab] = torch.arange(self.draft_vocab.numel(),
                                                 device=self.draft_vocab.device)
            self._vocab_index = idx
        return idx

    def to_target_ids(self, slots: torch.Tensor) -> torch.Tensor:
        return slots if self.draft_vocab is None else self.draft_vocab[slots]

    # ---- target binding --------------------------------------------------------------
    def bind_target(self, embed: torch.Tensor, lm_head: torch.Tensor,
                    linear: Callable = F.linear) -> DSparkDrafter:
        """Share the target's frozen embedding [V, d] and LM head (``linear(x, lm_head)``).

        With a pruned draft vocabulary ``lm_head`` must be a plain [V, d] matrix (its
        draft rows are taken) unless it is already the [Vd, d] draft head.
        """
        v, d = self.config.target_vocab_size, self.config.hidden_size
        if tuple(embed.shape) != (v, d):
            raise ValueError(f"target embedding has shape {tuple(embed.shape)}, drafter "
                             f"expects {(v, d)}")
        if self.draft_vocab is not None and tuple(lm_head.shape) == (v, d) \
                and not lm_head.is_mkldnn:
            lm_head = lm_head[self.draft_vocab.to(lm_head.device)].contiguous()
        self._embed, self._lm_head, self._linear = embed, lm_head, linear
        return self

    def bind_llama(self, llama) -> DSparkDrafter:
        """Bind a loaded ``Llama``'s embedding and (possibly packed) LM head."""
        self._target_packing = llama.packing
        if self.draft_vocab is None or llama.packing is None:
            return self.bind_target(llama.embed, llama.lm_head, llama.linear)
        # packed CPU head: take the draft rows (of the plain matrix, or of its GGUF
        # blocks where the target computes from those), repack
        return self.bind_target(llama.embed, llama.pack_head_rows(self.draft_vocab),
                                llama.linear)

    @torch.no_grad()
    def pack_for_inference(self, packing: tuple[Callable, Callable] | None = None) -> bool:
        """Pack every drafting weight (layers, fusion, Markov W2) in a serving layout:
        ``packing`` = (pack, linear), by default the bound target's (``bind_llama``),
        else oneDNN's on a CPU that has it (bf16 or fp32). Returns whether it did;
        training never calls this."""
        from .llama import pack_weight, packed_linear, use_packed_linear

        packing = packing or self._target_packing
        if packing is None:
            if not use_packed_linear(self.fc):
                return False
            packing = (pack_weight, packed_linear)
        pack_fn, self._packed_linear = packing
        self._rows_norm = getattr(self._packed_linear, "rms_norm", None)
        for layer in self.layers:
            layer.pack(packing)
        self._packed_fc = pack_fn(self.fc.contiguous())
        self._packed_w2 = pack_fn(self.markov_w2.contiguous()) \
            if self.config.markov_rank else None
        # W1's rows of the draftable tokens, by draft slot: the drafting loop feeds
        # each pick back without mapping it to a target id first
        self._w1_slot = self.markov_w1[self.draft_vocab].contiguous() \
            if self.config.markov_rank and self.draft_vocab is not None else None
        # the confidence head as one fp32 dot product per position (a bf16 linear of
        # one output row took ~0.2 ms a step in the serving loop)
        self._conf_f32 = (self.conf_w.detach().float().reshape(-1).contiguous(),
                          self.conf_b.detach().float())
        self._rope_tab = self._rope_rows(torch.arange(1024, device=self.fc.device))
        self._rope_tab = tuple(t.squeeze(-2) for t in self._rope_tab)
        return True

    def _plin(self, x: torch.Tensor, w: torch.Tensor, packed_name: str) -> torch.Tensor:
        pk = getattr(self, packed_name, None)
        if pk is None:
            return F.linear(x, w)
        return packed_rows(self._packed_linear, x, pk)

    @torch.no_grad()
    def init_from_target(self, llama, layer_ids: tuple[int, ...] | None = None) -> None:
        """Copy target decoder layers (default: the last N) into the draft layers, the
        target's final norm into ours and its MASK embedding row into ``mask_embed``."""
        n = len(self.layers)
        layer_ids = tuple(range(llama.args.num_layers - n, llama.args.num_layers)) \
            if layer_ids is None else tuple(layer_ids)
        if len(layer_ids) != n:
            raise ValueError(f"init_from_target: {len(layer_ids)} layer ids for {n} draft layers")
        # bf16 CPU targets pack their decode weights; wide_layers (when kept) are plain
        src_layers = getattr(llama, "wide_layers", None) or llama.layers
        for mine, i in zip(self.layers, layer_ids):
            for name, p in mine.named_parameters():
                src = src_layers[i][name]
                if src.is_mkldnn or tuple(src.shape) != tuple(p.shape):
                    raise ValueError(f"init_from_target: target layer {i} {name} has shape "
                                     f"{tuple(src.shape)} (mkldnn-packed={src.is_mkldnn}), draft "
                                     f"layer expects {tuple(p.shape)} unpacked (load the "
                                     "target in fp32, or give the draft layers its dims)")
                p.copy_(src)
        self.norm.copy_(llama.norm)
        self.mask_embed.copy_(llama.embed[self.config.mask_token_id])

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.dtype

    # ---- backbone --------------------------------------------------------------------
    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pos [...] -> cos, sin_signed [..., 1, hd] (fp32 tables cast like llama.py's).
        Packed for serving, rows of a table kept for positions 0..P (a few ops a
        call instead of ~10; the same values)."""
        tab = getattr(self, "_rope_tab", None)
        if tab is None or not pos.numel():
            return self._rope_rows(pos)
        top = int(pos.max()) + 1
        if top > tab[0].shape[0]:
            n = max(top, 2 * tab[0].shape[0])
            tab = self._rope_tab = tuple(t.squeeze(-2) for t in self._rope_rows(
                torch.arange(n, device=pos.device)))
        flat = pos.reshape(-1)
        return tuple(t.index_select(0, flat).view(*pos.shape, 1, -1) for t in tab)

    def _rope_rows(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = pos.unsqueeze(-1).float() * self._inv_freq.to(pos.device)  # [..., hd/2]
        emb = torch.cat([freqs, freqs], -1)
        sin, half = emb.sin(), self.config.head_dim // 2
        sin_signed = torch.cat([-sin[..., :half], sin[..., half:]], -1)
        return emb.cos().to(self.dtype).unsqueeze(-2), sin_signed.to(self.dtype).unsqueeze(-2)

    def context_mask(self, ctx_positions: torch.Tensor, ctx_lengths: torch.Tensor,
                     anchor_pos: torch.Tensor) -> torch.Tensor:
        """[B, C] bool: valid, strictly before the anchor and inside the window W."""
        idx = torch.arange(ctx_positions.shape[1], device=ctx_positions.device)
        ap = anchor_pos.unsqueeze(1)
        return (idx < ctx_lengths.unsqueeze(1)) & (ctx_positions < ap) & \
            (ctx_positions >= ap - self.config.context_window)

    def backbone(self, ctx_rows: torch.Tensor, ctx_positions: torch.Tensor,
                 ctx_lengths: torch.Tensor, anchors: torch.Tensor,
                 anchor_pos: torch.Tensor) -> torch.Tensor:
        """Final-norm block states h [B, K, d] (slot s yields U_{s+1})."""
        if self._embed is None:
            raise RuntimeError("DSparkDrafter: call bind_target/bind_llama first")
        c, dt = self.config, self.dtype
        b, k, d = anchors.shape[0], c.block_size, c.hidden_size
        ctx = F.rms_norm(F.linear(ctx_rows.to(dt), self.fc), (d,), self.ctx_norm,
                         c.rms_norm_eps)  # [B, C, d]
        x = torch.cat([F.embedding(anchors.unsqueeze(1), self._embed).to(dt),
                       self.mask_embed.expand(b, k - 1, d)], 1)  # [B, K, d]
        blk_pos = anchor_pos.unsqueeze(1) + torch.arange(k, device=anchors.device)  # [B, K]
        valid = self.context_mask(ctx_positions, ctx_lengths, anchor_pos)
        rope_blk, rope_ctx = self._rope(blk_pos), self._rope(ctx_positions)
        for layer in self.layers:
            x = layer(x, ctx, rope_blk, rope_ctx, valid)
        return F.rms_norm(x, (d,), self.norm, c.rms_norm_eps)

    def fuse_context(self, taps: torch.Tensor, positions: torch.Tensor
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the K/V of context rows: taps [n, m*d] at positions [n] ->
        [(kc, vc) [n, KV, hd]] (what a lease's ring caches, once per committed row)."""
        c = self.config
        ctx = rms_norm(self._plin(taps.to(self.dtype), self.fc, "_packed_fc"), self.ctx_norm,
                       c.rms_norm_eps, self._rows_norm)
        rope = self._rope(positions)
        return [layer.ctx_kv(ctx, rope) for layer in self.layers]

    def backbone_cached(self, ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
                        ctx_positions: torch.Tensor, ctx_valid: torch.Tensor,
                        anchors: torch.Tensor, anchor_pos: torch.Tensor) -> torch.Tensor:
        """``backbone`` over cached context K/V: per layer (kc, vc) [B, C, KV, hd],
        ctx_positions [B, C] and ctx_valid [B, C] (rows that exist); the window and
        causality masks are applied here as in ``context_mask``."""
        c, dt = self.config, self.dtype
        b, k, d = anchors.shape[0], c.block_size, c.hidden_size
        x = torch.cat([F.embedding(anchors.unsqueeze(1), self._embed).to(dt),
                       self.mask_embed.expand(b, k - 1, d)], 1)
        ap = anchor_pos.unsqueeze(1)
        valid = ctx_valid & (ctx_positions < ap) & (ctx_positions >= ap - c.context_window)
        rope_blk = self._rope(ap + torch.arange(k, device=anchors.device))
        for layer, (kc, vc) in zip(self.layers, ctx_kv):
            x = layer.attend(x, kc, vc, rope_blk, valid)
        return rms_norm(x, self.norm, c.rms_norm_eps, self._rows_norm)

    def base_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, K, d] -> U [B, K, Vd] float32 through the target's LM head (draft rows)."""
        b, k, d = h.shape
        return self._linear(h.reshape(b * k, d), self._lm_head).float().view(b, k, -1)

    # ---- Markov and confidence heads ---------------------------------------------------
    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor | None:
        """B(prev) = W2 @ W1[prev]: [...] target ids -> [..., Vd] float32 (None when r = 0)."""
        if not self.config.markov_rank:
            return None
        return self._plin(F.embedding(prev, self.markov_w1), self.markov_w2,
                          "_packed_w2").float()

    def corrected_logits(self, base: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced U_k + B(x_{k-1}): base [B, K, V], prev_tokens [B, K]."""
        bias = self.markov_bias(prev_tokens)
        return base if bias is None else base + bias

    def confidence_logits(self, h: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """z_k = w . [h_k ; W1[x_{k-1}]] + b: h [..., d], prev [...] -> [...] float32."""
        if self.config.markov_rank:
            h = torch.cat([h, F.embedding(prev_tokens, self.markov_w1)], -1)
        return F.linear(h, self.conf_w, self.conf_b).squeeze(-1).float()

    # ---- drafting and training ---------------------------------------------------------
    @torch.no_grad()
    def draft(self, ctx_rows: torch.Tensor, ctx_positions: torch.Tensor,
              ctx_lengths: torch.Tensor, anchors: torch.Tensor, anchor_pos: torch.Tensor,
              temperature: float = 0.0, generator: torch.Generator | None = None,
              return_dists: bool = False, use_markov: bool = True,
              pick: Callable | None = None) -> DraftOutput:
        """Draft K tokens per request, left to right through the Markov head.

        ctx_rows [B, C, m*d], ctx_positions [B, C], ctx_lengths [B], anchors [B],
        anchor_pos [B]. temperature 0 is greedy, and then p_k is the one-hot of the
        argmax (the distribution actually drafted from). ``use_markov=False`` drafts
        from the backbone alone (the DFlash ablation). ``pick(k, logits [B, Vd])``,
        when given, returns (draft slots [B], p(slot) [B] float32, or None when
        every pick is an argmax) instead: per-request sampling, whose caller keeps
        the distributions (no ``return_dists`` then). Tokens are target ids;
        dists span the target vocab.
        """
        h = self.backbone(ctx_rows, ctx_positions, ctx_lengths, anchors, anchor_pos)
        return self.draft_from_h(h, anchors, temperature, generator, return_dists,
                                 use_markov, pick)

    def draft_from_h(self, h: torch.Tensor, anchors: torch.Tensor, temperature: float = 0.0,
                     generator: torch.Generator | None = None, return_dists: bool = False,
                     use_markov: bool = True, pick: Callable | None = None,
                     depth: int | None = None) -> DraftOutput:
        """The sequential part of drafting: K steps through the Markov head (or
        only the first ``depth``, when no more can be verified: a draft and its
        confidence depend only on the drafts before it, so the first ``depth``
        are the same either way).

        Only what depends on the previous draft runs inside the loop (its W1 row,
        the bias, the pick); the base logits are one matmul before it, and the
        confidences (DSPARK.md 4.1, z_k = w . [h_k ; W1[x_{k-1}]] + b) one after
        it, over the W1 rows the loop gathered. Drafting is latency-bound on CPU
        (each op costs microseconds of dispatch), so the loop is kept short."""
        c = self.config
        b, k_max = h.shape[0], c.block_size
        if pick is not None and return_dists:
            raise ValueError("draft: pick keeps its own distributions; return_dists "
                             "is for temperature drafting")
        if depth is not None:
            if not 1 <= depth <= k_max:
                raise ValueError(f"draft depth={depth} must be in 1..{k_max}")
            k_max, h = depth, h[:, :depth]
        base = self.base_logits(h)  # [B, depth, Vd]
        w1 = self.markov_w1 if c.markov_rank else None
        # serving (packed): the loop carries draft slots, W1 read by slot, and maps
        # them to target ids once at the end (the same rows, one op less a step)
        w1_slot = getattr(self, "_w1_slot", None) if w1 is not None else None
        if pick is None and temperature <= 0 and not return_dists and use_markov \
                and w1 is not None:
            # greedy on a natively packed W2: the whole loop in one call, same drafts
            by_slot = w1_slot if self.draft_vocab is not None else w1
            pw2 = getattr(self, "_packed_w2", None)
            if native_markov.usable(by_slot, pw2):
                slots, rows = native_markov.greedy_loop(
                    base, F.embedding(anchors, w1), by_slot, pw2)
                return self._drafted(h, slots, rows, None, None)
        prev, toks, probs, dists, rows = anchors, [], [], [], []
        for k in range(k_max):
            logits = base[:, k]
            if w1 is not None:
                # [B, r]: W1[x_{k-1}] (the anchor by id, the drafts by slot)
                e = F.embedding(prev, w1 if k == 0 or w1_slot is None else w1_slot)
                rows.append(e)
                if use_markov:  # + B(x_{k-1}) = W2 @ W1[x_{k-1}] (as markov_bias), in fp32
                    logits = torch.add(logits, self._plin(e, self.markov_w2, "_packed_w2"))
            p_slot = None
            if pick is not None:  # (slots, p(slot) or None: one-hot), no distribution
                slot, p_slot = pick(k, logits)
                p = None
            elif temperature > 0:
                p = torch.softmax(logits / temperature, -1)
                slot = torch.multinomial(p, 1, generator=generator).squeeze(1)
            else:
                slot, p = argmax_rows(logits), None
            if p is not None:
                p_slot = p.gather(1, slot.unsqueeze(1)).squeeze(1)
            probs.append(None if p_slot is None else p_slot.float())
            toks.append(slot)
            if return_dists:
                dists.append(self._full_dist(p, slot))
            prev = slot if w1_slot is not None else self.to_target_ids(slot)
        q = None
        if any(pk is not None for pk in probs):
            ones = torch.ones(b, dtype=torch.float32, device=h.device)
            q = torch.stack([ones if pk is None else pk for pk in probs], 1)
        return self._drafted(h, torch.stack(toks, 1), torch.stack(rows, 1) if rows else None,
                             q, torch.stack(dists, 1) if return_dists else None)

    def _drafted(self, h: torch.Tensor, slots: torch.Tensor, w1_rows: torch.Tensor | None,
                 q: torch.Tensor | None, dists: torch.Tensor | None) -> DraftOutput:
        """The output of drafting from h [B, D, d]: draft slots [B, D], the W1 rows
        of each position's previous token [B, D, r] (None without a Markov head),
        p_k(d_k) [B, D] (None: all greedy, one-hot, p = 1) and the confidences
        (DSPARK.md 4.1, z_k = w . [h_k ; W1[x_{k-1}]] + b, calibrated)."""
        feats = torch.cat([h, w1_rows], -1) if w1_rows is not None else h  # [B, D, d (+r)]
        conf = getattr(self, "_conf_f32", None)
        if conf is not None:  # packed for serving
            z = torch.addmv(conf[1], feats.reshape(-1, feats.shape[-1]).float(), conf[0]) \
                .view(feats.shape[:-1])
        else:
            z = F.linear(feats, self.conf_w, self.conf_b).squeeze(-1).float()  # [B, D]
        temps = self.config.confidence_temperatures
        if temps:
            z = z / self._temps_tensor(temps, z.device)[:slots.shape[1]]
        if q is None:  # greedy: p_k is the one-hot of the argmax, p_k(d_k) = 1
            q = torch.ones(slots.shape, dtype=torch.float32, device=h.device)
        return DraftOutput(self.to_target_ids(slots), q, dists, torch.sigmoid(z))

    def _temps_tensor(self, temps: tuple[float, ...], device: torch.device) -> torch.Tensor:
        """The calibration temperatures as a tensor, made once per value."""
        cached = getattr(self, "_temps_cache", None)
        if cached is None or cached[0] != temps or cached[1].device != device:
            cached = (temps, torch.tensor(temps, dtype=torch.float32, device=device))
            self._temps_cache = cached
        return cached[1]

    def _full_dist(self, p: torch.Tensor | None, slot: torch.Tensor) -> torch.Tensor:
        """A draft-vocab distribution (None = one-hot of slot) over the target vocab."""
        v = self.config.target_vocab_size
        if p is None:
            out = torch.zeros(slot.shape[0], v, dtype=torch.float32, device=slot.device)
            return out.scatter_(1, self.to_target_ids(slot).unsqueeze(1), 1.0)
        if self.draft_vocab is None:
            return p.float()
        out = torch.zeros(p.shape[0], v, dtype=torch.float32, device=p.device)
        return out.index_copy_(1, self.draft_vocab, p.float())

    def restrict_probs(self, target_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """p_t over the target vocab [..., V] -> (p_t on the draft vocab [..., Vd], the
        mass outside it [...])."""
        if self.draft_vocab is None:
            return target_probs, target_probs.new_zeros(target_probs.shape[:-1])
        inside = target_probs.index_select(-1, self.draft_vocab)
        return inside, (1 - inside.sum(-1)).clamp_min(0)

    def loss(self, ctx_rows: torch.Tensor, ctx_positions: torch.Tensor,
             ctx_lengths: torch.Tensor, anchors: torch.Tensor, anchor_pos: torch.Tensor,
             labels: torch.Tensor, target_probs: torch.Tensor,
             slot_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """DSPARK.md 2.4 for a batch of anchors, teacher-forced.

        labels [B, K] (tokens anchor_pos+1..anchor_pos+K), target_probs [B, K, V]
        (p_t at anchor_pos+k-1), slot_mask [B, K] bool (False past the end).
        Returns (total, {"ce", "l1", "bce"}), each a w_k-weighted mean over live slots.
        """
        h = self.backbone(ctx_rows, ctx_positions, ctx_lengths, anchors, anchor_pos)
        probs_d, outside = self.restrict_probs(target_probs)
        return self.loss_from_h(h, anchors, labels, probs_d, outside, slot_mask)

    def loss_from_h(self, h: torch.Tensor, anchors: torch.Tensor, labels: torch.Tensor,
                    probs_d: torch.Tensor, outside: torch.Tensor,
                    slot_mask: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss from block states h [B, K, d]; probs_d [B, K, Vd] is p_t on the draft
        vocabulary and ``outside`` [B, K] its mass off it (counted in the L1 distance:
        the drafter puts none there). Labels outside the draft vocab get no CE."""
        b, k = labels.shape
        mask = torch.ones_like(labels, dtype=torch.bool) if slot_mask is None else slot_mask
        labels = torch.where(mask, labels, torch.zeros_like(labels))
        prev = torch.cat([anchors.unsqueeze(1), labels[:, :-1]], 1)  # [B, K] target ids
        logits = self.corrected_logits(self.base_logits(h), prev)  # [B, K, Vd]
        slots = self.vocab_index()[labels]
        ce = F.cross_entropy(logits.flatten(0, 1), slots.clamp_min(0).flatten(),
                             reduction="none").view(b, k) * (slots >= 0)
        l1 = (torch.softmax(logits, -1) - probs_d.float()).abs().sum(-1) + outside.float()
        c_star = (1 - 0.5 * l1).detach().clamp(0, 1)
        z = self.confidence_logits(h, prev)
        bce = F.binary_cross_entropy_with_logits(z, c_star, reduction="none")
        w = torch.exp(-torch.arange(k, device=labels.device, dtype=torch.float32) / SLOT_DECAY)
        w = w.unsqueeze(0) * mask.float()  # [B, K]
        denom = w.sum().clamp_min(1e-9)
        parts = {n: (w * t).sum() / denom for n, t in (("ce", ce), ("l1", l1), ("bce", bce))}
        total = CE_WEIGHT * parts["ce"] + L1_WEIGHT * parts["l1"] + BCE_WEIGHT * parts["bce"]
        return total, {n: t.detach() for n, t in parts.items()}

    # ---- shared-context training path ------------------------------------------------------
    def backbone_shared(self, taps: torch.Tensor, anchors: torch.Tensor,
                        anchor_pos: torch.Tensor) -> torch.Tensor:
        """Block states for many anchors of ONE sequence at once.

        taps [L, m*d] are the sequence's tap rows at positions 0..L-1; anchors [A] and
        anchor_pos [A]. Equal to ``backbone`` with each anchor's own window of rows,
        but the context fusion and each layer's context K/V are computed once per
        sequence instead of once per anchor (the training hot path).
        """
        if self._embed is None:
            raise RuntimeError("DSparkDrafter: call bind_target/bind_llama first")
        c, dt = self.config, self.dtype
        a, k, d, n = anchors.shape[0], c.block_size, c.hidden_size, taps.shape[0]
        dev = taps.device
        ctx = F.rms_norm(F.linear(taps.to(dt), self.fc), (d,), self.ctx_norm, c.rms_norm_eps)
        pos = torch.arange(n, device=dev)
        ap = anchor_pos.unsqueeze(1)
        valid = (pos.unsqueeze(0) < ap) & (pos.unsqueeze(0) >= ap - c.context_window)  # [A, L]
        x = torch.cat([F.embedding(anchors.unsqueeze(1), self._embed).to(dt),
                       self.mask_embed.expand(a, k - 1, d)], 1)
        blk_pos = ap + torch.arange(k, device=dev)
        rope_blk, rope_ctx = self._rope(blk_pos), self._rope(pos)
        for layer in self.layers:
            x = layer.forward_shared(x, ctx, rope_blk, rope_ctx, valid)
        return F.rms_norm(x, (d,), self.norm, c.rms_norm_eps)
