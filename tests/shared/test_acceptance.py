"""Acceptance (greedy and lossless sampled), stop truncation, counter-based RNG.

Pure Python: these tests import no torch, as the scheduler does not.
"""
from __future__ import annotations

import sys

import pytest

from dspark.shared import rng
from dspark.shared.acceptance import (RESIDUAL_NONE, RESIDUAL_SKIPPED, Acceptance, VerifyResult,
                                      accept, truncate)
from dspark.shared.types import FinishReason


def _greedy(drafts, targets):
    """A greedy request drafted greedily, filled in as the worker fills it."""
    k = len(drafts)
    return VerifyResult(
        draft_tokens=list(drafts), target_tokens=list(targets),
        q_draft=[1.0 if d == t else 0.0 for d, t in zip(drafts, targets)], p_draft=[1.0] * k,
        uniforms=[0.5] * k,
        residual_tokens=[-1 if d == t else t for d, t in zip(drafts, targets)])


def _sampled(q, p, u, residual=None, drafts=(11, 12, 13), bonus=99):
    k = len(q)
    return VerifyResult(draft_tokens=list(drafts[:k]), target_tokens=[50 + i for i in range(k)]
                        + [bonus], q_draft=list(q), p_draft=list(p), uniforms=list(u),
                        residual_tokens=list(residual or [70 + i for i in range(k)]))


# ---------------------------------------------------------------- greedy

@pytest.mark.parametrize("drafts, targets, n, tokens", [
    ([5, 6, 7], [5, 6, 7, 8], 3, [5, 6, 7, 8]),  # all accepted: bonus t_K
    ([5, 6, 7], [4, 6, 7, 8], 0, [4]),  # first rejected: correction t_0
    ([5, 6, 7], [5, 9, 7, 8], 1, [5, 9]),  # middle rejected
    ([5, 6, 7], [5, 6, 1, 8], 2, [5, 6, 1]),  # last rejected
    ([5, 9, 7], [5, 6, 7, 8], 1, [5, 6]),  # later matches after a mismatch do not count
    ([], [3], 0, [3]),  # K = 0: plain decoding
])
def test_greedy_cases(drafts, targets, n, tokens):
    res = _greedy(drafts, targets)
    assert accept(res, greedy=True) == Acceptance(n, tokens)
    # one-hot q and p: the sampled rule reduces to the greedy one
    assert accept(res, greedy=False) == Acceptance(n, tokens)


# ---------------------------------------------------------------- sampled

@pytest.mark.parametrize("q, p, u, n, tokens", [
    # all accepted (q >= p, or u below q/p): the bonus t_K
    ([0.5, 0.3, 0.2], [0.4, 0.6, 0.4], [0.9, 0.49, 0.1], 3, [11, 12, 13, 99]),
    # first rejected: u = 0.6 >= q/p = 0.5 -> residual of row 0
    ([0.2, 0.9, 0.9], [0.4, 0.1, 0.1], [0.6, 0.0, 0.0], 0, [70]),
    # middle rejected: q/p = 0.25 at d_2
    ([0.9, 0.1, 0.9], [0.5, 0.4, 0.1], [0.99, 0.3, 0.0], 1, [11, 71]),
    # last rejected
    ([0.9, 0.9, 0.1], [0.5, 0.5, 0.2], [0.9, 0.9, 0.51], 2, [11, 12, 72]),
    # q = 0: rejected even for the smallest u
    ([0.0, 0.9, 0.9], [0.3, 0.1, 0.1], [1e-12, 0.1, 0.1], 0, [70]),
    # q/p exactly at u is a rejection (u < q/p accepts)
    ([0.25, 0.9, 0.9], [0.5, 0.1, 0.1], [0.5, 0.1, 0.1], 0, [70]),
])
def test_sampled_cases(q, p, u, n, tokens):
    assert accept(_sampled(q, p, u), greedy=False) == Acceptance(n, tokens)


def test_sampled_ignores_target_tokens_before_the_bonus_and_greedy_ignores_uniforms():
    res = _sampled([0.9, 0.9, 0.9], [0.5, 0.5, 0.5], [0.1, 0.1, 0.1])
    assert accept(res, greedy=False).tokens == [11, 12, 13, 99]
    # the same result read greedily: d_1 = 11 != t_0 = 50 -> correction t_0
    assert accept(res, greedy=True) == Acceptance(0, [50])


def test_undefined_residual_means_q_equals_p_and_the_draft_is_kept():
    # q == p: min(1, q/p) = 1; a rounding-level u >= q/p must not reject into "-1"
    res = _sampled([0.3, 0.5], [0.3000001, 0.5], [0.9999999, 0.2], residual=[-1, -1])
    assert accept(res, greedy=False) == Acceptance(2, [11, 12, 99])


def test_skipped_residuals_are_read_only_as_accepted():
    # the worker skips the residuals acceptance never reads: accepted drafts and
    # those after the first rejection
    res = _sampled([0.6, 0.2, 0.4], [0.5, 0.4, 0.5], [0.3, 0.9, 0.1],
                   residual=[RESIDUAL_SKIPPED, 77, RESIDUAL_SKIPPED])
    assert accept(res, greedy=False) == Acceptance(1, [11, 77])
    # a rule that rejects where the worker skipped (other uniforms) raises, never
    # reads "skipped" as "accepted"
    res.uniforms = [0.3, 0.1, 0.99]
    with pytest.raises(ValueError, match="residual_tokens\\[2\\]=-2: draft 3 is rejected"):
        accept(res, greedy=False)
    res.uniforms = [0.3, 0.9, 0.1]
    res.residual_tokens[0] = -7  # junk is not a token either
    res.q_draft[0] = 0.1  # u * p = 0.15 >= q: rejected
    with pytest.raises(ValueError, match="residual_tokens\\[0\\]=-7"):
        accept(res, greedy=False)
    assert RESIDUAL_NONE == -1


