"""Worker-side speculation: drafter leases (rings of cached context K/V) and drafting.

A lease is one request's drafter context on this worker. Its ring holds, per
draft layer, the context K/V (``DSparkDrafter.fuse_context``) of the last
R = W + K + 1 positions the target computed for the request, in slot
``position % R``, with the position stored beside it (-1 = empty).

Every target row the request computes is written eagerly: prefill chunks (so
the prompt's last W rows seed the first draft) and all K + 1 verify rows,
before acceptance is known. Rows past the accepted prefix are then stale, but
they sit at positions >= the next anchor's, which the drafter never attends to
(it sees only positions in [anchor - W, anchor)), and the next verify
overwrites them. R = W + K + 1 makes sure eager rows never evict a row that is
still inside the next window. So the ring needs no rollback and the worker no
acceptance: positions in each step say everything.

Written means staged: the runner copies a step's tap rows into the lease's
raw ring (same slots), and the drafter's context projection turns a lease's
staged rows into K/V only when that lease drafts (``flush``). Under
confidence-scheduled verification most steps of a speculating request draft
nothing; they then pay a copy instead of the projection (~6% of a plain
8-request decode step on a 2-core CPU).

A lease is reset (all positions -1) when it changes owner, so a reused lease
never shows the previous request's rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .model.drafter import DSparkDrafter
from .model.native_argmax import argmax_rows
from .sampler import RowParams
from .verify import sample_draft_rows


@dataclass
class DraftBatch:
    """Drafts for the speculating requests of one step (rows in request order)."""

    tokens: torch.Tensor              # [B, K] target token ids
    probs: torch.Tensor               # [B, K] p_k(d_k)
    dists: list[torch.Tensor | None]  # per request [K, V] (None: greedy, one-hot)
    confidences: torch.Tensor         # [B, K]


class LeasePool:
    """Fixed pool of drafter rings, memory reserved at start-up."""

    def __init__(self, drafter: DSparkDrafter, num_leases: int, num_spec_tokens: int,
                 device: torch.device):
        c = drafter.config
        self.drafter = drafter
        self.num_leases = num_leases
        self.ring = c.context_window + num_spec_tokens + 1
        kvh, hd = c.num_kv_heads, c.head_dim
        shape = (num_leases, self.ring, kvh, hd)
        dt = drafter.dtype
        self.k = [torch.zeros(shape, dtype=dt, device=device) for _ in drafter.layers]
        self.v = [torch.zeros(shape, dtype=dt, device=device) for _ in drafter.layers]
        self.pos = torch.full((num_leases, self.ring), -1, dtype=torch.long, device=device)
        # staged tap rows not yet projected (raw_pos -1: nothing staged in the slot)
        self.raw = torch.zeros((num_leases, self.ring, c.tap_width), dtype=dt, device=device)
        self.raw_pos = torch.full((num_leases, self.ring), -1, dtype=torch.long, device=device)
        self.owner: list[str | None] = [None] * num_leases

    @staticmethod
    def bytes_needed(drafter_config, num_leases: int, num_spec_tokens: int,
                     dtype: torch.dtype) -> int:
        c = drafter_config
        ring = c.context_window + num_spec_tokens + 1
        elem = torch.empty((), dtype=dtype).element_size()
        return num_leases * ring * ((2 * c.num_draft_layers * c.num_kv_heads * c.head_dim
                                     + c.tap_width) * elem + 16)

    def check(self, lease: int, request_id: str) -> None:
        if not 0 <= lease < self.num_leases:
            raise ValueError(f"request {request_id!r}: lease_id {lease} out of range "
                             f"[0, {self.num_leases})")

    def claim(self, lease: int, request_id: str) -> None:
        """Make ``request_id`` the owner; a new owner starts with an empty ring."""
        if self.owner[lease] != request_id:
            self.reset(lease)
            self.owner[lease] = request_id

    def reset(self, lease: int) -> None:
        """Forget every row of a lease (projected and staged)."""
        self.pos[lease] = -1
        self.raw_pos[lease] = -1

    def release(self, request_id: str) -> None:
        for i, o in enumerate(self.owner):
            if o == request_id:
                self.owner[i] = None
                self.reset(i)

    def free_count(self) -> int:
        return sum(o is None for o in self.owner)

    @torch.no_grad()
    def write(self, lease: int, start_position: int, taps: torch.Tensor) -> None:
        """Cache the context K/V of rows at start_position.. (only the last R matter)."""
        self.write_many([(lease, start_position, taps)])

    @torch.no_grad()
    def write_many(self, items: list[tuple[int, int, torch.Tensor]]) -> None:
        """``write`` for several leases at once (lease, start position, tap rows;
        each lease at most once): ``stage_many``, then ``flush`` of those leases."""
        self.stage_many(items)
        self.flush(sorted({lease for lease, _, _ in items}))

    @torch.no_grad()
    def stage_many(self, items: list[tuple[int, int, torch.Tensor]]) -> None:
        """Copy tap rows into the leases' raw rings (lease, start position, rows;
        each lease at most once), one scatter for all; ``flush`` projects them."""
        if not items:
            return
        # indices as Python lists, one tensor for all (a few ops a step, not a
        # few per lease: this runs every step of every speculating request)
        leases: list[int] = []
        positions: list[int] = []
        rows = []
        for lease, start, taps in items:
            n = taps.shape[0]
            if n > self.ring:
                taps, start, n = taps[-self.ring:], start + n - self.ring, self.ring
            leases += [lease] * n
            positions += range(start, start + n)
            rows.append(taps)
        idx = torch.tensor([leases, positions], dtype=torch.long, device=self.raw.device)
        lease_idx, pos = idx[0], idx[1]
        slot_idx = pos % self.ring
        taps = rows[0] if len(rows) == 1 else torch.cat(rows)
        self.raw[lease_idx, slot_idx] = taps.to(self.raw.dtype)
        self.raw_pos[lease_idx, slot_idx] = pos

    @torch.no_grad()
    def flush(self, leases: list[int]) -> None:
        """Project the staged rows of these leases into their K/V rings: one pass of
        the drafter's context projection over all of them, one scatter per draft
        layer (a step's rows done one lease at a time cost more than their share of
        the target forward at 32 requests)."""
        if not leases:
            return
        idx = torch.tensor(leases, dtype=torch.long, device=self.raw_pos.device)
        lease_idx, slot_idx = (self.raw_pos.index_select(0, idx) >= 0).nonzero(as_tuple=True)
        if lease_idx.numel() == 0:
            return
        lease_idx = idx.index_select(0, lease_idx)
        pos = self.raw_pos[lease_idx, slot_idx]
        for li, (kc, vc) in enumerate(self.drafter.fuse_context(self.raw[lease_idx, slot_idx],
                                                                pos)):
            self.k[li][lease_idx, slot_idx] = kc
            self.v[li][lease_idx, slot_idx] = vc
        self.pos[lease_idx, slot_idx] = pos
        self.raw_pos[lease_idx, slot_idx] = -1

    @torch.no_grad()
    def draft(self, leases: list[int], anchors: list[int], anchor_pos: list[int],
              params: list[RowParams], use_markov: bool = True,
              depth: int | None = None) -> DraftBatch:
        """Draft K tokens for each (lease, anchor at anchor_pos), at each request's
        sampling parameters (greedy rows: argmax; sampled rows: a seeded draw from
        the processed draft distribution at positions anchor_pos + 1..K). With a
        ``depth`` < K only the first ``depth`` drafts (and confidences) are made."""
        dr = self.drafter
        dev = self.pos.device
        self.flush(leases)
        idx = torch.tensor(leases, dtype=torch.long, device=dev)
        a = torch.tensor(anchors, dtype=torch.long, device=dev)
        ap = torch.tensor(anchor_pos, dtype=torch.long, device=dev)
        pos = self.pos.index_select(0, idx)
        ctx_kv = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in zip(self.k, self.v)]
        h = dr.backbone_cached(ctx_kv, pos, pos >= 0, a, ap)
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        rows: dict[int, list[torch.Tensor]] = {i: [] for i in sampled}

        every = len(sampled) == len(params)
        sel = torch.tensor(sampled, dtype=torch.long, device=dev) if sampled else None
        sub = [params[i] for i in sampled]

        def pick(k: int, logits: torch.Tensor):
            """(draft slots [B], p(draft) [B] float32 or None when all are greedy)."""
            if not sampled:
                return argmax_rows(logits), None
            probs, drawn, p_drawn = sample_draft_rows(
                logits if every else logits.index_select(0, sel), sub,
                [anchor_pos[i] + k + 1 for i in sampled])
            for j, i in enumerate(sampled):
                rows[i].append(probs[j])
            if every:
                return drawn, p_drawn
            p = torch.ones(len(params), dtype=torch.float32, device=dev)  # greedy: one-hot
            return (argmax_rows(logits).index_copy(0, sel, drawn.to(dev)),
                    p.index_copy(0, sel, p_drawn))

        # all greedy: the drafter's own argmax loop (one native call where built)
        out = dr.draft_from_h(h, a, use_markov=use_markov, pick=pick if sampled else None,
                              depth=depth)
        dists: list[torch.Tensor | None] = [None] * len(leases)
        for i in sampled:
            p = torch.stack(rows[i])  # [K, Vd]
            if dr.draft_vocab is not None:
                full = torch.zeros(p.shape[0], dr.config.target_vocab_size,
                                   dtype=torch.float32, device=dev)
                p = full.index_copy_(1, dr.draft_vocab, p)
            dists[i] = p
        return DraftBatch(out.tokens, out.probs, dists, out.confidences)
