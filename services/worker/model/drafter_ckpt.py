"""Drafter checkpoint: ``drafter.safetensors`` + ``drafter_config.json``.

The target's frozen embedding and LM head are not stored. Loading checks the
checkpoint against the target it will serve and refuses, with a ValueError that
names the mismatch, a drafter trained for another target, an impossible tap
layer, a block size smaller than the one asked for, and missing, misshapen or
unreadable tensors.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .drafter import DrafterConfig, DSparkDrafter

WEIGHTS_FILE = "drafter.safetensors"
CONFIG_FILE = "drafter_config.json"


def save_drafter(directory: Path | str, drafter: DSparkDrafter,
                 config: DrafterConfig | None = None) -> Path:
    """Write the drafter's own tensors and config; returns the directory."""
    from safetensors.torch import save_file

    config = drafter.config if config is None else config
    if config != drafter.config:
        raise ValueError("save_drafter: config differs from the drafter's own config")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.detach().contiguous().cpu() for n, t in drafter.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_FILE))
    (directory / CONFIG_FILE).write_text(config.to_json())
    return directory


def check_target(config: DrafterConfig, target_info: dict,
                 max_block_size: int | None = None) -> None:
    """Raise ValueError if the checkpoint's config does not fit the target."""
    t = target_info
    if config.target_model_id != t["model_id"]:
        raise ValueError(f"drafter was trained for target {config.target_model_id!r}, "
                         f"not {t['model_id']!r}")
    if config.target_vocab_size != t["vocab_size"]:
        raise ValueError(f"drafter vocab_size {config.target_vocab_size} != target "
                         f"vocab_size {t['vocab_size']}")
    if config.target_hidden_size != t["hidden_size"]:
        raise ValueError(f"drafter hidden_size {config.target_hidden_size} != target "
                         f"hidden_size {t['hidden_size']}")
    n = t["num_layers"]
    for i in config.target_layer_ids:
        if not 0 <= i < n:
            raise ValueError(f"drafter tap layer {i} is out of range for a target with "
                             f"{n} layers (target_layer_ids={list(config.target_layer_ids)})")
        if i == n - 1:
            raise ValueError(f"drafter tap layer {i} is the target's final layer "
                             f"(num_layers={n}); taps must be non-final layers")
    if config.target_num_layers != n:
        raise ValueError(f"drafter target num_layers {config.target_num_layers} != target "
                         f"num_layers {n}")
    if max_block_size is not None and max_block_size > config.block_size:
        raise ValueError(f"requested block size K={max_block_size} exceeds the drafter "
                         f"checkpoint's block_size={config.block_size}")


def load_drafter(directory: Path | str, target_info: dict) -> DSparkDrafter:
    """Load and validate a drafter for a target.

    target_info: model_id, vocab_size, hidden_size, num_layers, dtype, device and
    optionally max_block_size (the K the server will ask for). The returned
    drafter still needs ``bind_target``/``bind_llama``.
    """
    from safetensors import safe_open

    directory = Path(directory)
    cfg_path, w_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"drafter checkpoint lacks {p}")
    try:
        config = DrafterConfig.from_json(cfg_path.read_text())
    except ValueError as e:
        raise ValueError(f"{cfg_path}: {e}") from None
    check_target(config, target_info, target_info.get("max_block_size"))

    with torch.device("meta"):  # shapes only; real tensors come from the file
        drafter = DSparkDrafter(config)
    want = {n: tuple(t.shape) for n, t in drafter.state_dict().items()}
    dtype, device = target_info["dtype"], torch.device(target_info["device"])
    tensors: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(w_path), framework="pt") as f:
            names = set(f.keys())
            for name, shape in want.items():
                if name not in names:
                    raise ValueError(f"{w_path}: missing tensor {name!r} (expected shape "
                                     f"{list(shape)})")
                got = tuple(f.get_slice(name).get_shape())
                if got != shape:
                    raise ValueError(f"{w_path}: tensor {name!r} has shape {list(got)}, "
                                     f"expected {list(shape)}")
                t = f.get_tensor(name)
                # float weights take the serving dtype; index buffers (draft_vocab) stay
                tensors[name] = t.to(dtype=dtype if t.is_floating_point() else t.dtype,
                                     device=device)
    except ValueError:
        raise
    except Exception as e:  # safetensors' SafetensorError, OSError on a truncated file
        raise ValueError(f"{w_path}: corrupt or truncated safetensors file ({e})") from None
    extra = sorted(names - set(want))
    if extra:
        raise ValueError(f"{w_path}: unexpected tensors {extra} (another drafter layout?)")
    drafter = drafter.to_empty(device=device).to(dtype)
    drafter.load_state_dict(tensors, strict=True)
    if drafter.draft_vocab is not None:
        ids = drafter.draft_vocab
        if int(ids.min()) < 0 or int(ids.max()) >= config.target_vocab_size or \
                torch.unique(ids).numel() != ids.numel():
            raise ValueError(f"{w_path}: draft_vocab must hold {ids.numel()} distinct ids "
                             f"in [0, {config.target_vocab_size})")
    return drafter.eval()


def export_drafter(src: Path | str, dst: Path | str, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Copy a trained checkpoint's drafter (not its train state) to ``dst`` with float
    tensors stored in ``dtype`` (bf16 halves the file; loading casts to the serving
    dtype anyway)."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    config = DrafterConfig.from_json((src / CONFIG_FILE).read_text())  # validates
    tensors = load_file(str(src / WEIGHTS_FILE))
    out = {n: (t.to(dtype) if t.is_floating_point() else t).contiguous()
           for n, t in tensors.items()}
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / WEIGHTS_FILE))
    (dst / CONFIG_FILE).write_text(config.to_json())
    return dst
