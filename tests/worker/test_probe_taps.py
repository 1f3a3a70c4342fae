"""The tap-layer probe: its regression recovers a linear relation, it runs end to end
on a tiny target, and bad layer sets are refused naming the flag."""
from __future__ import annotations

import random

import pytest
import torch

from dspark.worker.training.probe_taps import parse_sets, probe_accuracy, run_probe


def test_probe_recovers_a_linear_relation_and_not_noise():
    g = torch.Generator().manual_seed(0)
    vocab, d, f, n = 40, 32, 24, 3000
    out_rows = torch.randn(vocab, d, generator=g)
    x = torch.randn(n, f, generator=g)
    # the goal is what the output rows read off a linear map of x
    goals = (x @ torch.randn(f, d, generator=g) @ out_rows.T).argmax(-1)
    acc = probe_accuracy(x[:2000], goals[:2000], x[2000:], goals[2000:], out_rows, lam=1e-4)
    noise = torch.randn(n, f, generator=g)  # features that say nothing about the goals
    chance = probe_accuracy(noise[:2000], goals[:2000], noise[2000:], goals[2000:], out_rows,
                            lam=1e-4)
    assert acc > 0.35 and chance < 0.12  # measured 0.46 and 0.06 (chance level 1/40)


def test_run_probe_on_a_tiny_target(target):
    rnd = random.Random(0)
    seqs = [(8, [rnd.randrange(3, 97) for _ in range(60)]) for _ in range(8)]
    res = run_probe(target, seqs, [(0, 1, 2), (1,), (2,)], max_positions=400,
                    log=open("/dev/null", "w"))
    assert res["positions"] == 8 * (60 - 3 - 8)
    assert res["train_positions"] + res["test_positions"] == res["positions"]
    assert [sorted(r["layers"]) for r in res["sets"]] != []
    means = [r["mean"] for r in res["sets"]]
    assert means == sorted(means, reverse=True)
    for r in res["sets"]:
        assert len(r["accuracy"]) == 3 and all(0.0 <= a <= 1.0 for a in r["accuracy"])
    assert len(res["anchor_only"]) == 3


@pytest.mark.parametrize("spec", ["3", "a,b", "", "-1"])
def test_bad_sets_are_refused(spec):
    with pytest.raises(ValueError, match="--sets"):
        parse_sets([spec], num_layers=4)
