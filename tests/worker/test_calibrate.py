"""Confidence calibration (DSPARK.md 4.1): the temperature fit, the config field,
drafting with temperatures, rollouts through the real loop, and the CLI writing
a checkpoint."""
from __future__ import annotations

import json
import math

import pytest
import torch

from dspark.worker.model.drafter import DrafterConfig, DSparkDrafter
from dspark.worker.model.drafter_ckpt import load_drafter, save_drafter
from dspark.worker.runner import model_fingerprint
from dspark.worker.training.calibrate import (collect_rollouts, ece, fit_temperatures,
                                              survival, write_temperatures)

from .test_spec_runner import K, drafter_dir, runner  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def _chains(true_t, n=20000, seed=0):
    """Steps whose drafts survive with conditional probability sigmoid(z_k / T*_k)."""
    g = torch.Generator().manual_seed(seed)
    k = len(true_t)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2.0
    p = torch.sigmoid(z / torch.tensor(true_t, dtype=torch.float64))
    ok = torch.rand(n, k, generator=g, dtype=torch.float64) < p
    accepted = torch.cumprod(ok.long(), 1).sum(1)  # drafts accepted before the first miss
    return z, accepted


def test_ece_of_calibrated_and_of_biased_predictions():
    g = torch.Generator().manual_seed(1)
    pred = torch.rand(50000, generator=g, dtype=torch.float64)
    label = (torch.rand(50000, generator=g, dtype=torch.float64) < pred).double()
    assert ece(pred, label) < 0.01
    assert ece(torch.full((1000,), 0.9), torch.zeros(1000)) == pytest.approx(0.9)


def test_fit_recovers_the_temperatures_that_made_the_data():
    true_t = [3.0, 0.5, 1.0]
    z, accepted = _chains(true_t)
    temps, before, after = fit_temperatures(z, accepted)
    for got, want in zip(temps, true_t):
        assert got == pytest.approx(want, rel=0.15)
    assert after[0] < before[0] / 3 and after[1] < before[1]  # T_1 = 3 was far off 1
    assert all(e < 0.02 for e in after)
    # survival of k drafts is the product of the first k calibrated confidences
    # a position almost no step reaches keeps the previous temperature
    few = accepted.clamp(max=1)  # nobody accepts 2 drafts
    t_few, _, _ = fit_temperatures(z, few)
    assert t_few[1] == t_few[2] == t_few[0]
    a = survival(z, temps)
    assert torch.allclose(a[:, 1], torch.sigmoid(z[:, 0] / temps[0]) *
                          torch.sigmoid(z[:, 1] / temps[1]))


def test_config_field_validated_and_round_tripped(target, tiny_model_dir):
    cfg = DrafterConfig.for_target(target.args, model_fingerprint(tiny_model_dir),
                                   target_layer_ids=(0, 1, 2), block_size=3)
    with pytest.raises(ValueError, match="confidence_temperatures"):
        DrafterConfig.from_json(json.dumps({**json.loads(cfg.to_json()),
                                            "confidence_temperatures": [1.0, 2.0]}))
    with pytest.raises(ValueError, match="confidence_temperatures"):
        DrafterConfig.from_json(json.dumps({**json.loads(cfg.to_json()),
                                            "confidence_temperatures": [1.0, 0.0, 2.0]}))
    d = {**json.loads(cfg.to_json()), "confidence_temperatures": [1.5, 2.0, 0.5]}
    back = DrafterConfig.from_json(json.dumps(d))
    assert back.confidence_temperatures == (1.5, 2.0, 0.5)
    assert DrafterConfig.from_json(back.to_json()) == back


def test_drafting_applies_the_temperatures(target, tiny_model_dir):
    from dataclasses import replace

    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(target.args, model_fingerprint(tiny_model_dir),
                                   target_layer_ids=(0, 1, 2), block_size=3,
                                   context_window=16, markov_rank=8)
    dr = DSparkDrafter(cfg).bind_llama(target)
    with torch.no_grad():
        dr.conf_w.normal_(0, 0.5)
    args = (torch.randn(2, 5, 3 * target.args.hidden_size), torch.arange(5).repeat(2, 1),
            torch.tensor([5, 3]), torch.tensor([7, 9]), torch.tensor([5, 5]))
    plain = dr.draft(*args).confidences.double()
    dr.config = replace(cfg, confidence_temperatures=(2.0, 0.5, 1.0))
    scaled = dr.draft(*args).confidences.double()
    z = torch.log(plain / (1 - plain))
    want = torch.sigmoid(z / torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64))
    assert torch.allclose(scaled, want, atol=1e-5)
    assert not torch.allclose(scaled, plain, atol=1e-3)


def test_rollouts_and_write(tiny_model_dir, drafter_dir, tmp_path):  # noqa: F811
    import shutil
    import random

    r = runner(tiny_model_dir, drafter_dir, K)
    rnd = random.Random(0)
    prompts = [(f"p{i}", [rnd.randrange(3, 97) for _ in range(rnd.randrange(4, 20))])
               for i in range(4)]
    z, accepted = collect_rollouts(r, prompts, max_tokens=24, temperature=0.0)
    assert z.shape[1] == K and z.shape[0] == accepted.shape[0] > 4
    assert int(accepted.min()) >= 0 and int(accepted.max()) <= K
    assert torch.isfinite(z).all()
    # the runner is left as it was (no recording wrapper)
    assert "recording_step" not in getattr(r.step, "__qualname__", "")
    d = tmp_path / "d"
    shutil.copytree(drafter_dir, d)
    temps = [1.0 + i / 10 for i in range(K)]
    write_temperatures(d, temps)
    info = dict(model_id=model_fingerprint(tiny_model_dir), vocab_size=97, hidden_size=64,
                num_layers=4, dtype=torch.float32, device="cpu")
    assert load_drafter(d, info).config.confidence_temperatures == tuple(temps)
    with pytest.raises(ValueError, match="confidence_temperatures"):
        write_temperatures(d, [1.0])  # the wrong length is refused, the file kept
    assert load_drafter(d, info).config.confidence_temperatures == tuple(temps)
    assert math.isclose(json.loads((d / "drafter_config.json").read_text())
                        ["confidence_temperatures"][1], 1.1)


def test_training_drops_stale_temperatures(target, tiny_model_dir, tmp_path):
    from dspark.worker.training.train import TrainConfig, Trainer

    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(target.args, model_fingerprint(tiny_model_dir),
                                   target_layer_ids=(0, 1, 2), block_size=3,
                                   context_window=16, markov_rank=8,
                                   confidence_temperatures=(2.0, 2.0, 2.0))
    dr = DSparkDrafter(cfg)
    recs = [{"id": "a", "split": "train", "prompt_ids": list(range(3, 13)),
             "output_ids": list(range(20, 50))}]
    tr = Trainer(target, model_fingerprint(tiny_model_dir), recs,
                 TrainConfig(max_steps=1, batch_anchors=4), drafter=dr, log=open("/dev/null", "w"))
    assert tr.drafter.config.confidence_temperatures == ()
    out = save_drafter(tmp_path / "t", tr.drafter)
    assert json.loads((out / "drafter_config.json").read_text())["confidence_temperatures"] == []
