"""Continuous-batching scheduler: a pure state machine (no torch, no gRPC).

Interface (vLLM v1 style), driven by the servicer:

    add_request(...)            queue a request (FCFS)
    plan = schedule()           the next step, or None when there is nothing to run
    ... worker runs plan ...
    update_from_output(plan, output) -> list[RequestOutput]   commit sampled tokens
    abort(request_id)           at any time, also while a step is in flight

Each step first serves the running requests in admission order (a decoding
request computes 1 token: its last output; a request still prefilling gets a
chunk of what is left of the token budget), then admits waiting requests FCFS
while the budget, the sequence slots and the KV blocks allow.

``num_computed_tokens`` is advanced when a step is *planned*, as in vLLM v1: a
request whose next sample is in flight has no uncomputed tokens and is skipped
until the result arrives. If a step fails (worker lost), call
``reset_computed()`` so everything re-prefills.

KV blocks are allocated lazily as positions grow. When a running request needs
a block and none is free, the most recently admitted running request (possibly
itself) is preempted by recompute: its blocks are freed, num_computed reset to
0, and it goes to the front of the waiting queue keeping its outputs; on
re-admission it re-prefills prompt + outputs and samples the next token at the
same position, so (with position-seeded sampling) its output is unchanged.

Freeing blocks while a step is in flight (abort, preemption, reset): the
in-flight step may still write those blocks on the worker. That is safe only
because the worker executes steps strictly in the order they are dispatched,
and a freed block can be handed out only by a later ``schedule()``, i.e. to a
later step, whose writes land after the in-flight step's and whose reads see
only positions the new owner has written. A worker that reordered or
overlapped steps would break this.

Thread safety: every public method takes one lock, so the servicer may call
``abort``/``add_request``/``load`` from RPC threads while a step loop runs.
"""
from __future__ import annotations

import functools
import itertools
import threading
from collections import deque

from dspark.shared.acceptance import accept
from dspark.shared.config import SchedulerConfig
from dspark.shared.types import (FinishReason, RequestOutput, SamplingParams, SeqStep,
                                 SpecSummary, StepOutput, StepPlan, WorkerInfo)

from .block_allocator import BlockAllocator
from .errors import AdmissionError, DuplicateRequestError, RequestValidationError
from .request import Request, RequestStatus
from .speculation import SpeculationMixin


def _locked(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler(SpeculationMixin):
    """Request state, KV block allocation and step planning for one worker.
    Speculation (leases, drafts per step, verify results): ``SpeculationMixin``."""

    def __init__(self, config: SchedulerConfig, info: WorkerInfo,
                 watermark_blocks: int = 0) -> None:
        if info.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks={info.num_kv_blocks!r} is invalid: must be >= 1")
        if info.block_size < 1:
            raise ValueError(f"block_size={info.block_size!r} is invalid: must be >= 1")
        if info.max_model_len < 2:
            raise ValueError(f"max_model_len={info.max_model_len!r} is invalid: must be >= 2")
        if not 0 <= watermark_blocks < info.num_kv_blocks:
            raise ValueError(f"watermark_blocks={watermark_blocks!r} is invalid: "
                             f"must be in 0..{info.num_kv_blocks - 1}")
        self.config = config
        self.info = info
        self.block_size = info.block_size
        self.max_model_len = info.max_model_len
        self.watermark_blocks = watermark_blocks
        self.allocator = BlockAllocator(info.num_kv_blocks)
        # To compute position p a request needs KV for p+1 positions, so a
        # sequence can grow to at most num_blocks*bs + 1 tokens even when it
        # runs alone; capping it there (LENGTH) keeps a sole long request from
        # preempting itself forever when max_model_len exceeds the KV pool.
        self._max_len = min(info.max_model_len, info.num_kv_blocks * info.block_size + 1)
        self._eos = frozenset(info.eos_token_ids)
        self._requests: dict[str, Request] = {}  # live (unfinished) requests
        self._waiting: deque[Request] = deque()  # FCFS; preempted ones at the front
        self._running: list[Request] = []  # admission order, oldest first
        self._arrivals = itertools.count()
        self._step_ids = itertools.count()
        self.num_preemptions = 0  # total over the scheduler's life
        # Speculation (DSPARK.md 3, 4): K from the worker, a fixed pool of drafter
        # leases, the verify policy (speculation.py)
        self._init_speculation(info)
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ requests

    @_locked
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    sampling: SamplingParams) -> None:
        """Queue a request. Raises AdmissionError when the waiting queue is full,
        RequestValidationError (a ValueError) when the request is invalid."""
        prompt = [int(t) for t in prompt_token_ids]
        self._validate(request_id, prompt, sampling)
        if len(self._waiting) >= self.config.max_waiting:
            raise AdmissionError(f"waiting queue is full: {len(self._waiting)} requests "
                                 f"(max_waiting={self.config.max_waiting})")
        req = Request(request_id, prompt, sampling, arrival_seq=next(self._arrivals))
        req.spec = self._new_summary()
        self._requests[request_id] = req
        self._waiting.append(req)

    def _validate(self, request_id: str, prompt: list[int], sampling: SamplingParams) -> None:
        if not request_id:
            raise RequestValidationError("request_id", "must not be empty")
        if request_id in self._requests:
            raise DuplicateRequestError("request_id", f"{request_id!r} is already in use")
        if not prompt:
            raise RequestValidationError("prompt_token_ids", "must not be empty")
        if len(prompt) >= self.max_model_len:
            raise RequestValidationError(
                "prompt_token_ids", f"length {len(prompt)} must be < max_model_len="
                f"{self.max_model_len}")
        need = _cdiv(len(prompt), self.block_size)
        if need > self.allocator.num_total:
            raise RequestValidationError(
                "prompt_token_ids", f"length {len(prompt)} needs {need} KV blocks, more than "
                f"num_kv_blocks={self.allocator.num_total} (block_size={self.block_size})")
        vocab = self.info.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestValidationError(
                "prompt_token_ids", f"token id {bad} is out of range: must be in 0..{vocab - 1}")
        if sampling.max_tokens < 1:
            raise RequestValidationError(
                "max_tokens", f"{sampling.max_tokens} is invalid: must be >= 1")

    @_locked
    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish a live request with ABORT and free its blocks at once.

        Returns None for an unknown or already finished id (idempotent). A
        result of a step in flight for it is ignored by update_from_output.
        """
        req = self._requests.get(request_id)
        if req is None:
            return None
        if req.status == RequestStatus.RUNNING:
            self._running.remove(req)
        else:
            self._waiting.remove(req)
        self._finish(req, FinishReason.ABORT)
        return RequestOutput(request_id, [], FinishReason.ABORT,
                             self._summary(req, FinishReason.ABORT))

    def _finish(self, req: Request, reason: FinishReason) -> None:
        """Mark finished, free blocks, forget. The caller removed it from its queue."""
        self._free_blocks(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.pending_sample_step = None
        req.deferred_step = None
        del self._requests[req.request_id]

    def _free_blocks(self, req: Request) -> None:
        """Give back the request's KV blocks and its drafter lease (idempotent)."""
        if req.block_ids:
            self.allocator.free(req.block_ids)
            req.block_ids = []
        if req.lease_id >= 0:
            self._free_leases.append(req.lease_id)
            self._free_leases.sort()
            req.lease_id = -1

    # ------------------------------------------------------------------ planning

    @_locked
    def schedule(self) -> StepPlan | None:
        """Plan the next step; None when no request has anything to compute (with
        async scheduling: nothing that can be planned before the step in flight
        returns, ``_defer``)."""
        budget = self.config.max_num_batched_tokens
        step_id = next(self._step_ids)
        self._cands = []
        seqs, budget, preempted = self._schedule_running(step_id, budget)
        # As in vLLM v1: admitting right after a preemption would only thrash.
        if not preempted:
            seqs += self._admit_waiting(step_id, budget)
        if not seqs:
            return None
        verify_budget = step_ms = None
        if self.confidence_scheduled:  # drafts take what the rows left of the budget
            left = self.config.max_num_batched_tokens - sum(
                len(s.token_ids) or 1 for s in seqs)
            verify_budget, step_ms = self._size_verification(seqs, left)
        return StepPlan(step_id=step_id, seqs=seqs, verify_budget=verify_budget,
                        verify_step_ms=step_ms)

    def _schedule_running(self, step_id: int, budget: int) -> tuple[list[SeqStep], int, bool]:
        """Serve running requests oldest first; may preempt the youngest for blocks."""
        seqs: list[SeqStep] = []
        preemptions_before = self.num_preemptions
        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            n = min(req.num_uncomputed_tokens, budget)
            if n <= 0:  # its sample is in flight
                if self.config.async_scheduling and budget > 1:
                    seq = self._defer(step_id, req, budget)
                    if seq is not None:
                        seqs.append(seq)
                        budget -= 1 + seq.num_speculative_tokens
                i += 1
                continue
            n = self._grow_blocks(req, n)
            if n == 0:  # it preempted itself; it was the youngest, so the loop ends
                break
            k, cand = 0, False
            if self.num_spec and self.confidence_scheduled:
                cand = self._spec_eligible(req, n)  # drafts: _size_verification
            elif self.num_spec:
                k = self._spec_tokens(req, n, budget)
            seqs.append(self._make_seq(step_id, req, n, k))
            if cand:
                self._cands.append((seqs[-1], req, req.num_tokens - 1))
            budget -= n + k
            i += 1
        return seqs, budget, self.num_preemptions > preemptions_before

    def _grow_blocks(self, req: Request, n: int) -> int:
        """Allocate blocks so ``req`` can compute up to ``n`` more tokens.

        Returns how many tokens fit (a prefill chunk may shrink to the blocks
        available), or 0 when ``req`` had to preempt itself. Preempts the most
        recently admitted running requests while nothing fits.
        """
        bs = self.block_size
        while True:
            capacity = (len(req.block_ids) + self.allocator.num_free) * bs
            fit = min(n, capacity - req.num_computed_tokens)
            if fit > 0:
                need = _cdiv(req.num_computed_tokens + fit, bs) - len(req.block_ids)
                req.block_ids += self.allocator.allocate(max(need, 0))
                return fit
            victim = self._running[-1]
            self._preempt(victim)
            if victim is req:
                return 0

    def _preempt(self, req: Request) -> None:
        """Recompute preemption: free blocks, reset progress, requeue at the front."""
        self._running.remove(req)
        self._free_blocks(req)
        req.num_computed_tokens = 0
        req.pending_sample_step = None  # a sample in flight is recomputed on re-prefill
        req.deferred_step = None
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(req)

    def _admit_waiting(self, step_id: int, budget: int) -> list[SeqStep]:
        """Admit waiting requests FCFS (no skipping: the head blocks the queue)."""
        seqs: list[SeqStep] = []
        while self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
            req = self._waiting[0]
            n = min(req.num_uncomputed_tokens, budget)
            need = _cdiv(req.num_computed_tokens + n, self.block_size) - len(req.block_ids)
            # Keep a reserve for running requests' growth, but never let the
            # watermark starve an idle scheduler.
            reserve = self.watermark_blocks if self._running else 0
            if self.allocator.num_free - need < reserve:
                break
            if self.num_spec and req.lease_id < 0:
                if not self._free_leases:
                    break  # out of drafter leases: it waits, it is never failed
                req.lease_id = self._free_leases.pop(0)
            self._waiting.popleft()
            req.block_ids += self.allocator.allocate(need)
            req.status = RequestStatus.RUNNING
            self._running.append(req)
            seqs.append(self._make_seq(step_id, req, n))
            budget -= n
        return seqs

    def _make_seq(self, step_id: int, req: Request, n: int, k: int = 0) -> SeqStep:
        """The SeqStep computing tokens[num_computed : num_computed+n]; advances num_computed.
        k > 0: also draft and verify k tokens after the anchor (n = 1)."""
        start = req.num_computed_tokens
        end = start + n
        sample = end == req.num_tokens  # terminal chunk (or a decode step)
        req.num_computed_tokens = end
        if sample:
            req.pending_sample_step = step_id
            req.pending_spec_k = k
            # a one-token decode step of a request that could speculate
            req.pending_fallback = (k == 0 and n == 1 and req.lease_id >= 0
                                    and start >= req.num_prompt_tokens)
            req.pending_unverified = False
        sp = req.sampling
        return SeqStep(request_id=req.request_id, token_ids=req.token_slice(start, end),
                       start_position=start, block_ids=list(req.block_ids), sample=sample,
                       temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
                       seed=sp.seed, lease_id=req.lease_id, num_speculative_tokens=k)

    # ------------------------------------------------------------------ results

    @_locked
    def update_from_output(self, plan: StepPlan, output: StepOutput) -> list[RequestOutput]:
        """Commit the tokens a step sampled; returns one RequestOutput per request
        that committed a token or finished, in plan order.

        Results for requests aborted, preempted or reset since the plan was
        made are ignored. Raises ValueError (before changing any state) when
        the output does not belong to the plan or lacks a sampled token.
        """
        if output.step_id != plan.step_id:
            raise ValueError(f"output step_id={output.step_id} does not match "
                             f"plan step_id={plan.step_id}")
        by_id = {o.request_id: o for o in output.outputs}
        self.last_spec_events = []
        budgeted = plan.verify_budget is not None
        accepted = []
        verified = 0
        for seq in plan.seqs:
            req = self._requests.get(seq.request_id)
            if not seq.sample or req is None or req.pending_sample_step != plan.step_id:
                continue
            out = by_id.get(seq.request_id)
            if seq.deferred_anchor:  # reconcile: the worker's anchor must be ours
                want = (req.output_token_ids[-1], req.num_tokens - 1)
                got = (getattr(out, "anchor_token", None), getattr(out, "anchor_position", None))
                if got != want:
                    raise ValueError(f"step {plan.step_id}: {seq.request_id!r} was verified "
                                     f"from anchor {got}, the scheduler committed {want}")
            if seq.num_speculative_tokens:
                res = self._verify_result(plan.step_id, seq, out, budgeted)
                verified += res.num_drafts
                # accepted here, before any commit: a result acceptance rejects
                # (e.g. a skipped residual it would need) changes no state
                acc = accept(res, greedy=req.sampling.greedy)
                accepted.append((req, (res, acc), list(out.confidences)))
            elif out is None or not 0 <= out.token_id < self.info.vocab_size:
                raise ValueError(f"step {plan.step_id}: no valid sampled token for "
                                 f"{seq.request_id!r} (got {out})")
            else:
                accepted.append((req, out.token_id, None))
        if budgeted and verified > plan.verify_budget:
            raise ValueError(f"step {plan.step_id}: {verified} drafts verified, more than "
                             f"its verify_budget={plan.verify_budget}")
        self._observe_step(plan, output, by_id)
        return [self._commit(req, tok) if isinstance(tok, int)
                else self._commit_spec(req, *tok, conf) for req, tok, conf in accepted]

    def _commit(self, req: Request, token_id: int) -> RequestOutput:
        req.pending_sample_step = None
        req.output_token_ids.append(token_id)
        self._count_plain_step(req)  # one token of a request that could speculate
        reason = self._stop_reason(req, token_id)
        if reason != FinishReason.NONE:
            self._running.remove(req)
            self._finish(req, reason)
        elif req.deferred_step is not None:  # async: its next step is in flight
            self._promote_deferred(req)
        return RequestOutput(req.request_id, [token_id], reason, self._summary(req, reason))

    def _summary(self, req: Request, reason: FinishReason) -> SpecSummary | None:
        return req.spec if reason != FinishReason.NONE and self.num_spec else None

    def _stop_reason(self, req: Request, token_id: int) -> FinishReason:
        """Stop checks for one sampled token. A stop/EOS token stays in the
        outputs (as in vLLM); the router strips it from the text. Stop strings
        are the router's job (it calls abort). STOP wins over LENGTH when the
        last allowed token is also a stop token."""
        sp = req.sampling
        if (token_id in self._eos and not sp.ignore_eos) or token_id in sp.stop_token_ids:
            return FinishReason.STOP
        if req.num_output_tokens >= sp.max_tokens or req.num_tokens >= self._max_len:
            return FinishReason.LENGTH
        return FinishReason.NONE

    # ------------------------------------------------------------------ state

    @_locked
    def reset_computed(self) -> None:
        """The worker lost its KV (restart): every running request goes back to
        the front of the waiting queue, in admission order, to re-prefill
        prompt + outputs. Outputs are kept; not counted as preemptions."""
        for req in reversed(self._running):
            self._free_blocks(req)
            req.num_computed_tokens = 0
            req.pending_sample_step = None
            req.deferred_step = None
            req.status = RequestStatus.PREEMPTED
            self._waiting.appendleft(req)
        self._running.clear()

    @_locked
    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    @_locked
    def load(self) -> dict:
        """Load report for replica selection. outstanding_tokens = tokens still to
        compute plus outputs still allowed, over all live requests (an upper bound)."""
        outstanding = 0
        for req in self._requests.values():
            left = min(req.sampling.max_tokens - req.num_output_tokens,
                       self._max_len - req.num_tokens)
            outstanding += req.num_uncomputed_tokens + max(left, 0)
        return {
            "num_waiting": len(self._waiting),
            "num_running": len(self._running),
            "free_kv_blocks": self.allocator.num_free,
            "total_kv_blocks": self.allocator.num_total,
            "free_leases": len(self._free_leases),
            "total_leases": self.num_leases,
            "outstanding_tokens": outstanding,
        }

    @_locked
    def get_request(self, request_id: str) -> Request | None:
        """The live request (None once finished). For tests and introspection."""
        return self._requests.get(request_id)

    @_locked
    def tokens_for(self, request_id: str) -> list[int] | None:
        """prompt + outputs of a live request, or None."""
        req = self._requests.get(request_id)
        return None if req is None else req.all_token_ids

    @_locked
    def waiting_ids(self) -> list[str]:
        return [r.request_id for r in self._waiting]

    @_locked
    def running_ids(self) -> list[str]:
        return [r.request_id for r in self._running]
