"""Verify rows -> VerifyResult: agreement with the sampler, field values,
batching, determinism, and a statistical test that draft -> verify -> accept
emits exactly the target's distribution (greedy and sampled drafts)."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dspark.shared import rng
from dspark.shared.acceptance import RESIDUAL_SKIPPED, VerifyResult, accept
from dspark.worker.sampler import RowParams, inverse_cdf, sample
from dspark.worker.model import native_attention
from dspark.worker.verify import (VerifyInput, processed_probs, sample_draft, sample_draft_rows,
                                  verify)

GREEDY = RowParams()
HOT = RowParams(temperature=0.8, top_k=20, top_p=0.95, seed=11)


def _randn(*shape, seed=0, scale=3.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _row_params(x: VerifyInput, i: int) -> RowParams:
    p = x.params
    return RowParams(p.temperature, p.top_k, p.top_p, p.seed, x.anchor_position + i + 1)


def _draft(params, k, anchor, vocab, seed, sampled=True):
    """K drafts from random draft logits at the request's processing."""
    probs = processed_probs(_randn(k, vocab, seed=seed), [params] * k)
    if not sampled or params.greedy:
        return probs.argmax(-1).tolist(), None
    positions = [anchor + i + 1 for i in range(k)]
    return sample_draft(probs, [params] * k, positions).tolist(), probs


def _mixed_batch(vocab=300):
    specs = [(GREEDY, 3), (HOT, 4), (RowParams(1.0, 0, 1.0, 5), 0), (GREEDY, 0),
             (RowParams(0.6, 0, 0.7, 9), 2), (RowParams(1.2, 1, 1.0, 3), 2)]
    inputs = []
    for r, (params, k) in enumerate(specs):
        anchor = 20 + 7 * r
        d, probs = _draft(params, k, anchor, vocab, seed=100 + r)
        inputs.append(VerifyInput(d, params, anchor, probs))
    rows = sum(len(x.draft_tokens) + 1 for x in inputs)
    return _randn(rows, vocab, seed=1), inputs


def test_k0_is_plain_decoding():
    vocab = 500
    params = [GREEDY, RowParams(1.0, 0, 1.0, 1), RowParams(0.7, 10, 1.0, 2),
              RowParams(1.3, 0, 0.8, 3), RowParams(0.9, 40, 0.9, 4)] * 4
    inputs = [VerifyInput([], p, anchor_position=10 + r) for r, p in enumerate(params)]
    logits = _randn(len(params), vocab, seed=2)
    res = verify(logits, inputs)
    tok, _ = sample(logits, [_row_params(x, 0) for x in inputs])
    assert [r.target_tokens for r in res] == [[t] for t in tok.tolist()]
    assert all(r.draft_tokens == r.q_draft == r.uniforms == r.residual_tokens == []
               for r in res)
    assert [accept(r, p.greedy).tokens for r, p in zip(res, params)] == [[t] for t in tok.tolist()]
    assert len({t for t, p in zip(tok.tolist(), params) if not p.greedy}) > 5  # really sampled


def test_mixed_batch_fields():
    """Every field acceptance reads equals an eager computation of every row
    (t_i as the sampler draws it, q and p of each draft, the residual of each
    position); a sampled request's fields past its first rejection are the
    placeholders acceptance never reads."""
    logits, inputs = _mixed_batch()
    res = verify(logits, inputs)
    off, walked = 0, 0
    for x, r in zip(inputs, res):
        k = len(x.draft_tokens)
        rows = [_row_params(x, i) for i in range(k + 1)]
        lg = logits[off:off + k + 1]
        off += k + 1
        t = sample(lg, rows)[0].tolist()  # what the sampler draws on each row
        q = processed_probs(lg, rows)  # [K+1, V]
        p = x.draft_probs if x.draft_probs is not None else \
            torch.nn.functional.one_hot(torch.tensor(x.draft_tokens, dtype=torch.long),
                                        lg.shape[1]).float()
        u = [rng.uniform(x.params.seed, x.anchor_position + i + 1, rng.STREAM_ACCEPT)
             for i in range(k)]
        assert r.uniforms == u
        ref = VerifyResult(list(x.draft_tokens), t, [q[i, d].item() for i, d in
                                                     enumerate(x.draft_tokens)],
                           [p[i, d].item() for i, d in enumerate(x.draft_tokens)], u,
                           _eager_residuals(q, p, x))
        want = accept(ref, greedy=x.params.greedy)
        assert accept(r, greedy=x.params.greedy) == want
        assert accept(r, greedy=False) == accept(ref, greedy=False)
        if x.params.greedy and x.draft_probs is None:  # one-hot q and p: comparisons only
            assert r.target_tokens == t
            assert r.q_draft == [float(d == tt) for d, tt in zip(x.draft_tokens, t)]
            assert r.residual_tokens == ref.residual_tokens
            continue
        walked += 1
        j = want.num_accepted  # the draft acceptance stops at (k: none, the bonus)
        for i in range(k):
            assert r.p_draft[i] == pytest.approx(ref.p_draft[i], abs=1e-7)
            if i <= j:  # read by acceptance: the eager values
                assert r.q_draft[i] == pytest.approx(ref.q_draft[i], abs=1e-7)
            else:
                assert r.q_draft[i] == 0.0
            if i == j:
                assert r.residual_tokens[i] == ref.residual_tokens[i] >= 0
                assert (q[i] - p[i]).clamp_min(0)[r.residual_tokens[i]] > 0
            else:
                assert r.residual_tokens[i] in (-1, RESIDUAL_SKIPPED)
        if j == k and not x.params.greedy:
            assert r.target_tokens[k] == t[k]  # the bonus: the sampler's own draw
    assert walked >= 3


