"""The converted default model against transformers (independent implementation)."""
from __future__ import annotations

import json

import pytest
import torch

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SeqStep, StepPlan
from dspark.worker.convert import is_complete, prepare_default_model
from dspark.worker.runner import ModelRunner

pytestmark = pytest.mark.model

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village,",
]
BS = 16


@pytest.fixture(scope="module")
def tok(default_model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_model(default_model_dir):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM.from_pretrained(str(default_model_dir),
                                                      torch_dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="module")
def runner(default_model_dir):
    return ModelRunner(WorkerConfig(model=str(default_model_dir), dtype="float32",
                                    num_kv_blocks=64, block_size=BS))


def test_prepare_is_idempotent(default_model_dir):
    assert is_complete(default_model_dir)
    mtime = (default_model_dir / "model.safetensors").stat().st_mtime
    assert prepare_default_model(default_model_dir, progress=False) == default_model_dir
    assert (default_model_dir / "model.safetensors").stat().st_mtime == mtime
    cfg = json.loads((default_model_dir / "config.json").read_text())
    dims = (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"])
    assert dims == (576, 30, 3)
    assert cfg["tie_word_embeddings"] is True


def test_tokenizer_round_trip_and_known_ids(tok):
    for text in PROMPTS + ["  spaces\tand\nnewlines 1234 ünïcödé 日本語 🙂"]:
        ids = tok.encode(text).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
    # special tokens are atomic; digits are split one by one (SmolLM pre-tokenizer)
    assert tok.encode("<|im_start|>user").ids[0] == 1
    assert tok.encode("<|im_end|>").ids == [2]
    assert tok.encode("2024").ids == [tok.token_to_id(c) for c in "2024"]
    assert tok.encode("Hello world").ids == [tok.token_to_id("Hello"), tok.token_to_id("Ġworld")]


# The default system prompt as SmolLM2's HF tokenizer encodes it (pinned).
SYSTEM_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
              7018, 411, 407, 19712, 8182, 2, 198]


def test_known_token_ids(tok):
    text = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
            "trained by Hugging Face<|im_end|>\n")
    assert tok.encode(text).ids == SYSTEM_IDS


def test_transformers_tokenizer_agrees(default_model_dir, tok):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(default_model_dir))
    assert (hf.eos_token_id, hf.bos_token_id) == (2, 1)
    text = hf.apply_chat_template([{"role": "user", "content": "Hi there 123"}],
                                  tokenize=False, add_generation_prompt=True)
    assert hf(text)["input_ids"] == tok.encode(text).ids
    assert tok.encode(text).ids[:len(SYSTEM_IDS)] == SYSTEM_IDS


def test_chat_template_renders(default_model_dir):
    import jinja2

    cfg = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|im_end|>"
    text = jinja2.Template(cfg["chat_template"]).render(
        messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def _run_prefill(runner, ids, rid):
    blocks = list(range(-(-(len(ids) + 80) // BS)))
    out = runner.step(StepPlan(0, [SeqStep(rid, ids, 0, blocks, sample=True)])).outputs[0]
    return out, blocks


def test_logits_match_transformers(runner, hf_model, tok):
    captured = []
    orig = runner.model.forward
    runner.model.forward = lambda *a, **k: captured.append(orig(*a, **k)) or captured[-1]
    try:
        for i, p in enumerate(PROMPTS):
            ids = tok.encode(p).ids
            _run_prefill(runner, ids, f"l{i}")
            runner.release([f"l{i}"])
            with torch.inference_mode():
                ref = hf_model(torch.tensor([ids])).logits[0, -1]
            ours = captured[-1][0]
            scale = ref.abs().max().item()
            assert (ours - ref).abs().max().item() < 1e-3 * max(scale / 10, 1.0), p  # ~2e-5 seen
    finally:
        runner.model.forward = orig


def test_greedy_generation_matches_transformers(runner, hf_model, tok):
    n_new = 64
    for i, p in enumerate(PROMPTS):
        ids = tok.encode(p).ids
        with torch.inference_mode():
            ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False,
                                    pad_token_id=2)[0, len(ids):].tolist()
        rid = f"g{i}"
        out, blocks = _run_prefill(runner, ids, rid)
        got = [out.token_id]
        pos = len(ids)
        while len(got) < n_new:
            o = runner.step(StepPlan(1, [SeqStep(rid, [got[-1]], pos, blocks, sample=True)]))
            got.append(o.outputs[0].token_id)
            pos += 1
        runner.release([rid])
        # transformers stops at EOS (id 2); we keep going, so compare its length
        assert len(ref) == n_new or ref[-1] == 2
        assert got[:len(ref)] == ref, p


def test_fresh_conversion_is_atomic_and_fast(tmp_path):
    import time

    dest = tmp_path / "m"
    (dest).mkdir()
    (dest / "junk").write_text("an interrupted earlier attempt")  # no marker: redone
    t0 = time.perf_counter()
    assert prepare_default_model(dest, progress=False) == dest
    assert time.perf_counter() - t0 < 60
    assert is_complete(dest) and not (dest / "junk").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    import shutil

    shutil.rmtree(dest)  # 0.5 GB
