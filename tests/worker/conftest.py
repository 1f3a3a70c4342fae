"""Worker test fixtures: a tiny random-weight Llama checkpoint (no model files)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
            rope_theta=10000.0, max_position_embeddings=256)


def write_tiny_llama(path: Path, seed: int = 0, tied: bool = False, shards: int = 1,
                     **overrides) -> Path:
    """A random Llama checkpoint in HF layout (config.json + safetensors shards)."""
    from safetensors.torch import save_file

    cfg = dict(TINY, **overrides)
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu",
               tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)
    g = torch.Generator().manual_seed(seed)
    d, i, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def r(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).contiguous()

    w = {"model.embed_tokens.weight": r(cfg["vocab_size"], d, scale=1.0),
         "model.norm.weight": 1 + r(d, scale=0.1)}
    if not tied:
        w["lm_head.weight"] = r(cfg["vocab_size"], d)
    for li in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{li}."
        w[p + "input_layernorm.weight"] = 1 + r(d, scale=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + r(d, scale=0.1)
        w[p + "self_attn.q_proj.weight"] = r(h * hd, d)
        w[p + "self_attn.k_proj.weight"] = r(kv * hd, d)
        w[p + "self_attn.v_proj.weight"] = r(kv * hd, d)
        w[p + "self_attn.o_proj.weight"] = r(d, h * hd)
        w[p + "mlp.gate_proj.weight"] = r(i, d)
        w[p + "mlp.up_proj.weight"] = r(i, d)
        w[p + "mlp.down_proj.weight"] = r(d, i)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    names = sorted(w)
    for s in range(shards):
        part = {n: w[n] for n in names[s::shards]}
        save_file(part, str(path / f"model-{s + 1:05d}-of-{shards:05d}.safetensors"))
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only add wake-up latency (25x on a busy
    2-core machine). Module-scoped; restores the thread count after."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    """The tiny random Llama loaded in fp32 (drafter and training tests)."""
    import torch

    from dspark.worker.model.llama import load_llama

    return load_llama(tiny_model_dir, torch.float32, torch.device("cpu"), max_len=64)