def _eager_residuals(q: torch.Tensor, p: torch.Tensor, x: VerifyInput) -> list[int]:
    """The residual sample at every draft position (-1 where it is zero)."""
    out = []
    for i in range(len(x.draft_tokens)):
        res = (q[i] - p[i]).clamp_min(0)
        u = rng.uniform(x.params.seed, x.anchor_position + i + 1, rng.STREAM_RESIDUAL)
        out.append(inverse_cdf(res[None], [u]).item() if res.sum() > 0 else -1)
    return out


def test_residuals_only_where_read_and_a_disagreeing_acceptance_raises():
    """Sampled requests: the worker computes the residual at the first draft
    acceptance rejects and skips the rest; acceptance that would reject a
    skipped draft (another uniform, say) fails loudly instead of accepting it."""
    vocab, k, seen = 300, 7, set()
    for seed in range(12):
        params = RowParams(0.9, 0, 0.95, seed)
        d, probs = _draft(params, k, 40, vocab, seed=200 + seed)
        # the target's rows: the draft's logits (_draft's) plus noise, and one more
        target = torch.cat([_randn(k, vocab, seed=200 + seed)
                            + _randn(k, vocab, seed=300 + seed, scale=0.6),
                            _randn(1, vocab, seed=400 + seed)])
        (res,) = verify(target, [VerifyInput(d, params, 40, probs)])
        n = accept(res, greedy=False).num_accepted
        seen.add(n)
        assert all(r == RESIDUAL_SKIPPED for r in res.residual_tokens[:n])
        assert all(r == RESIDUAL_SKIPPED for r in res.residual_tokens[n + 1:])
        if n < k:
            assert res.residual_tokens[n] >= 0
        if n > 0:  # a uniform that rejects an accepted draft: no silent accept
            bad = dataclasses.replace(res, uniforms=[1.0 - 1e-9] * k)
            with pytest.raises(ValueError, match="computed no residual"):
                accept(bad, greedy=False)
    assert len(seen) >= 3  # first rejected, middle and later ones all occurred


def test_a_request_does_not_depend_on_its_batch_and_is_deterministic():
    logits, inputs = _mixed_batch()
    batch = verify(logits, inputs)
    assert verify(logits, inputs) == batch
    off = 0
    for x, r in zip(inputs, batch):
        n = len(x.draft_tokens) + 1
        assert verify(logits[off:off + n], [x]) == [r]
        off += n


def test_greedy_acceptance_on_real_rows():
    vocab = 200
    logits = _randn(4, vocab, seed=3)
    t = logits.argmax(-1).tolist()
    cases = [([t[0], t[1], t[2]], 3, [t[0], t[1], t[2], t[3]]),  # all match: bonus
             ([t[0], (t[1] + 1) % vocab, t[2]], 1, [t[0], t[1]]),  # mismatch at d_2
             ([(t[0] + 1) % vocab, t[1], t[2]], 0, [t[0]])]  # first rejected
    for drafts, n, tokens in cases:
        (res,) = verify(logits, [VerifyInput(drafts, GREEDY, 5)])
        for greedy in (True, False):  # one-hot q and p: both rules agree
            acc = accept(res, greedy)
            assert (acc.num_accepted, acc.tokens) == (n, tokens)


def test_drafter_equal_to_target_accepts_everything():
    # same logits and processing: p == q exactly, so every draft is kept
    vocab, k = 400, 5
    for params in (HOT, RowParams(1.0, 0, 1.0, 4), RowParams(0.5, 0, 0.6, 8)):
        logits = _randn(k + 1, vocab, seed=4)
        probs = processed_probs(logits[:k], [params] * k)
        drafts = sample_draft(probs, [params] * k, [31 + i for i in range(k)]).tolist()
        (res,) = verify(logits, [VerifyInput(drafts, params, 30, probs)])
        assert res.q_draft == res.p_draft  # no residual is ever read: none made
        assert res.residual_tokens == [-1 if params.greedy else RESIDUAL_SKIPPED] * k
        assert accept(res, greedy=False).tokens == drafts + [res.target_tokens[k]]


