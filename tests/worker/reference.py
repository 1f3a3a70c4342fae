"""A naive dense Llama forward (no cache, no fusion) used as the test oracle."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file


def load_weights(model_dir: Path) -> tuple[dict, dict]:
    cfg = json.loads((model_dir / "config.json").read_text())
    w = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        w.update(load_file(str(f)))
    return cfg, {k: v.float() for k, v in w.items()}


def dense_forward(cfg: dict, w: dict, tokens: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """-> logits [n, V], hidden states after each layer (list of [n, d])."""
    n = len(tokens)
    h, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]

    def rms(x, g):
        return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(n).float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(x):  # [heads, n, hd]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    hidden = []
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        xn = rms(x, w[p + "input_layernorm.weight"])
        q = (xn @ w[p + "self_attn.q_proj.weight"].T).view(n, h, hd).transpose(0, 1)
        k = (xn @ w[p + "self_attn.k_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
        v = (xn @ w[p + "self_attn.v_proj.weight"].T).view(n, kv, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(h // kv, 0), v.repeat_interleave(h // kv, 0)
        s = (q @ k.transpose(1, 2)) / hd ** 0.5
        a = torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v
        x = x + a.transpose(0, 1).reshape(n, h * hd) @ w[p + "self_attn.o_proj.weight"].T
        xn = rms(x, w[p + "post_attention_layernorm.weight"])
        g = xn @ w[p + "mlp.gate_proj.weight"].T
        u = xn @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
        hidden.append(x)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rms(x, w["model.norm.weight"]) @ head.T, hidden


def _chi2_sf(x: float, dof: int) -> float:
    """Chi-square survival function (Wilson-Hilferty normal approximation)."""
    z = ((x / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def two_token_fit(model_dir: Path, prompt: list[int], temp: float,
                  outputs) -> tuple[float, float, int]:
    """Chi-square goodness of fit of the first two generated tokens of ``outputs``
    (one token list per seed) against the tiny model's exact joint P(t1, t2) at
    ``temp`` (reference forward). Returns (p-value, chi2, degrees of freedom); cells
    expected below 5 are pooled."""
    cfg, w = load_weights(model_dir)
    v = cfg["vocab_size"]
    p1 = torch.softmax(dense_forward(cfg, w, prompt)[0][-1] / temp, -1)
    logits2 = torch.stack([dense_forward(cfg, w, prompt + [t])[0][-1] for t in range(v)])
    joint = p1[:, None] * torch.softmax(logits2 / temp, -1)  # [V, V]
    counts = torch.zeros(v, v)
    for toks in outputs:
        counts[toks[0], toks[1]] += 1
    exp, obs = joint.flatten() * len(outputs), counts.flatten()
    big = exp >= 5
    e = torch.cat([exp[big], exp[~big].sum().unsqueeze(0)])
    o = torch.cat([obs[big], obs[~big].sum().unsqueeze(0)])
    chi2 = float(((o - e) ** 2 / e).sum())
    dof = int(big.sum())
    return _chi2_sf(chi2, dof), chi2, dof
