"""An in-process batched engine: the scheduler core driving a ModelRunner
directly, without gRPC. The same continuous batching, chunked prefill and
KV-block management as the served path, for offline jobs (drafter data
generation, evaluation) that want the engine's best throughput."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator

from dspark.scheduler.core import Scheduler
from dspark.shared.config import SchedulerConfig
from dspark.shared.types import SamplingParams


class OfflineEngine:
    """generate(): feed (id, prompt ids, params) items, yield (id, output ids,
    finish reason) as requests finish, keeping up to max_num_seqs in flight.

    With a deadline (a time.monotonic() value) nothing new is admitted once it
    passes, requests still queued are dropped unanswered, and those running are
    cut where they are: each is yielded with the tokens it has (a prefix of
    its full answer) and the finish reason "DEADLINE", and every KV block and
    lease is given back, so a time budget is kept to within one step."""

    def __init__(self, runner, max_num_seqs: int = 32, max_num_batched_tokens: int = 1024,
                 info=None, async_scheduling: bool = False):
        self.runner = runner
        # info override: e.g. num_speculative_tokens=0 runs plain decoding on a
        # runner that has a drafter
        self.info = info or runner.info()
        if info is None and self.info.verify_policy == "confidence" \
                and self.info.sps_profile is None:
            # confidence scheduling needs the cost profile a served worker measures
            # at start-up; without it the scheduler would verify every draft
            runner.profile()
            self.info = runner.info()
        self.config = SchedulerConfig(max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=max_num_batched_tokens,
                                      max_waiting=max_num_seqs,
                                      async_scheduling=async_scheduling)
        self.tokens_generated = 0
        self.core: Scheduler | None = None  # the last generate()'s (its spec_totals)

    def generate(self, items: Iterable[tuple[str, list[int], SamplingParams]],
                 deadline: float | None = None) -> Iterator[tuple[str, list[int], str]]:
        core = self.core = Scheduler(self.config, self.info)
        pending = iter(items)
        outputs: dict[str, list[int]] = {}
        exhausted = False
        inflight: deque = deque()  # (plan, output) run but not applied yet
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                yield from self._cut(core, inflight, outputs)
                return
            # keep the waiting queue topped up so batches stay full
            while not exhausted and core.load()["num_waiting"] < self.config.max_num_seqs:
                try:
                    rid, prompt, params = next(pending)
                except StopIteration:
                    exhausted = True
                    break
                core.add_request(rid, prompt, params)
                outputs[rid] = []
            plan = core.schedule()
            if plan is not None:
                inflight.append((plan, self.runner.step(plan)))
            elif not inflight:
                if exhausted and not core.has_unfinished():
                    return
                continue
            # async: step N+1 was planned (and run) before step N's result is applied
            keep = 1 if (self.config.async_scheduling and plan is not None) else 0
            while len(inflight) > keep:
                yield from self._apply(core, *inflight.popleft(), outputs)

    def _apply(self, core: Scheduler, plan, output, outputs: dict[str, list[int]]
               ) -> Iterator[tuple[str, list[int], str]]:
        """Apply one step's result; yield the requests it finished."""
        for out in core.update_from_output(plan, output):
            outputs[out.request_id] += out.new_token_ids
            self.tokens_generated += len(out.new_token_ids)
            if out.finished:
                self.runner.release([out.request_id])
                yield out.request_id, outputs.pop(out.request_id), out.finish_reason.name

    def _cut(self, core: Scheduler, inflight: deque, outputs: dict[str, list[int]]
             ) -> Iterator[tuple[str, list[int], str]]:
        """The deadline passed: apply the steps already run, then abort the rest."""
        while inflight:
            yield from self._apply(core, *inflight.popleft(), outputs)
        for rid in core.waiting_ids() + core.running_ids():
            core.abort(rid)
            self.runner.release([rid])
            toks = outputs.pop(rid, [])
            if toks:
                yield rid, toks, "DEADLINE"
