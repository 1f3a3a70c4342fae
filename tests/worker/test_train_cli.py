"""`dspark train-drafter` as a command: warm start from a checkpoint, device errors."""
from __future__ import annotations

import gzip
import json
import random

import pytest
import torch
from safetensors.torch import load_file

from dspark.shared.cli import main as dspark_main

from .conftest import write_tiny_llama


def _shard(data_dir, n: int = 6, seed: int = 0, n_held: int = 1) -> None:
    rnd = random.Random(seed)
    data_dir.mkdir(parents=True)
    with gzip.open(data_dir / "shard-0000.jsonl.gz", "wt", encoding="utf-8") as f:
        for i in range(n):
            rec = {"id": f"p:{i}", "split": "heldout" if i < n_held else "train",
                   "prompt_ids": [rnd.randrange(3, 97) for _ in range(12)],
                   "output_ids": [rnd.randrange(3, 97) for _ in range(40)]}
            f.write(json.dumps(rec) + "\n")


def _args(model, data, out, *extra, arch: bool = True):
    """Command line of a tiny run; arch=False leaves out the architecture flags."""
    return ["train-drafter", "--model", str(model), "--data", str(data), "--out", str(out),
            "--threads", "1", "--eval-anchors", "0", "--batch-anchors", "8",
            *(["--tap-layer-ids", "0", "1", "2", "--draft-vocab-size", "0"] if arch else []),
            *extra]


@pytest.fixture
def tiny(tmp_path):
    model = write_tiny_llama(tmp_path / "tiny")
    _shard(tmp_path / "data")
    return model, tmp_path / "data"


def test_init_from_takes_the_weights_and_keeps_training(tiny, tmp_path):
    model, data = tiny
    a, b = tmp_path / "a", tmp_path / "b"
    assert dspark_main(_args(model, data, a, "--max-steps", "3")) == 0
    base = load_file(str(a / "drafter.safetensors"))
    # zero steps from the warm start: the same weights as the source checkpoint
    assert dspark_main(_args(model, data, b, "--max-steps", "0", "--init-from", str(a),
                             arch=False)) == 0
    same = load_file(str(b / "drafter.safetensors"))
    assert base.keys() == same.keys()
    assert all(torch.equal(base[k], same[k]) for k in base)
    # more steps from it move the weights (it trains, it does not restart fresh)
    c = tmp_path / "c"
    assert dspark_main(_args(model, data, c, "--max-steps", "2", "--init-from", str(a),
                             arch=False)) == 0
    moved = load_file(str(c / "drafter.safetensors"))
    assert any(not torch.equal(base[k], moved[k]) for k in base)


def test_init_from_refuses_architecture_flags(tiny, tmp_path, capsys):
    model, data = tiny
    a = tmp_path / "a"
    assert dspark_main(_args(model, data, a, "--max-steps", "1")) == 0
    rc = dspark_main(_args(model, data, tmp_path / "b", "--max-steps", "1",
                           "--init-from", str(a)))
    assert rc == 2
    assert "--init-from takes the architecture" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_is_a_clear_error(tiny, tmp_path, capsys):
    model, data = tiny
    rc = dspark_main(_args(model, data, tmp_path / "a", "--max-steps", "1",
                           "--device", "cuda"))
    assert rc == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "cuda" in err.lower()
    assert not (tmp_path / "a").exists()


def test_take_tokens_is_a_seeded_whole_record_subset():
    from dspark.worker.training.cli import take_tokens

    recs = [{"id": i, "output_ids": [0] * (10 + i)} for i in range(20)]
    a = take_tokens(recs, 100, seed=3)
    assert a == take_tokens(recs, 100, seed=3)
    n = sum(len(r["output_ids"]) for r in a)
    # whole records, stopping at the first that reaches the budget
    assert 100 <= n < 100 + 30 and n - len(a[-1]["output_ids"]) < 100
    assert [r["id"] for r in a] != [r["id"] for r in take_tokens(recs, 100, seed=4)]
    assert take_tokens(recs, 0) == []
    assert len(take_tokens(recs, 10**6)) == 20


def test_more_data_folders_add_training_sequences_not_heldout_ones(tiny, tmp_path, capsys):
    model, data = tiny
    extra = tmp_path / "sampled"
    _shard(extra, n=9, seed=1, n_held=3)  # 6 training, 3 held-out sequences
    assert dspark_main(_args(model, data, tmp_path / "a", "--data", str(extra),
                             "--max-steps", "1")) == 0
    # the first folder's 5 + the second's 6 are trained on; held out: the first's 1
    assert "11 training / 1 held-out sequences" in capsys.readouterr().err
    # one folder alone: its own split
    assert dspark_main(_args(model, data, tmp_path / "b", "--max-steps", "1")) == 0
    assert "5 training / 1 held-out sequences" in capsys.readouterr().err
    # a folder named twice weighs twice: its training sequences are drawn from twice
    assert dspark_main(_args(model, data, tmp_path / "c", "--data", str(extra), "--data",
                             str(extra), "--max-steps", "1")) == 0
    assert "17 training / 1 held-out sequences" in capsys.readouterr().err


