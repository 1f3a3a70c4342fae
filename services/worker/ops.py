"""Operations hooks of the worker process: step metrics and the drain."""
from __future__ import annotations

import asyncio
import time

from dspark.shared.metrics import WorkerMetrics
from dspark.worker.servicer import WorkerServicer

# The worker has no admission of its own: after SIGTERM it keeps executing
# steps until its scheduler has been quiet this long (or the drain timeout).
DRAIN_IDLE_S = 1.0


class InstrumentedWorkerServicer(WorkerServicer):
    """WorkerServicer that times each step into the metrics and knows when
    its scheduler has gone quiet (for the drain)."""

    def __init__(self, metrics: WorkerMetrics, runner=None) -> None:
        super().__init__(runner)
        self.metrics = metrics
        self.steps_in_flight = 0
        self.last_step_at = 0.0  # time.monotonic() at the end of the last step

    async def Step(self, request, context):
        self.steps_in_flight += 1
        try:
            resp = await super().Step(request, context)
        finally:
            self.steps_in_flight -= 1
            self.last_step_at = time.monotonic()
        self.metrics.observe_step(resp.forward_ms / 1000.0, len(request.seqs),
                                  sum(len(s.token_ids) for s in request.seqs))
        return resp

    async def drain(self) -> None:
        """Return once no step runs and none arrived for DRAIN_IDLE_S."""
        while self.steps_in_flight or time.monotonic() - self.last_step_at < DRAIN_IDLE_S:
            await asyncio.sleep(0.05)
