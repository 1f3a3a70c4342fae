"""Sampler: greedy, top-k/top-p exclusion, seeded determinism, distribution."""
from __future__ import annotations

import pytest
import torch

from dspark.shared.rng import mix_seed
from dspark.worker import sampler as sampler_mod
from dspark.worker.model import native_attention
from dspark.worker.sampler import RowParams, _filtered_by_sort, _filtered_logits, sample


@pytest.fixture(params=["native", "python"])
def filter_path(request, monkeypatch):
    """Top-k / top-p and the draw through the native kernels (native/top_kp.cpp
    ``top_kp_filter``, ``sample_rows``) and through ``_kept`` + ``draw`` (no
    kernel built)."""
    if request.param == "python":
        monkeypatch.setattr(sampler_mod.native_attention, "load", lambda build=False: None)
    elif native_attention.load(build=True) is None:
        pytest.skip(f"native kernels unavailable: {native_attention.unavailable_reason()}")
    return request.param


def _logits(n=4, v=50, seed=0):
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_and_logprob_is_unmodified():
    lg = _logits()
    tok, lp = sample(lg, [RowParams()] * 4)
    assert tok.tolist() == lg.argmax(-1).tolist()
    torch.testing.assert_close(lp, torch.log_softmax(lg, -1).gather(1, tok[:, None])[:, 0])


def test_top_k_one_and_tiny_top_p_are_greedy(filter_path):
    lg = _logits(seed=1)
    for p in (RowParams(temperature=2.0, top_k=1, seed=3),
              RowParams(temperature=2.0, top_p=1e-6, seed=3)):
        for pos in range(20):
            tok, _ = sample(lg, [RowParams(p.temperature, p.top_k, p.top_p, p.seed, pos)] * 4)
            assert tok.tolist() == lg.argmax(-1).tolist()


def test_logprob_under_unmodified_distribution_when_sampling(filter_path):
    lg = _logits(seed=2)
    tok, lp = sample(lg, [RowParams(temperature=0.5, top_k=5, seed=1, position=7)] * 4)
    torch.testing.assert_close(lp, torch.log_softmax(lg, -1).gather(1, tok[:, None])[:, 0])


def test_seed_determinism_and_position_dependence(filter_path):
    lg = _logits(1, 1000, seed=3).expand(1, 1000)
    draw = lambda seed, pos: sample(lg, [RowParams(1.0, 0, 1.0, seed, pos)])[0].item()  # noqa
    assert [draw(5, p) for p in range(10)] == [draw(5, p) for p in range(10)]
    assert len({draw(s, 3) for s in range(20)}) > 5
    assert len({draw(5, p) for p in range(20)}) > 5
    # a row's sample does not depend on which other rows share the batch
    lg2 = _logits(3, 1000, seed=4)
    lg2[1] = lg[0]
    rows = [RowParams(), RowParams(1.0, 0, 1.0, 5, 2), RowParams(0.7, 3, 0.9, 1, 1)]
    assert sample(lg2, rows)[0][1].item() == draw(5, 2)
    assert mix_seed(1, 2) != mix_seed(2, 1)


def test_empirical_distribution_matches_softmax(filter_path):
    v, t, n = 6, 0.8, 6000
    lg = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0, 0.2]])
    counts = torch.zeros(v)
    rows = [RowParams(t, 0, 1.0, 123, pos) for pos in range(n)]
    tok, _ = sample(lg.expand(n, v).contiguous(), rows)
    counts = torch.bincount(tok, minlength=v).float()
    expect = torch.softmax(lg[0] / t, -1) * n
    chi2 = (((counts - expect) ** 2) / expect).sum().item()
    assert chi2 < 25.0, (counts, expect)  # df=5: p(chi2 > 25) < 2e-4


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (0, 0.6), (4, 0.8)])
def test_top_k_top_p_never_emit_excluded(top_k, top_p, filter_path):
    lg = _logits(1, 30, seed=5)
    probs = torch.softmax(lg[0] / 1.3, -1)
    order = probs.argsort(descending=True)
    allowed = set(order[:top_k].tolist()) if top_k else set(order.tolist())
    if top_p < 1.0:  # top-p applies to the renormalized top-k distribution (as in HF)
        if top_k:
            probs = torch.zeros_like(probs).index_copy(0, order[:top_k], probs[order[:top_k]])
            probs = probs / probs.sum()
        cum, keep = 0.0, set()
        for i in order.tolist():
            if cum >= top_p:
                break
            keep.add(i)
            cum += probs[i].item()
        allowed &= keep
    n = 2000
    rows = [RowParams(1.3, top_k, top_p, 9, pos) for pos in range(n)]
    tok, _ = sample(lg.expand(n, 30).contiguous(), rows)
    seen = set(tok.tolist())
    assert seen <= allowed
    assert len(seen) == len(allowed)  # and all allowed ones do occur