def test_data_budget_stops_the_run(tiny, tmp_path):
    model, data = tiny
    out = tmp_path / "stats.json"
    # no step or time limit: the data budget alone ends it (40 labelled tokens per
    # sequence, 2 sequences per step -> one step reaches 50)
    assert dspark_main(_args(model, data, tmp_path / "a", "--max-data-tokens", "50",
                             "--anchor-stride", "4", "--json", str(out))) == 0
    stats = json.loads(out.read_text())
    assert stats["data_tokens"] == 80 and stats["steps"] == 1


def test_selfgen_cap_zero_needs_another_source(tiny, tmp_path, capsys):
    model, data = tiny
    rc = dspark_main(_args(model, data, tmp_path / "a", "--max-steps", "1",
                           "--selfgen-tokens", "0"))
    assert rc == 1
    assert "no training data" in capsys.readouterr().err


def test_selfgen_cap_limits_the_sequences(tiny, tmp_path):
    model, data = tiny
    out = tmp_path / "stats.json"
    # 5 training records of 40 tokens; a cap of 60 keeps 2 of them
    assert dspark_main(_args(model, data, tmp_path / "a", "--max-steps", "1",
                             "--selfgen-tokens", "60", "--json", str(out))) == 0
    assert json.loads(out.read_text())["sequences"] == 2


def test_draft_vocab_from_another_checkpoint(tiny, tmp_path, capsys):
    model, data = tiny
    a, b = tmp_path / "a", tmp_path / "b"
    assert dspark_main(["train-drafter", "--model", str(model), "--data", str(data),
                        "--out", str(a), "--threads", "1", "--eval-anchors", "0",
                        "--batch-anchors", "8", "--tap-layer-ids", "0", "1", "2",
                        "--draft-vocab-size", "24", "--max-steps", "1"]) == 0
    vocab_a = load_file(str(a / "drafter.safetensors"))["draft_vocab"]
    # other data: its own most frequent tokens would differ; the given vocabulary wins
    other = tmp_path / "other"
    _shard(other, seed=7)
    assert dspark_main(["train-drafter", "--model", str(model), "--data", str(other),
                        "--out", str(b), "--threads", "1", "--eval-anchors", "0",
                        "--batch-anchors", "8", "--tap-layer-ids", "0", "1", "2",
                        "--draft-vocab-from", str(a), "--max-steps", "1"]) == 0
    assert torch.equal(load_file(str(b / "drafter.safetensors"))["draft_vocab"], vocab_a)
    # a size that disagrees, and a full-vocabulary source, are clear errors
    rc = dspark_main(["train-drafter", "--model", str(model), "--data", str(other),
                      "--out", str(tmp_path / "c"), "--threads", "1", "--eval-anchors", "0",
                      "--tap-layer-ids", "0", "1", "2", "--draft-vocab-size", "30",
                      "--draft-vocab-from", str(a), "--max-steps", "1"])
    assert rc == 2 and "holds 24 tokens" in capsys.readouterr().err
    full = tmp_path / "full"
    assert dspark_main(_args(model, data, full, "--max-steps", "1")) == 0
    rc = dspark_main(["train-drafter", "--model", str(model), "--data", str(data),
                      "--out", str(tmp_path / "d"), "--threads", "1",
                      "--draft-vocab-from", str(full), "--max-steps", "1"])
    assert rc == 2 and "full vocabulary" in capsys.readouterr().err
    rc = dspark_main(["train-drafter", "--model", str(model), "--data", str(data),
                      "--out", str(tmp_path / "e"), "--threads", "1",
                      "--draft-vocab-from", str(tmp_path / "missing"), "--max-steps", "1"])
    assert rc == 2 and "cannot read" in capsys.readouterr().err


def test_offline_commands_share_their_setup(tiny_model_dir, monkeypatch):
    """--threads caps torch's threads; a --model is used as given (nothing prepared)."""
    import argparse

    import torch

    import dspark.worker.convert as convert
    from dspark.worker.training.setup import prepare_offline

    called = []
    monkeypatch.setattr(convert, "prepare_default_model", lambda: called.append(1))
    before = torch.get_num_threads()
    try:
        got = prepare_offline(argparse.Namespace(model=str(tiny_model_dir), threads=1))
        assert got == tiny_model_dir and torch.get_num_threads() == 1 and not called
        prepare_offline(argparse.Namespace(model=""))  # no --threads: left alone
        assert called == [1] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_feature_dtype_bfloat16_trains_and_says_so(tiny, tmp_path, capsys):
    model, data = tiny
    out = tmp_path / "a"
    assert dspark_main(_args(model, data, out, "--max-steps", "3",
                             "--feature-dtype", "bfloat16")) == 0
    err = capsys.readouterr().err
    assert "training features in bfloat16" in err and "held-out features stay float32" in err
    assert (out / "drafter.safetensors").is_file()
    with pytest.raises(SystemExit):  # argparse: only the two dtypes
        dspark_main(_args(model, data, tmp_path / "b", "--feature-dtype", "float16"))
