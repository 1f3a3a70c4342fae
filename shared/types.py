"""Domain types shared by the services.

These are plain dataclasses: the scheduler core and the worker runner work on
them and never see generated protobuf classes (``dspark.shared.pb`` converts).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class FinishReason(enum.IntEnum):
    """Why a request ended (values match dspark.v1.FinishReason)."""

    NONE = 0
    STOP = 1  # EOS, stop token id or stop string
    LENGTH = 2  # max_tokens or max_model_len
    ABORT = 3  # client or server abort


@dataclass(frozen=True)
class SamplingParams:
    """Fully resolved sampling parameters of one request."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # (0, 1]
    top_k: int = 0  # 0 = off
    seed: int = 0  # sample at position p is a pure function of (seed, p)
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # applied to text by the router
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class SeqStep:
    """One sequence's share of a worker step."""

    request_id: str
    token_ids: list[int]  # tokens computed this step (prefill chunk or decode)
    start_position: int  # position of token_ids[0]
    block_ids: list[int]  # full block table; block i holds [i*bs, (i+1)*bs)
    sample: bool  # sample a next token from the last row
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    return_tap_rows: bool = False
    # Speculation: the request's drafter lease (-1 = none) and how many tokens to
    # draft and verify this step after token_ids[0], the anchor (0 = plain).
    lease_id: int = -1
    num_speculative_tokens: int = 0
    # Async scheduling: token_ids is empty and the anchor is the worker's own
    # acceptance of this request's previous step (start_position = that step's).
    deferred_anchor: bool = False


@dataclass
class StepPlan:
    """What the worker runs in one step (one batched target forward)."""

    step_id: int
    seqs: list[SeqStep]
    # Confidence-scheduled verification: verify at most this many draft rows over the
    # step's speculating seqs, the top candidates by cumulative confidence (see
    # protos/dspark/v1/worker.proto StepRequest.verify_budget). None = verify all.
    verify_budget: int | None = None
    # With verify_budget: the expected step time (ms) with v draft rows verified,
    # v = 0..verify_budget; the worker trims the fill to the rows the current
    # confidences pay for (shared/verify_fill.py). None = fill the budget.
    verify_step_ms: list[float] | None = None


@dataclass
class SeqOutput:
    """One sequence's result of a step."""

    request_id: str
    token_id: int = -1  # -1 when the step did not sample
    logprob: float = 0.0
    num_tap_rows: int = 0
    # [num_tap_rows, num_tap_layers * hidden] as a numpy array, when asked for
    tap_rows: object | None = None
    # Speculative verify results (num_speculative_tokens = K > 0), see
    # shared/acceptance.py: L verified drafts (L = K, or 0..K under a verify budget),
    # L+1 target tokens, L q/p values, L residual samples; the confidences of every
    # drafted position, verified or not (K; under a budget V, min(K, max(V, 1))).
    draft_tokens: list[int] = field(default_factory=list)
    target_tokens: list[int] = field(default_factory=list)
    q_draft: list[float] = field(default_factory=list)
    p_draft: list[float] = field(default_factory=list)
    residual_tokens: list[int] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    # the anchor a deferred step used (token, position), for reconciliation
    anchor_token: int = -1
    anchor_position: int = -1


@dataclass
class StepOutput:
    """The worker's result of a step; outputs are in the plan's order."""

    step_id: int
    outputs: list[SeqOutput]
    forward_ms: float = 0.0


