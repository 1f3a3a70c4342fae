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


@dataclass
class StepPlan:
    """What the worker runs in one step (one batched target forward)."""

    step_id: int
    seqs: list[SeqStep]


@dataclass
class SeqOutput:
    """One sequence's result of a step."""

    request_id: str
    token_id: int = -1  # -1 when the step did not sample
    logprob: float = 0.0
    num_tap_rows: int = 0
    # [num_tap_rows, num_tap_layers * hidden] as a numpy array, when asked for
    tap_rows: object | None = None


@dataclass
class StepOutput:
    """The worker's result of a step; outputs are in the plan's order."""

    step_id: int
    outputs: list[SeqOutput]
    forward_ms: float = 0.0


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


@dataclass
class RequestOutput:
    """Tokens a request committed in one scheduler update."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason = FinishReason.NONE

    @property
    def finished(self) -> bool:
        return self.finish_reason != FinishReason.NONE