def test_processed_probs_and_sample_draft():
    vocab = 50
    logits = _randn(3, vocab, seed=6)
    params = [GREEDY, RowParams(0.7, 5, 1.0, 1), RowParams(1.0, 0, 0.5, 2)]
    probs = processed_probs(logits, params)
    assert probs[0].tolist() == torch.nn.functional.one_hot(logits[0].argmax(), vocab).tolist()
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    assert (probs[1] > 0).sum() == 5
    assert set((probs[1] > 0).nonzero()[:, 0].tolist()) == set(logits[1].topk(5).indices.tolist())
    # sample_draft: greedy rows argmax; sampled rows follow probs, pure in (seed, position)
    n = 2000
    rows = [params[1]] * n
    toks = sample_draft(probs[1:2].expand(n, vocab), rows, list(range(n)))
    assert toks.tolist() == sample_draft(probs[1:2].expand(n, vocab), rows, list(range(n))).tolist()
    assert sample_draft(probs[:1], [GREEDY], [0]).item() == logits[0].argmax().item()
    counts = torch.bincount(toks, minlength=vocab).double()
    stat, df = _chi2(counts, probs[1].double() * n)
    assert _chi2_sf(stat, df) > 1e-4, (counts, probs[1] * n)


@pytest.mark.parametrize("path", ["native", "python"])
def test_sample_draft_rows(path, monkeypatch):
    """Sampled drafting's pick, in one native call or as processed_probs +
    sample_draft: the distribution is processed_probs' (the same support, the
    same values to float rounding), the draft is drawn from exactly it
    (p(draft) read from it, never a token without mass, draws following it),
    pure in (seed, position)."""
    if path == "python":
        monkeypatch.setattr(native_attention, "load", lambda build=False: None)
    elif native_attention.load(build=True) is None:
        pytest.skip(f"native kernels unavailable: {native_attention.unavailable_reason()}")
    vocab = 300
    logits = _randn(5, vocab, seed=9) * 2
    params = [RowParams(0.7, 0, 0.9, 1), RowParams(1.0, 5, 1.0, 2), RowParams(1.3, 0, 1.0, 3),
              RowParams(0.8, 20, 0.7, 4), RowParams(1.0, vocab + 10, 1.0, 5)]
    positions = [3, 4, 5, 6, 7]
    probs, toks, p_tok = sample_draft_rows(logits, params, positions)
    want = processed_probs(logits, params)
    assert probs.dtype == torch.float32 and p_tok.dtype == torch.float32
    assert torch.equal(probs > 0, want > 0)
    torch.testing.assert_close(probs, want, atol=1e-6, rtol=1e-5)
    assert torch.equal(p_tok, probs[torch.arange(5), toks])
    assert bool((p_tok > 0).all())
    again = sample_draft_rows(logits, params, positions)
    assert torch.equal(again[0], probs) and torch.equal(again[1], toks)
    # draws follow the distribution (row 0: top-p 0.9 at temperature 0.7)
    n = 3000
    rows = [dataclasses.replace(params[0], seed=s) for s in range(n)]
    pr, drawn, _ = sample_draft_rows(logits[:1].expand(n, vocab), rows, [9] * n)
    counts = torch.bincount(drawn, minlength=vocab).double()
    stat, df = _chi2(counts, pr[0].double() * n)
    assert _chi2_sf(stat, df) > 1e-4


def test_bad_inputs():
    logits = _randn(3, 10)
    with pytest.raises(ValueError, match="logits has 3 rows, the inputs need 2"):
        verify(logits, [VerifyInput([1], GREEDY, 0)])
    with pytest.raises(ValueError, match="draft_probs has shape"):
        verify(logits, [VerifyInput([1, 2], HOT, 0, torch.ones(1, 10) / 10)])


# ------------------------------------------------------------ losslessness

V, K, N_OUT = 8, 3, 3  # toy vocab, drafts per step, output tokens compared
TARGET = _randn(V, V, seed=20, scale=1.5)  # Markov target: logits of next | previous
DRAFTER = 0.4 * TARGET + _randn(V, V, seed=21, scale=1.5)  # a deliberately different drafter