@dataclass(frozen=True)
class SpsProfile:
    """A worker's measured costs (proto SpsProfile): forward wall time over B rows
    on a grid, and drafting as fixed + per drafted request at depth 1 + per
    request and position past the first, all in milliseconds."""

    rows: tuple[int, ...]
    forward_ms: tuple[float, ...]
    draft_fixed_ms: float = 0.0
    draft_per_request_ms: float = 0.0
    # pinned by the operator (--sps-profile): the scheduler uses it as given;
    # a measured one it corrects from observed step times (profile_fit.py)
    pinned: bool = False
    # each draft position past the first, per drafting request (the draft head,
    # the Markov step and the pick run once per position; the backbone once)
    draft_per_position_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.rows or len(self.rows) != len(self.forward_ms):
            raise ValueError(f"SpsProfile: rows {self.rows} and forward_ms "
                             f"{self.forward_ms} must be non-empty and of equal length")
        if any(b <= a for a, b in zip(self.rows, self.rows[1:])) or self.rows[0] < 1:
            raise ValueError(f"SpsProfile: rows {self.rows} must be ascending, >= 1")

    def forward(self, rows: int) -> float:
        """Forward ms for ``rows`` rows: linear between grid points, linear
        extrapolation (never decreasing) past the ends."""
        xs, ys = self.rows, self.forward_ms
        if len(xs) == 1:
            return ys[0] * max(rows, 1) / xs[0] if rows > xs[0] else ys[0]
        i = 1
        while i < len(xs) - 1 and rows > xs[i]:
            i += 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        slope = max(0.0, (y1 - y0) / (x1 - x0))
        if rows <= x0:  # below the grid: flat
            return y0
        return y0 + slope * (rows - x0)

    def draft(self, drafting: int, depth: int = 1) -> float:
        """Drafting ms for ``drafting`` requests, ``depth`` drafts each (0 if none)."""
        if not drafting:
            return 0.0
        per = self.draft_per_request_ms + max(0, depth - 1) * self.draft_per_position_ms
        return self.draft_fixed_ms + drafting * per

    def step(self, rows: int, drafting: int, depth: int = 1) -> float:
        """Step ms: forward over ``rows`` rows plus drafting for ``drafting``
        requests at ``depth`` drafts each."""
        return self.forward(rows) + self.draft(drafting, depth)


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker reports about its model and capacity."""

    model_name: str
    model_id: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_kv_blocks: int
    block_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    dtype: str
    device: str
    tap_layer_ids: tuple[int, ...] = ()
    num_speculative_tokens: int = 0  # K the worker drafts (0 = no drafter)
    num_leases: int = 0  # drafter leases (rings) the worker holds
    drafter_id: str = ""  # the loaded drafter checkpoint (name and content id)
    verify_policy: str = "fixed"  # "fixed" | "confidence" (how the scheduler verifies)
    sps_profile: SpsProfile | None = None  # measured at start-up when K > 0


@dataclass
class SpecSummary:
    """Speculation statistics of one request (proto SpecSummary)."""

    num_speculative_tokens: int = 0
    verify_steps: int = 0  # steps that verified at least one draft
    num_draft_tokens: int = 0  # drafts verified
    num_accepted_tokens: int = 0
    fallback_steps: int = 0
    # steps of a speculating request left without drafts by the verify budget
    unverified_steps: int = 0
    # accepted_per_pos[k]: verify steps whose drafts 1..k+1 were all accepted
    accepted_per_pos: list[int] = field(default_factory=list)
    # verified_per_pos[k]: verify steps that judged draft k+1 (drafts 1..k accepted
    # and draft k+1 verified); empty = every step verified all K (then it is
    # verify_steps for k = 0 and accepted_per_pos[k-1] after)
    verified_per_pos: list[int] = field(default_factory=list)
    committed_in_verify: int = 0  # tokens committed by verify steps (bonus included)

    @property
    def mean_accepted_length(self) -> float:
        return self.committed_in_verify / self.verify_steps if self.verify_steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(position k accepted | positions < k accepted and k verified), k = 1..K."""
        if self.verified_per_pos:
            return [a / v if v else 0.0
                    for a, v in zip(self.accepted_per_pos, self.verified_per_pos)]
        out, reached = [], self.verify_steps
        for n in self.accepted_per_pos:
            out.append(n / reached if reached else 0.0)
            reached = n
        return out


@dataclass
class RequestOutput:
    """Tokens a request committed in one scheduler update."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason = FinishReason.NONE
    spec: SpecSummary | None = None  # set on the final output of a request

    @property
    def finished(self) -> bool:
        return self.finish_reason != FinishReason.NONE
