"""An in-process batched engine: the scheduler core driving a ModelRunner
directly, without gRPC. The same continuous batching, chunked prefill and
KV-block management as the served path, for offline jobs (drafter data
generation, evaluation) that want the engine's best throughput."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from dspark.scheduler.core import Scheduler
from dspark.shared.config import SchedulerConfig
from dspark.shared.types import SamplingParams


class OfflineEngine:
    """generate(): feed (id, prompt ids, params) items, yield (id, output ids,
    finish reason) as requests finish, keeping up to max_num_seqs in flight."""

    def __init__(self, runner, max_num_seqs: int = 32, max_num_batched_tokens: int = 1024,
                 info=None):
        self.runner = runner
        # info override: e.g. num_speculative_tokens=0 runs plain decoding on a
        # runner that has a drafter
        self.info = info or runner.info()
        self.config = SchedulerConfig(max_num_seqs=max_num_seqs,
                                      max_num_batched_tokens=max_num_batched_tokens,
                                      max_waiting=max_num_seqs)
        self.tokens_generated = 0
        self.core: Scheduler | None = None  # the last generate()'s (its spec_totals)

    def generate(self, items: Iterable[tuple[str, list[int], SamplingParams]]
                 ) -> Iterator[tuple[str, list[int], str]]:
        core = self.core = Scheduler(self.config, self.info)
        pending = iter(items)
        outputs: dict[str, list[int]] = {}
        exhausted = False
        while True:
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
            if plan is None:
                if exhausted and not core.has_unfinished():
                    return
                continue
            for out in core.update_from_output(plan, self.runner.step(plan)):
                outputs[out.request_id] += out.new_token_ids
                self.tokens_generated += len(out.new_token_ids)
                if out.finished:
                    self.runner.release([out.request_id])
                    yield out.request_id, outputs.pop(out.request_id), out.finish_reason.name