def _generate(params: RowParams, n: int, sampled_drafts: bool, corrupt=None) -> torch.Tensor:
    """n requests (seeds 0..n-1) from anchor token 0 at position 10; draft ->
    verify -> accept until each has N_OUT tokens. Returns [n, N_OUT] tokens."""
    ps = [RowParams(params.temperature, params.top_k, params.top_p, s) for s in range(n)]
    out = [[] for _ in range(n)]
    last, pos = [0] * n, [10] * n
    live = list(range(n))
    while live:
        x = torch.tensor([last[r] for r in live])
        drafts, probs = [], []
        for i in range(K):  # the drafter's left-to-right Markov loop (spec.py's pick)
            if sampled_drafts:
                pr, x, _ = sample_draft_rows(DRAFTER[x], [ps[r] for r in live],
                                             [pos[r] + i + 1 for r in live])
            else:
                pr = processed_probs(DRAFTER[x], [ps[r] for r in live])
                x = DRAFTER[x].argmax(-1)
            drafts.append(x)
            probs.append(pr)
        d = torch.stack(drafts, 1)  # [m, K]
        p = torch.stack(probs, 1)  # [m, K, V]
        ctx = torch.cat([torch.tensor([last[r] for r in live])[:, None], d], 1)  # [m, K+1]
        inputs = [VerifyInput(d[j].tolist(), ps[r], pos[r], p[j] if sampled_drafts else None)
                  for j, r in enumerate(live)]
        for r, res in zip(live, verify(TARGET[ctx.reshape(-1)], inputs)):
            if corrupt:
                res = corrupt(res)
            toks = accept(res, params.greedy).tokens
            out[r] += toks
            last[r], pos[r] = toks[-1], pos[r] + len(toks)
        live = [r for r in live if len(out[r]) < N_OUT]
    return torch.tensor([o[:N_OUT] for o in out])


def _exact(params: RowParams) -> torch.Tensor:
    """The target's own distribution of the first N_OUT tokens, [V]*N_OUT."""
    q = processed_probs(TARGET, [params] * V).double()  # q[prev, next]
    joint = q[0]
    for _ in range(N_OUT - 1):
        joint = joint[..., None] * q.reshape((1,) * (joint.dim() - 1) + (V, V))
    return joint


def _chi2(counts: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic with cells of expectation < 5 pooled; cells of
    expectation 0 must be empty."""
    counts, expected = counts.flatten().double(), expected.flatten().double()
    assert counts[expected == 0].sum() == 0, "emitted a token the target never emits"
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(((obs - exp) ** 2 / exp).sum()), int(keep.sum()) - 1


def _chi2_sf(stat: float, df: int) -> float:
    """P(chi2_df > stat) by the Wilson-Hilferty cube-root normal approximation."""
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _p_value(params, sampled_drafts, n, corrupt=None) -> float:
    toks = _generate(params, n, sampled_drafts, corrupt)
    counts = torch.zeros((V,) * N_OUT, dtype=torch.float64)
    counts.index_put_(tuple(toks.T), torch.ones(n, dtype=torch.float64), accumulate=True)
    return _chi2_sf(*_chi2(counts, _exact(params) * n))


def _resample_from_q(res: VerifyResult) -> VerifyResult:
    """The classic bug: at a rejection, emit a fresh sample from q (t_i)
    instead of the residual sample."""
    res.residual_tokens = list(res.target_tokens[:-1])
    return res


LOSSLESS = [
    (RowParams(1.0), False),  # greedy (one-hot) drafts
    (RowParams(0.7, 5, 1.0), True),  # sampled drafts, top-k: drafter mass outside q
    (RowParams(1.3, 0, 0.8), True),  # sampled drafts, top-p
    (RowParams(0.9, 4, 0.9), False),
]


@pytest.mark.parametrize("params, sampled_drafts", LOSSLESS)
def test_speculative_output_has_the_targets_distribution(params, sampled_drafts):
    assert _p_value(params, sampled_drafts, n=2000) > 1e-4


def test_the_distribution_test_detects_a_lossy_rule():
    # with fewer samples than above: p ~ 1e-25 here, so the test above has power
    assert _p_value(RowParams(0.7, 5, 1.0), True, n=1000, corrupt=_resample_from_q) < 1e-8


def test_greedy_speculation_reproduces_greedy_decoding():
    toks = _generate(GREEDY, n=50, sampled_drafts=False)
    chain = [0]
    for _ in range(N_OUT):
        chain.append(TARGET[chain[-1]].argmax().item())
    assert toks.tolist() == [chain[1:]] * 50


def test_model_dtype_logits_verify_as_their_float32_copy():
    """The runner hands verify the logits in the model dtype: every field equals
    verifying their float32 copy (greedy argmax on bf16, sampled rows converted)."""
    logits, inputs = _mixed_batch()
    # many near-ties after rounding to bf16, so a different argmax rule would show
    half = (logits * 4).round().to(torch.bfloat16)
    assert verify(half, inputs) == verify(half.float(), inputs)
    tok, _ = sample(half.float(), [GREEDY] * half.shape[0])
    assert [t for r in verify(half, [VerifyInput([], GREEDY, i) for i in range(half.shape[0])])
            for t in r.target_tokens] == tok.tolist()
