"""Acceptance of one request's speculative verify step (pure Python, no torch).

The worker ran the target on ``[anchor, d_1, ..., d_K]`` at positions
``a .. a+K`` (``a`` = the anchor's position). Row ``i`` (0-based) yields
``q_i``, the target's distribution for the token at position ``a+i+1``, after
the request's temperature, top-k and top-p (the distribution the request
samples from). The drafter proposed ``d_i`` (position ``a+i``) from its own
processed distribution ``p_i``. The worker reduces all V-sized work to a few
numbers per row (``VerifyResult``); what is committed is decided here, by the
scheduler, as a deterministic function of them.

Greedy (temperature 0): accept the longest prefix with ``d_i == t_{i-1}``,
``t_i = argmax q_i``, then emit the target's own token: the correction
``t_{j-1}`` at the first mismatch ``j``, or the bonus ``t_K`` when all match.

Sampled (lossless rejection sampling): accept ``d_i`` iff
``u_i < min(1, q_{i-1}(d_i) / p_i(d_i))``; at the first rejection emit the
residual sample ``r_i ~ normalize(max(0, q_{i-1} - p_i))``; when all K are
accepted emit the bonus ``t_K ~ q_K``. Each emitted token then has the
target's distribution exactly: ``P(d_i accepted and = x) = min(p(x), q(x))``
and ``P(rejected) * residual(x) = q(x) - min(p(x), q(x))``. ``u_i``, ``r_i``,
the drafts and ``t_K`` come from independent counter-based streams
(``dspark.shared.rng``) keyed by (seed, position), so the step reproduces
exactly and a later step reuses only positions past the committed run,
whose draws nothing committed depended on. ``t_K`` is drawn exactly as plain
decoding would draw the token at that position, so K = 0 is plain decoding.

With one-hot q and p (a greedy request drafted greedily) the sampled rule
reduces to the greedy one, so either rule is safe for such a result.

Each step yields 1..K+1 tokens; ``truncate`` applies the stop conditions.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from dspark.shared.types import FinishReason


# residual_tokens entries that are not tokens
RESIDUAL_NONE = -1     # normalize(max(0, q - p)) is zero (q == p): always accepted
RESIDUAL_SKIPPED = -2  # not computed: the worker's own run of ``accept`` on these very
#                        values accepts this draft or stops before it


@dataclass
class VerifyResult:
    """What acceptance needs from one request's verify rows (K >= 0 drafts).

    Index i of the K-long lists is draft ``d_{i+1}`` (position a+i+1), judged
    by target row i.
    """

    draft_tokens: list[int]  # [K] d_1..d_K
    # [K+1] t_i: the target's own token at position a+i+1 from row i: argmax
    # q_i (greedy) or the seeded sample from q_i that plain decoding draws there
    # (sampled: only t_K is read, when every draft is accepted; the worker may
    # leave other rows' argmax)
    target_tokens: list[int]
    # [K] q_{i}(d_{i+1}) under the request's processing (sampled: past the first
    # rejection, where nothing is read, the worker may leave 0 with a skipped
    # residual)
    q_draft: list[float]
    p_draft: list[float]  # [K] p_{i+1}(d_{i+1}) of the drafter; 1.0 for a one-hot draft
    uniforms: list[float]  # [K] u in (0, 1): rng.uniform(seed, a+i+1, STREAM_ACCEPT)
    # [K] seeded sample from normalize(max(0, q_i - p_{i+1})) (position a+i+1),
    # RESIDUAL_NONE (-1) where that is all zeros (q_i == p_{i+1}: the draft is
    # always accepted); the worker may leave RESIDUAL_SKIPPED (-2) where the
    # sample cannot be used (the draft is accepted, or a draft before it is
    # rejected): ``accept`` raises rather than accept a draft it would reject
    residual_tokens: list[int]

    @property
    def num_drafts(self) -> int:
        return len(self.draft_tokens)

    def validate(self) -> None:
        """Raise ValueError when the lists do not describe K drafts."""
        k = len(self.draft_tokens)
        lens = {"target_tokens": (len(self.target_tokens), k + 1),
                "q_draft": (len(self.q_draft), k), "p_draft": (len(self.p_draft), k),
                "uniforms": (len(self.uniforms), k),
                "residual_tokens": (len(self.residual_tokens), k)}
        for name, (got, want) in lens.items():
            if got != want:
                raise ValueError(f"{name} has {got} entries, expected {want} for K={k} drafts")


@dataclass(frozen=True)
class Acceptance:
    """The outcome of one verify step, before stop conditions."""

    num_accepted: int  # drafts accepted, 0..K
    tokens: list[int]  # num_accepted + 1 tokens: d_1..d_n, then the correction/residual/bonus


def accept(result: VerifyResult, greedy: bool) -> Acceptance:
    """Greedy or lossless-sampled acceptance of one request's verify step.

    ``greedy`` is the request's mode (temperature 0). Raises ValueError on an
    inconsistent result (list lengths, a sampled draft with p <= 0).
    """
    result.validate()
    d, t = result.draft_tokens, result.target_tokens
    k = len(d)
    if greedy:
        n = 0
        while n < k and d[n] == t[n]:
            n += 1
        return Acceptance(n, list(d[:n]) + [t[n]])
    for i in range(k):
        q, p, r = result.q_draft[i], result.p_draft[i], result.residual_tokens[i]
        if p <= 0.0:
            raise ValueError(f"p_draft[{i}]={p!r}: a drafted token must have p > 0")
        # u < min(1, q/p) written without the division; r == -1 means q == p,
        # where acceptance is certain (q/p == 1 up to rounding)
        if r == RESIDUAL_NONE or result.uniforms[i] * p < q:
            continue
        if r < 0:  # RESIDUAL_SKIPPED (or junk) where this rule rejects: never "accept"
            raise ValueError(f"residual_tokens[{i}]={r}: draft {i + 1} is rejected here but "
                             "the worker computed no residual sample for it (its own "
                             "acceptance of these values differs)")
        return Acceptance(i, list(d[:i]) + [r])
    return Acceptance(k, list(d) + [t[k]])


def truncate(tokens: list[int], *, remaining_tokens: int, remaining_len: int,
             stop_token_ids: Collection[int] = (), eos_token_ids: Collection[int] = (),
             ignore_eos: bool = False) -> tuple[list[int], FinishReason]:
    """Apply the stop conditions to an accepted run, token by token in order.

    ``remaining_tokens`` = max_tokens - outputs already committed;
    ``remaining_len`` = the sequence length ceiling (max_model_len, or the KV
    capacity cap) - tokens already in the sequence (prompt + outputs). Both
    must be >= 1 (a request with no room left is already finished).

    Same semantics as the scheduler's per-token check: the first stop token or
    EOS (unless ``ignore_eos``) ends the run and is kept (STOP); otherwise the
    token that uses up the budget or the room ends it (LENGTH); STOP wins when
    one token does both. Returns (kept tokens, reason); reason NONE keeps all.
    """
    if remaining_tokens < 1 or remaining_len < 1:
        raise ValueError(f"remaining_tokens={remaining_tokens}, remaining_len="
                         f"{remaining_len}: both must be >= 1")
    for j, tok in enumerate(tokens, start=1):
        if (tok in eos_token_ids and not ignore_eos) or tok in stop_token_ids:
            return list(tokens[:j]), FinishReason.STOP
        if j >= remaining_tokens or j >= remaining_len:
            return list(tokens[:j]), FinishReason.LENGTH
    return list(tokens), FinishReason.NONE
