"""Start-up cost profile of a speculating worker (DSPARK.md 4.2, SPS(B)).

Measures, after warm-up, the wall time of one target forward over B verify-like
rows (windows of up to K + 1 rows per sequence after a shared context, logits for
every row, tap rows captured: what a verify step computes) for B on a small
grid, and the drafter's cost for 1 and n requests at depth 1 (-> fixed + per
request) and for n at depth K (-> per request and position past the first). The
scheduler sizes each step's verify budget from it
(``dspark.scheduler.core.verify_budget``).

It is kept short: each grid point is timed twice (the faster counts), and the
walk up the grid stops once the next point would not fit the time budget; the
profile extrapolates linearly past the last point measured (where a forward is
compute-bound, its time grows linearly with the rows). KV blocks and leases
used here are scratch: nothing is served yet, and every later owner writes a
position before it reads it (leases are reset when claimed).
"""
from __future__ import annotations

import time

import torch

from dspark.shared.types import SpsProfile

from .model.kv_cache import build_metadata
from .model.native_argmax import argmax_rows
from .sampler import RowParams

# Row counts timed. 2 and 4 because the curve is not straight between 1 and 8:
# on the 2-core AVX512-BF16 CPU with the weights on huge pages a 1-row forward
# is memory-bound and a few more rows cost little (2-5 rows ~+1 ms of ~10.6),
# while 6-8 rows are compute-bound (~+3): a line from 1 to 8 overprices the
# short verify windows the confidence budget picks at batch 1.
GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXT = 128  # positions of context each verify window attends to


def _best_ms(fn, reps: int = 2) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def non_decreasing(times: list[float]) -> list[float]:
    """The closest non-decreasing curve (least squares: adjacent points that
    disagree are pooled into their mean). More rows never cost less, so a
    point timed low or high by noise is averaged with its neighbour rather
    than kept, or copied onto every point after it."""
    blocks: list[list[float]] = []  # [mean, count]
    for t in times:
        blocks.append([t, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


@torch.inference_mode()
def measure(runner, budget_s: float = 2.0, grid=GRID) -> SpsProfile:
    """The runner's SpsProfile; ``budget_s`` bounds the forward grid's time."""
    model, kv, dev = runner.model, runner.kv, runner.device
    a = model.args
    bs = runner.block_size
    window = runner.num_spec + 1
    ctx = max(0, min(CONTEXT, kv.num_blocks * bs - window, runner.max_model_len - window))
    blocks = list(range(-(-(ctx + window) // bs)))
    taps_w = len(runner.tap_layers) * a.hidden_size

    def forward(rows: int) -> None:
        seqs, left = [], rows
        while left > 0:  # verify windows; all share the scratch context blocks
            n = min(window, left)
            seqs.append((ctx, n, blocks))
            left -= n
        meta = build_metadata(seqs, bs, a.num_heads // a.num_kv_heads, dev,
                              native=runner.native_attention)
        if meta.gather_blocks:
            meta.ws_k, meta.ws_v = kv.workspace(meta.gather_blocks)
        tokens = torch.arange(rows, device=dev) % a.vocab_size
        taps = (torch.empty(rows, taps_w, dtype=runner.dtype, device=dev)
                if taps_w else None)
        logits = model.forward(tokens, meta, kv, torch.arange(rows, device=dev),
                               runner.tap_layers, taps)
        argmax_rows(logits)  # the verify rows' greedy reduction

    t_start = time.perf_counter()
    forward(min(8, grid[-1]))  # shapes warm
    rows, times = [], []
    for b in grid:
        if rows:
            spent = time.perf_counter() - t_start
            # the next point costs about 2 forwards of the extrapolated time
            guess = times[-1] * b / rows[-1] * 2 / 1e3
            if len(rows) >= 2 and spent + guess > budget_s:
                break
        rows.append(b)
        times.append(_best_ms(lambda: forward(b)))
    fixed, per, per_pos = _draft_cost(runner, ctx, evict=lambda: forward(1))
    times = non_decreasing(times)
    return SpsProfile(rows=tuple(rows), forward_ms=tuple(times), draft_fixed_ms=fixed,
                      draft_per_request_ms=per, draft_per_position_ms=per_pos)


def _draft_cost(runner, ctx: int, evict=None) -> tuple[float, float, float]:
    """(fixed, per request, per request and position past the first) ms of
    drafting, from batches of 1 and n requests at depth 1 and n at depth K (the
    scheduler asks for min(K, budget) drafts: at a budget of 1 the draft head
    and Markov step run for one position; at 8 concurrent requests on the
    project's 2-core CPU depth 1 costs ~0.5 ms a request against ~1 at 7).

    In a step the drafter runs after the target's forward has passed every
    weight of the target through the caches, so its own weights (the layers, the
    draft head's rows: ~37 MB for the default model, more than the L3) come from
    memory, and the previous step's verify rows are staged in the lease, to be
    projected into its ring first (``LeasePool.flush``). Timed back to back
    without them a draft measures ~2 ms at batch 1 on the 2-core CPU against
    4-5 in the serving loop, so before each timed draft ``evict`` (a target
    forward) runs and K + 1 rows are staged per drafting lease."""
    pool = runner.leases
    n = min(8, pool.num_leases)
    ids = list(range(n))
    names = [f"__profile__{i}" for i in ids]
    a = runner.model.args
    ctx = max(ctx, 1)
    taps = torch.randn(ctx, len(runner.tap_layers) * a.hidden_size,
                       device=runner.device).to(runner.dtype) * 0.1
    try:
        for lease, name in zip(ids, names):
            pool.claim(lease, name)
            pool.write(lease, 0, taps)
        params = [RowParams(0.0, 0, 1.0, 0, ctx)] * n

        k = runner.num_spec
        window = min(k + 1, ctx)

        def timed(m: int, depth: int, reps: int = 2) -> float:
            best = float("inf")
            for _ in range(reps):
                if evict is not None:
                    evict()
                pool.stage_many([(lease, ctx - window, taps[-window:]) for lease in ids[:m]])
                t0 = time.perf_counter()
                pool.draft(ids[:m], [1] * m, [ctx] * m, params[:m], depth=depth)
                best = min(best, (time.perf_counter() - t0) * 1e3)
            return best

        timed(n, k, reps=1)  # warm
        one = timed(1, 1)
        many = timed(n, 1)
        deep = timed(n, k)
    finally:
        for name in names:
            pool.release(name)
    per_pos = max(0.0, (deep - many) / (n * (k - 1))) if k > 1 else 0.0
    if n == 1:
        return one, 0.0, per_pos
    per = max(0.0, (many - one) / (n - 1))
    return max(0.0, one - per), per, per_pos
