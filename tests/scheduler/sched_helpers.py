"""Factories and a deterministic fake worker for the scheduler-core tests.

The fake worker keeps a real paged "KV cache" (one token id per slot) written
through the block tables the scheduler sends, and samples the next token as a
pure function of the sequence it reads back through the block table. So a
wrong block table, a wrong start position, a block shared by two requests or a
block reused too early all show up as a different token, and a request that is
preempted and recomputed must reproduce the tokens of an undisturbed run.
"""
from __future__ import annotations

from dataclasses import replace

from dspark.scheduler.core import Scheduler
from dspark.shared.config import SchedulerConfig
from dspark.shared.types import (FinishReason, SamplingParams, SeqOutput, StepOutput,
                                 StepPlan, WorkerInfo)

EOS = 2
VOCAB = 128


def create_scheduler(num_blocks: int = 64, block_size: int = 4, budget: int = 32,
                     max_num_seqs: int = 8, max_waiting: int = 64, max_model_len: int = 256,
                     watermark_blocks: int = 0, eos=(EOS,)) -> Scheduler:
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                             max_waiting=max_waiting)
    info = WorkerInfo(model_name="fake", model_id="fake", vocab_size=VOCAB, hidden_size=8,
                      num_layers=1, num_kv_blocks=num_blocks, block_size=block_size,
                      max_model_len=max_model_len, eos_token_ids=tuple(eos), dtype="float32",
                      device="cpu")
    return Scheduler(config, info, watermark_blocks=watermark_blocks)


def create_prompt(n: int, salt: int = 0) -> list[int]:
    return [(7 * i + 11 * salt) % 90 + 10 for i in range(n)]


def sampling(**kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 8, **kw})


def next_token(ctx: list[int], seed: int = 0) -> int:
    """The fake model: 3..99, never EOS, depends on every token and its position."""
    h = seed + len(ctx)
    for j, t in enumerate(ctx):
        h = (h * 31 + (j + 1) * t) % 1_000_003
    return h % 97 + 3


def reference(prompt: list[int], sp: SamplingParams, max_len: int = 256,
              eos=(EOS,), token_fn=next_token) -> tuple[list[int], FinishReason]:
    """Unbatched, unpaged generation with the same stop rules."""
    out: list[int] = []
    while True:
        tok = token_fn(prompt + out, sp.seed)
        out.append(tok)
        if (tok in eos and not sp.ignore_eos) or tok in sp.stop_token_ids:
            return out, FinishReason.STOP
        if len(out) >= sp.max_tokens or len(prompt) + len(out) >= max_len:
            return out, FinishReason.LENGTH


class FakeWorker:
    """Runs a StepPlan against a paged token store; see the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, token_fn=next_token) -> None:
        self.bs = block_size
        self.kv: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]
        self.token_fn = token_fn
        self.steps = 0
        self.deferred = 0  # deferred anchors resolved (async scheduling)
        self.last: dict[str, tuple[int, int]] = {}  # request -> (sampled token, its position)

    def step(self, plan: StepPlan) -> StepOutput:
        self.steps += 1
        seen: set[int] = set()
        for seq in plan.seqs:  # no block may be in two tables of one step
            assert not seen & set(seq.block_ids), f"block shared in step {plan.step_id}"
            seen |= set(seq.block_ids)
        deferred = set()
        seqs = []
        for seq in plan.seqs:  # async: the anchor is this worker's own last sample
            if seq.deferred_anchor:
                tok, pos = self.last[seq.request_id]
                seq = replace(seq, token_ids=[tok], start_position=pos, deferred_anchor=False)
                deferred.add(seq.request_id)
                self.deferred += 1
            seqs.append(seq)
        plan = replace(plan, seqs=seqs)
        for seq in plan.seqs:  # write every row first, like a batched forward
            for i, tok in enumerate(seq.token_ids):
                pos = seq.start_position + i
                self.kv[seq.block_ids[pos // self.bs]][pos % self.bs] = tok
        outs = []
        for seq in plan.seqs:
            tok = -1
            if seq.sample:
                end = seq.start_position + len(seq.token_ids)
                ctx = [self.kv[seq.block_ids[p // self.bs]][p % self.bs] for p in range(end)]
                assert None not in ctx
                tok = self.token_fn(ctx, seq.seed)
                self.last[seq.request_id] = (tok, end)
            out = SeqOutput(request_id=seq.request_id, token_id=tok)
            if seq.request_id in deferred:
                out.anchor_token, out.anchor_position = seq.token_ids[0], seq.start_position
            outs.append(out)
        return StepOutput(step_id=plan.step_id, outputs=outs)


def check_invariants(sched: Scheduler) -> None:
    """Blocks are owned exactly once and cover exactly the computed positions."""
    bs = sched.block_size
    owned: list[int] = []
    for rid in sched.running_ids():
        req = sched.get_request(rid)
        assert len(req.block_ids) == -(-req.num_computed_tokens // bs), rid
        owned += req.block_ids
    for rid in sched.waiting_ids():
        req = sched.get_request(rid)
        assert req.block_ids == [] and req.num_computed_tokens == 0, rid
    assert len(owned) == len(set(owned))
    assert sched.allocator.num_free + len(owned) == sched.allocator.num_total
    assert len(sched.running_ids()) <= sched.config.max_num_seqs


def drive(sched: Scheduler, worker: FakeWorker, max_steps: int = 10_000,
          on_step=None) -> dict[str, tuple[list[int], FinishReason]]:
    """Run until nothing is unfinished; returns request_id -> (outputs, finish reason)."""
    results: dict[str, tuple[list[int], FinishReason]] = {}
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return results
        plan = sched.schedule()
        assert plan is not None, "unfinished requests but nothing scheduled"
        assert sum(len(s.token_ids) for s in plan.seqs) <= sched.config.max_num_batched_tokens
        check_invariants(sched)
        output = worker.step(plan)
        if on_step is not None:
            on_step(plan)
        for ro in sched.update_from_output(plan, output):
            toks, _ = results.setdefault(ro.request_id, ([], FinishReason.NONE))
            toks.extend(ro.new_token_ids)
            results[ro.request_id] = (toks, ro.finish_reason)
        check_invariants(sched)
    raise AssertionError("did not finish")
