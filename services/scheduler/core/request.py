"""Per-request state of the scheduler (vLLM-v1 style).

There are no prefill/decode phases: a request has a token sequence
``prompt + outputs`` (``num_tokens``) of which the first ``num_computed_tokens``
have KV on the worker. A step computes ``tokens[num_computed : num_computed+n]``;
when that reaches ``num_tokens`` the step samples the next token, which is
appended to the outputs and becomes the next step's input.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dspark.shared.types import FinishReason, SamplingParams, SpecSummary


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # never admitted yet
    RUNNING = "running"  # admitted: holds KV blocks, scheduled each step while it has work
    PREEMPTED = "preempted"  # back in the waiting queue, blocks freed, re-prefills on admission
    FINISHED = "finished"  # stopped, hit a length limit, or aborted


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_seq: int  # order of add_request (FCFS tie-breaker, debugging)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # advanced when a step is scheduled
    status: RequestStatus = RequestStatus.WAITING
    block_ids: list[int] = field(default_factory=list)  # block table; block i = [i*bs, (i+1)*bs)
    finish_reason: FinishReason = FinishReason.NONE
    num_preemptions: int = 0
    # step_id of the scheduled step that will sample this request's next token,
    # None when no sample is outstanding. A result is accepted only from that
    # step, so results of steps planned before an abort/preemption/reset are
    # dropped instead of being appended twice.
    pending_sample_step: int | None = None
    # Speculation: the drafter lease held (-1 = none), K of the step in flight,
    # whether the request fell back to one token per step for good, and its stats.
    lease_id: int = -1
    pending_spec_k: int = 0
    pending_fallback: bool = False
    # Async scheduling: a second speculative step planned while the one above is in
    # flight; its anchor is the worker's own acceptance of that step (None = none).
    deferred_step: int | None = None
    deferred_k: int = 0
    # how its deferred step counts if it drafts nothing: "fallback" | "unverified" | ""
    deferred_note: str = ""
    # Confidence-scheduled verification: the step in flight is a one-token step the
    # verify budget left without drafts; the drafter's confidences c_1..c_K of the
    # last verify result (the next step's estimate).
    pending_unverified: bool = False
    spec_confidences: list[float] = field(default_factory=list)
    spec_conf_age: int = 0  # steps run without drafting since spec_confidences came
    spec_fallback: bool = False
    spec: SpecSummary = field(default_factory=SpecSummary)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Length of the known sequence, prompt + outputs."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to compute before the next sample (0 while a sample is in flight)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """tokens[start:end] of prompt + outputs without building the whole list."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p:end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - p]

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED
