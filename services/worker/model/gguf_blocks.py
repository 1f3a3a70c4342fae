"""A model's matrices from its GGUF blocks (``native_linear.GgufWeight``).

The default model's conversion (``convert.py``) keeps the quantized matrices'
blocks beside the dense float32 weights, in ``GGUF_BLOCKS``. Where the native
fp32 linear runs, ``load_llama`` hands them to ``Llama``, which packs those
matrices from their blocks instead of the dense copy: the same float32 values
(``native/linear_gguf.cpp``), a fifth of the bytes. README "Linear layers from
the GGUF blocks".
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..convert import GGUF_BLOCKS  # beside the weights


def gguf_weights_unavailable(model_dir: Path, dtype: torch.dtype, device: torch.device,
                             pack: bool, rows_linear) -> str:
    """Why a model cannot compute from GGUF blocks here ("" when it can)."""
    if not (Path(model_dir) / GGUF_BLOCKS).is_file():
        return f"{model_dir} has no {GGUF_BLOCKS} (only a model converted from GGUF has one)"
    if not pack or dtype != torch.float32 or device.type != "cpu" or \
            not hasattr(rows_linear, "pack_gguf"):
        return "only the native fp32 CPU linear computes from GGUF blocks (dtype float32, " \
               "linear auto or native, kernels built)"
    return ""


def gguf_blocks(model_dir: Path, args, w: dict[str, torch.Tensor], dtype: torch.dtype,
                device: torch.device, pack: bool, rows_linear,
                mode: str) -> dict[str, tuple[torch.Tensor, int]] | None:
    """For ``load_llama`` (``args``: its LlamaArgs; ``w``: its fused dense weights;
    ``mode``: WorkerConfig.gguf_weights): the fused matrices' GGUF blocks, keyed
    like ``w`` ("{i}.wqkv", "lm_head"):
    (raw blocks [rows, bytes], kind) for each matrix all of whose parts have
    blocks of one type; None when not used."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"gguf_weights={mode!r} is invalid: must be one of auto, on, off")
    if mode == "off":
        return None
    why = gguf_weights_unavailable(model_dir, dtype, device, pack, rows_linear)
    if why:
        if mode == "on":
            raise ValueError(f"gguf_weights='on' is unavailable: {why}")
        return None
    from safetensors import safe_open

    from .native_linear import dequantize_gguf, gguf_kind

    with safe_open(str(Path(model_dir) / GGUF_BLOCKS), framework="pt") as f:
        types = json.loads((f.metadata() or {}).get("gguf_types", "{}"))
        raw = {name: (f.get_tensor(name), gguf_kind(types[name])) for name in f.keys()}
    parts = {"lm_head": ["lm_head.weight" if "lm_head" in w else "model.embed_tokens.weight"]}
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        parts[f"{i}.wqkv"] = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
        parts[f"{i}.wo"] = [p + "self_attn.o_proj.weight"]
        parts[f"{i}.w13"] = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
        parts[f"{i}.w2"] = [p + "mlp.down_proj.weight"]
    out = {}
    for key, names in parts.items():
        if not all(n in raw for n in names) or len({raw[n][1] for n in names}) != 1:
            continue
        kind = raw[names[0]][1]
        dense = w["embed" if key == "lm_head" and "lm_head" not in w else key]
        row0 = 0
        for n in names:  # each part's first and last 16 rows (another conversion differs)
            part = raw[n][0]
            for rows in (slice(0, 16), slice(-16, None)):
                ref = dense[row0:row0 + part.shape[0]][rows].float().cpu()
                if not torch.equal(dequantize_gguf(part[rows], kind), ref):
                    raise ValueError(f"{model_dir / GGUF_BLOCKS} does not match the model's "
                                     f"weights ({', '.join(names)}): convert the model again "
                                     "(`dspark model prepare`)")
            row0 += part.shape[0]
        blocks = torch.cat([raw[n][0] for n in names]) if len(names) > 1 else raw[names[0]][0]
        out[key] = (blocks.contiguous(), kind)
    if mode == "on" and not out:
        raise ValueError(f"gguf_weights='on' is unavailable: no matrix of {model_dir} has "
                         "GGUF blocks of a type the kernel reads")
    return out
