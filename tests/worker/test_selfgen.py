"""Drafter data generation: the offline engine equals one-at-a-time decoding,
generation is resumable and its held-out split is stable."""
from __future__ import annotations

import gzip
import json

from dspark.shared.config import WorkerConfig
from dspark.shared.types import SamplingParams, SeqStep, StepPlan
from dspark.worker.runner import ModelRunner
from dspark.worker.training.engine import OfflineEngine
from dspark.worker.training.selfgen import GenConfig, generate, read_records, split_of


class FakeTokenizer:
    """Characters -> ids inside the tiny model's vocabulary."""

    def apply_chat_template(self, messages):
        return "<u>" + messages[0]["content"]

    def encode(self, text):
        return [3 + ord(c) % 90 for c in text]


def _runner(tiny_model_dir):
    return ModelRunner(WorkerConfig(model=str(tiny_model_dir), dtype="float32", block_size=8,
                                    num_kv_blocks=256, tap_layer_ids=()))


def _alone(runner, prompt, n):
    blocks = list(range(200, 200 + (len(prompt) + n) // 8 + 1))
    out = runner.step(StepPlan(0, [SeqStep("x", prompt, 0, blocks, True)])).outputs[0].token_id
    toks = [out]
    while len(toks) < n:
        pos = len(prompt) + len(toks) - 1
        toks.append(runner.step(StepPlan(0, [SeqStep("x", [toks[-1]], pos, blocks, True)]))
                    .outputs[0].token_id)
    runner.release(["x"])
    return toks


def test_offline_engine_matches_one_at_a_time(tiny_model_dir):
    runner = _runner(tiny_model_dir)
    prompts = {f"p{i}": [5 + i, 9, 11 + 2 * i, 4] * (i + 1) for i in range(5)}
    engine = OfflineEngine(runner, max_num_seqs=3, max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=7, ignore_eos=True)
    got = {rid: toks for rid, toks, _ in engine.generate(
        (rid, p, params) for rid, p in prompts.items())}
    assert set(got) == set(prompts)
    for rid, p in prompts.items():
        assert got[rid] == _alone(runner, p, 7), rid
    assert engine.tokens_generated == 35


class _Clock:
    """time.monotonic for the engine: each call advances one tick."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_a_deadline_cuts_running_answers_and_drops_the_queue(tiny_model_dir, monkeypatch):
    import dspark.worker.training.engine as engine_mod

    runner = _runner(tiny_model_dir)
    prompts = {f"p{i}": [5 + i, 9, 11 + 2 * i, 4] * 2 for i in range(6)}
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    full = {rid: toks for rid, toks, _ in OfflineEngine(runner, max_num_seqs=2).generate(
        (rid, p, params) for rid, p in prompts.items())}
    clock = _Clock()
    monkeypatch.setattr(engine_mod.time, "monotonic", clock)
    engine = OfflineEngine(runner, max_num_seqs=2, max_num_batched_tokens=64)
    got = list(engine.generate(((rid, p, params) for rid, p in prompts.items()), deadline=6.0))
    # two answers run (batch 2), two more wait; at the deadline the running ones
    # are cut with what they have, the queued ones are dropped unanswered
    assert [f for _, _, f in got] == ["DEADLINE", "DEADLINE"]
    for rid, toks, _ in got:
        assert 0 < len(toks) < 12 and toks == full[rid][:len(toks)], rid
    assert not engine.core.has_unfinished()
    assert engine.core.allocator.num_free == engine.core.allocator.num_total
    assert clock.t < 12  # no step ran after the deadline


def test_generation_time_budget_is_a_hard_stop(tiny_model_dir, tmp_path, monkeypatch):
    import dspark.worker.training.engine as engine_mod
    import dspark.worker.training.selfgen as selfgen_mod

    runner = _runner(tiny_model_dir)
    prompts = [(f"set:{i}", f"question number {i}") for i in range(8)]
    clock = _Clock()
    monkeypatch.setattr(engine_mod.time, "monotonic", clock)
    monkeypatch.setattr(selfgen_mod.time, "monotonic", clock)
    s1 = generate(runner, FakeTokenizer(), prompts, tmp_path,
                  GenConfig(max_tokens=40, batch=2, time_budget_s=8))
    recs = list(read_records(tmp_path))
    assert s1["prompts_done"] == len(recs) == s1["cut_at_deadline"] == 2
    assert all(r["finish"] == "DEADLINE" and 0 < len(r["output_ids"]) < 40 for r in recs)
    # the dropped prompts are still to do: a later run answers exactly those
    monkeypatch.undo()
    s2 = generate(runner, FakeTokenizer(), prompts, tmp_path, GenConfig(max_tokens=4, batch=4))
    assert s2["prompts_done"] == 6 and s2["cut_at_deadline"] == 0
    assert sorted(r["id"] for r in read_records(tmp_path)) == sorted(p for p, _ in prompts)


def test_generation_is_resumable(tiny_model_dir, tmp_path):
    runner = _runner(tiny_model_dir)
    prompts = [(f"set:{i}", f"question number {i}") for i in range(6)]
    cfg = GenConfig(max_tokens=5, batch=4, limit=4)
    s1 = generate(runner, FakeTokenizer(), prompts, tmp_path, cfg)
    assert s1["prompts_done"] == 4
    s2 = generate(runner, FakeTokenizer(), prompts, tmp_path, GenConfig(max_tokens=5, batch=4))
    assert s2["prompts_done"] == 2  # only the ones not done before
    recs = list(read_records(tmp_path))
    assert sorted(r["id"] for r in recs) == sorted(p for p, _ in prompts)
    assert all(r["split"] == split_of(r["id"]) for r in recs)
    assert all(len(r["output_ids"]) <= 5 and r["prompt_ids"] for r in recs)
    assert len(list(tmp_path.glob("shard-*.jsonl.gz"))) == 2


def test_a_shard_cut_short_keeps_its_complete_records(tmp_path):
    rec = {"id": "a:0", "split": "train", "prompt_ids": [1], "output_ids": [2], "finish": "STOP"}
    data = gzip.compress((json.dumps(rec) + "\n" + '{"id": "a:1", "spl').encode())
    (tmp_path / "shard-0000.jsonl.gz").write_bytes(data[:-8])  # no gzip trailer
    from dspark.worker.training.selfgen import done_ids

    assert "a:0" in done_ids(tmp_path)


def test_heldout_split_is_stable_and_small():
    ids = [f"x:{i}" for i in range(4000)]
    held = [i for i in ids if split_of(i) == "heldout"]
    assert 0.03 < len(held) / len(ids) < 0.07
    assert held == [i for i in ids if split_of(i) == "heldout"]


def test_prompts_with_unicode_line_separators_load(tmp_path):
    from dspark.worker.training.selfgen import load_prompts

    (tmp_path / "set.jsonl").write_text(
        json.dumps({"turns": ["a\u2028b"]}, ensure_ascii=False) + "\n"
        + json.dumps({"turns": ["c"]}) + "\n", encoding="utf-8")
    assert load_prompts(tmp_path) == [("set:0", "a\u2028b"), ("set:1", "c")]


def test_generation_runs_the_target_alone():
    """gen-drafter-data on the default model: the shipped drafter exists (so the
    default config would speculate with K = 7), but the data are the target's
    plain answers: K = 0, nothing of the drafter loaded."""
    import argparse

    from dspark.shared.config import WorkerConfig, shipped_drafter_dir
    from dspark.worker.training.selfgen import worker_config

    args = argparse.Namespace(model="", dtype="auto", device="cpu")
    default = WorkerConfig(model="", dtype="auto", device="cpu")
    if (shipped_drafter_dir(default.model_dir.name) / "drafter_config.json").is_file():
        assert default.speculation()[0] == 7  # what it would have done
    assert worker_config(args).speculation() == (0, None)


def test_train_drafter_command_runs_and_resumes(tiny_model_dir, tmp_path):
    from dspark.shared.cli import main

    runner = _runner(tiny_model_dir)
    prompts = [(f"set:{i}", f"question number {i} please") for i in range(40)]
    generate(runner, FakeTokenizer(), prompts, tmp_path / "data", GenConfig(max_tokens=12, batch=8))
    args = ["train-drafter", "--model", str(tiny_model_dir), "--data", str(tmp_path / "data"),
            "--out", str(tmp_path / "dr"), "--max-steps", "2", "--tap-layer-ids", "0", "1",
            "--block-size", "3", "--context-window", "8", "--markov-rank", "4",
            "--num-draft-layers", "1", "--batch-anchors", "4", "--eval-anchors", "8",
            "--json", str(tmp_path / "s.json")]
    assert main(args) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["steps"] == 2 and 1.0 <= s["heldout"]["tau"] <= 4.0
    assert (tmp_path / "dr" / "drafter.safetensors").is_file()
    args[args.index("--max-steps") + 1] = "3"
    assert main(args) == 0  # resumes from the saved state
    assert json.loads((tmp_path / "s.json").read_text())["steps"] == 3
