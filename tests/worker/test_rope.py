"""llama3 RoPE scaling against transformers' own implementation."""
from __future__ import annotations

import pytest
import torch

from dspark.worker.model.llama import LlamaArgs, rope_inv_freq

from .conftest import TINY


def test_llama3_inv_freq_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = dict(TINY, model_type="llama", rope_scaling=scaling)
    hf_cfg = transformers.LlamaConfig(**cfg)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, torch.device("cpu"))
    got = rope_inv_freq(LlamaArgs.from_hf_config(cfg))
    torch.testing.assert_close(got, want.float())