def test_row_without_top_p_keeps_its_tail_next_to_a_top_p_row(filter_path):
    # A steep 49152-token row: its float32 running sum reaches 1.0 before the
    # tail. Batched with a top-p row it must still be filtered as if alone.
    from dspark.worker.sampler import _filtered_logits

    lg = torch.randn(2, 49152, generator=torch.Generator().manual_seed(0)) * 4
    alone = _filtered_logits(lg[:1], [RowParams(1.0, 0, 1.0)])
    mixed = _filtered_logits(lg, [RowParams(1.0, 0, 1.0), RowParams(1.0, 0, 0.9)])
    assert not torch.isinf(mixed[0]).any()
    assert torch.equal(mixed[0], alone[0])
    assert torch.isinf(mixed[1]).sum() > 1000  # the top-p row is still cut


def _sorted_reference(logits, params):
    """The filter by a full descending sort of every row (the accelerators' path,
    and what _filtered_logits computed on the CPU before it stopped sorting the
    vocabulary)."""
    temp = torch.tensor([p.temperature for p in params])
    return _filtered_by_sort(logits / temp[:, None], params)


@pytest.mark.parametrize("scale", [0.3, 3.0, 12.0])
def test_top_k_top_p_without_a_full_sort_keep_what_the_sort_keeps(scale, filter_path):
    """Flat rows (scale 0.3: the candidate span must grow to hold the top-p
    mass), peaked rows (12: a handful of candidates), ties, large vocabularies,
    top-k alone, top-p alone and both: the same tokens as sorting the row, but
    at a top-p boundary deep in a long tail, where the running sums (taken in
    a different order) differ in float32 rounding and the last few tokens,
    each of negligible mass, may fall either way."""
    g = torch.Generator().manual_seed(int(scale * 10))
    for vocab in (7, 300, 49152):
        lg = torch.randn(6, vocab, generator=g) * scale
        lg[2] = lg[2].round()  # ties
        params = [RowParams(0.7, 0, 0.9), RowParams(1.0, 40, 1.0), RowParams(1.3, 5, 0.5),
                  RowParams(0.5, 0, 0.999), RowParams(2.0, 0, 0.3), RowParams(1.0, 0, 1.0)]
        got = _filtered_logits(lg, params)
        want = _sorted_reference(lg, params)
        for i in range(6):
            if i == 2:  # ties: the same number kept, and only tokens the sort could keep
                kept = torch.isfinite(got[i])
                assert int(kept.sum()) == int(torch.isfinite(want[i]).sum())
                floor = want[i][torch.isfinite(want[i])].min()
                assert bool((got[i][kept] >= floor).all())
            else:
                a, b = torch.isfinite(got[i]), torch.isfinite(want[i])
                if not torch.equal(a, b):  # nested, the difference at the boundary
                    assert params[i].top_p < 1.0
                    assert bool((a <= b).all()) or bool((b <= a).all()), (vocab, i)
                    probs = torch.softmax(want[i].masked_fill(~b, float("-inf"))
                                          if params[i].top_k else lg[i] / params[i].temperature,
                                          -1)
                    assert float(probs[a ^ b].sum()) < 1e-4, (vocab, i)
                assert torch.equal(got[i][a & b], want[i][a & b])


def test_native_filter_equals_kept_and_leaves_rows_without_a_distribution():
    """The native filter keeps exactly _kept's tokens on ordinary rows (draft and
    target vocabularies, top-k, top-p, both, top-k past the vocabulary), copies
    rows without a filter, and leaves a NaN row and an all -inf row as they are."""
    if native_attention.load(build=True) is None:
        pytest.skip(f"native kernels unavailable: {native_attention.unavailable_reason()}")
    g = torch.Generator().manual_seed(7)
    for vocab in (16384, 49152):
        lg = torch.randn(7, vocab, generator=g) * 2.5
        params = [RowParams(0.7, 0, 0.9), RowParams(1.0, 50, 1.0), RowParams(0.8, 20, 0.7),
                  RowParams(1.0, vocab + 5, 0.95), RowParams(1.0, 0, 1.0),
                  RowParams(1.0, 0, 0.9), RowParams(1.0, 3, 0.9)]
        lg[5, 11] = float("nan")
        lg[6] = float("-inf")
        got = _filtered_logits(lg, params)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(sampler_mod.native_attention, "load", lambda build=False: None)
            want = _filtered_logits(lg, params)
        for i in range(5):
            assert torch.equal(torch.isfinite(got[i]), torch.isfinite(want[i])), (vocab, i)
            assert torch.equal(got[i][torch.isfinite(got[i])], want[i][torch.isfinite(want[i])])
        temp = torch.tensor([p.temperature for p in params])[:, None]
        assert torch.equal(got[4], lg[4] / temp[4])  # no filter: the tempered row
        assert bool(torch.isnan(got[5, 11])) and torch.equal(got[5, :11], lg[5, :11])
        assert bool(torch.isneginf(got[6]).all())