def test_bad_results_are_rejected():
    with pytest.raises(ValueError, match="target_tokens has 3 entries, expected 4"):
        accept(_greedy([1, 2, 3], [1, 2, 3]), greedy=True)
    with pytest.raises(ValueError, match="uniforms"):
        accept(VerifyResult([1], [1, 2], [1.0], [1.0], [], [-1]), greedy=False)
    with pytest.raises(ValueError, match="p_draft\\[1\\]"):
        accept(_sampled([0.5, 0.5], [0.5, 0.0], [0.1, 0.1]), greedy=False)


def test_acceptance_is_deterministic_and_stateless():
    res = _sampled([0.9, 0.1, 0.9], [0.5, 0.4, 0.1], [0.99, 0.3, 0.0])
    first = accept(res, greedy=False)
    assert all(accept(res, greedy=False) == first for _ in range(5))
    assert res.draft_tokens == [11, 12, 13]  # inputs untouched
    first.tokens.append(0)
    assert accept(res, greedy=False).tokens == [11, 71]


# ---------------------------------------------------------------- truncate

EOS = (2,)


@pytest.mark.parametrize("tokens, kw, kept, reason", [
    ([5, 6, 7, 8], {}, [5, 6, 7, 8], FinishReason.NONE),
    ([5, 2, 7, 8], {}, [5, 2], FinishReason.STOP),  # EOS kept in the output
    ([5, 2, 7, 8], dict(ignore_eos=True), [5, 2, 7, 8], FinishReason.NONE),
    ([5, 6, 7, 8], dict(stop_token_ids=(7,)), [5, 6, 7], FinishReason.STOP),
    ([5, 6, 7, 8], dict(stop_token_ids=(7,), ignore_eos=True), [5, 6, 7], FinishReason.STOP),
    ([5, 6, 7, 8], dict(remaining_tokens=2), [5, 6], FinishReason.LENGTH),  # max_tokens
    ([5, 6, 7, 8], dict(remaining_tokens=4), [5, 6, 7, 8], FinishReason.LENGTH),  # exactly
    ([5, 6, 7, 8], dict(remaining_len=3), [5, 6, 7], FinishReason.LENGTH),  # model length
    ([5, 6, 7, 8], dict(remaining_len=1), [5], FinishReason.LENGTH),
    ([5, 2, 7, 8], dict(remaining_tokens=2), [5, 2], FinishReason.STOP),  # STOP wins a tie
    ([5, 6, 2, 8], dict(remaining_tokens=2), [5, 6], FinishReason.LENGTH),  # budget first
    ([2], dict(remaining_tokens=1), [2], FinishReason.STOP),
])
def test_truncate(tokens, kw, kept, reason):
    args = dict(remaining_tokens=100, remaining_len=100, eos_token_ids=EOS)
    args.update(kw)
    assert truncate(tokens, **args) == (kept, reason)


def test_accept_then_truncate_a_stop_inside_the_accepted_run():
    acc = accept(_greedy([5, 2, 7], [5, 2, 7, 8]), greedy=True)
    assert acc == Acceptance(3, [5, 2, 7, 8])
    assert truncate(acc.tokens, remaining_tokens=10, remaining_len=10,
                    eos_token_ids=EOS) == ([5, 2], FinishReason.STOP)
    assert truncate(acc.tokens, remaining_tokens=10, remaining_len=10, eos_token_ids=EOS,
                    ignore_eos=True) == ([5, 2, 7, 8], FinishReason.NONE)


def test_truncate_needs_room():
    with pytest.raises(ValueError, match="remaining_tokens=0"):
        truncate([1], remaining_tokens=0, remaining_len=5)


# ---------------------------------------------------------------- rng

def test_uniforms_are_pure_open_and_stream_separated():
    draws = [rng.uniform(7, pos, rng.STREAM_ACCEPT) for pos in range(2000)]
    assert draws == [rng.uniform(7, pos, rng.STREAM_ACCEPT) for pos in range(2000)]
    assert all(0.0 < u < 1.0 for u in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.03  # sd of the mean ~0.0065
    streams = {s: [rng.uniform(7, p, s) for p in range(50)]
               for s in (rng.STREAM_ACCEPT, rng.STREAM_RESIDUAL, rng.STREAM_DRAFT)}
    assert len({tuple(v) for v in streams.values()}) == 3
    assert rng.uniform(7, 3, rng.STREAM_ACCEPT) != rng.uniform(8, 3, rng.STREAM_ACCEPT)


def test_mix_seed_is_the_samplers_and_unchanged():
    # moved from the sampler; the values pin the stream plain decoding uses
    assert [rng.mix_seed(0, 0), rng.mix_seed(5, 2)] == [7905728728188956330, 5977627680143410387]


def test_acceptance_module_does_not_import_torch():
    import subprocess

    code = ("import sys, dspark.shared.acceptance, dspark.shared.rng; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
