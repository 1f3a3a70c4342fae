"""Paged KV cache and the attention over it.

The pool holds, per layer, K and V of shape ``[num_blocks, block_size, n_kv, hd]``.
The scheduler owns block allocation; a sequence's block table says that block
``i`` holds positions ``[i*bs, (i+1)*bs)``, so position ``p`` lives in the flat
slot ``block_ids[p // bs] * bs + p % bs``.

One step mixes prefill chunks and short query windows (decode / verify rows),
all flattened into a single token batch ``[T, ...]`` for the matmuls.
Attention is done per group (``AttnMetadata`` is built once per step):

* short sequences (<= ``SHORT_QUERY_MAX`` rows) are batched together, padded to
  ``[B, Q]`` query rows and ``[B, L]`` keys with a boolean mask; the GQA query
  heads of one KV head are folded into the query dimension so K/V are never
  repeated;
* long prefill chunks are done one by one (causal within the chunk, full
  attention to the cached prefix);
* when the short sequences' contexts are long (> ``BATCH_GATHER_MAX_KEYS`` keys in
  total), copying them into one padded batch is the bottleneck (memory bound), so
  each is attended on its own, on a view of its blocks when they are contiguous.

Gathers copy whole blocks with ``index_select`` into a reusable workspace.

With the native kernel (``native_attention.py``, the default on CPU where it
is built) every short window goes to it instead: one call per layer for all of
them, keys and values read from the pool in place; long chunks stay on SDPA.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import hugepages

SHORT_QUERY_MAX = 8  # rows; verify windows are at most 8 rows
# Above this many key positions in total, short windows are attended one sequence
# at a time on views of their blocks instead of one padded gather (memory-bound).
BATCH_GATHER_MAX_KEYS = 2048


class PagedKVCache:
    """The worker's KV pool: one K and one V tensor for all layers."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, n_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device,
                 prefault: bool = False):
        """prefault: make all of the pool resident now (a serving worker: its memory
        is taken at start-up, not as the pool fills under load); otherwise, on huge
        pages, pages become resident as they are first written (training, tests).
        PyTorch's zeros, where there are no huge pages, are written either way."""
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        shape = (num_layers, num_blocks, block_size, n_kv_heads, head_dim)
        # Zeroed, not empty: padded/masked key slots are still multiplied (by a zero
        # weight), and uninitialized memory may hold NaNs (0 * NaN = NaN).
        # On CPU on huge pages where the OS gives them (hugepages.py: a step reads
        # rows from all over the pool).
        ar = hugepages.arena(device)
        if ar is not None:
            self.k = ar.zeros(shape, dtype, resident=prefault)
            self.v = ar.zeros(shape, dtype, resident=prefault)
        else:
            self.k = torch.zeros(shape, dtype=dtype, device=device)
            self.v = torch.zeros(shape, dtype=dtype, device=device)
        # Flat per-layer views: [num_blocks * block_size, n_kv, hd]
        self.k_flat = [self.k[i].view(-1, n_kv_heads, head_dim) for i in range(num_layers)]
        self.v_flat = [self.v[i].view(-1, n_kv_heads, head_dim) for i in range(num_layers)]
        self._ws: tuple[torch.Tensor, torch.Tensor] | None = None

    def workspace(self, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Reusable K and V gather buffers of [n_blocks, bs, KV, hd].

        Gathering into fresh tensors costs a page fault per 4 KiB every step
        (large allocations are mmapped and returned to the OS), several times
        the copy itself; the buffers only ever grow.
        """
        if self._ws is None or self._ws[0].shape[0] < n_blocks:
            shape = (max(n_blocks, 64),) + tuple(self.k.shape[2:])
            self._ws = (torch.empty(shape, dtype=self.k.dtype, device=self.k.device),
                        torch.empty(shape, dtype=self.k.dtype, device=self.k.device))
        return self._ws[0][:n_blocks], self._ws[1][:n_blocks]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, n_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * n_kv_heads * head_dim * elem


@dataclass
class KeySource:
    """Where one sequence's keys [0, ctx_len) live in the flat pool."""

    ctx_len: int
    lo: int = -1  # contiguous slots [lo, lo + ctx_len) when >= 0 (no gather needed)
    blocks: torch.Tensor | None = None  # [ceil(ctx_len / bs)] block ids otherwise


@dataclass
class LongChunk:
    """One sequence attended on its own (a long prefill chunk, or a short query
    window when the batch's contexts are long enough that gathering them into one
    padded batch would cost more than a call per sequence)."""

    row0: int  # first row in the flattened batch
    n: int  # query rows
    start: int  # position of the first row
    keys: KeySource
    # [n, ctx_len] bool (folded: [1, 1, G*n, ctx_len]); None = causal over the chunk
    # (start == 0), or no mask at all for a folded single query row
    mask: torch.Tensor | None
    fold: bool = False  # fold GQA query heads into the query dim (short windows)


@dataclass
class ShortGroup:
    rows: torch.Tensor  # [B * Q] rows of the flattened batch (padding repeats a row)
    out_rows: torch.Tensor  # [n_valid] positions in the padded [B*Q] of real rows
    dst_rows: torch.Tensor  # [n_valid] their rows in the flattened batch
    b: int
    q: int
    single: KeySource | None  # B == 1: its keys (slice when contiguous, else its blocks)
    gather: torch.Tensor | None  # [B, nb] block ids (padding repeats a valid block)
    mask: torch.Tensor | None  # [B, 1, G*Q, nb*bs] bool, None when not needed
    identity: bool = False  # rows are exactly 0..T-1 in order (no scatter needed)


@dataclass
class NativeGroup:
    """Every short window of the step, for the native kernel (native_attention.py):
    one call per layer reads their keys from the pool in place."""

    ext: object  # the compiled module
    info: torch.Tensor  # [B, 3] int64: (first row, rows, position of the first row)
    tables: torch.Tensor  # [B, max blocks] int64 block ids (padded with 0)


@dataclass
class AttnMetadata:
    """Everything attention needs for one step, built once (not per layer)."""

    slots: torch.Tensor  # [T] flat slot each row's K/V is written to
    positions: torch.Tensor  # [T]
    block_size: int
    gather_blocks: int = 0  # most blocks one attention call gathers (workspace size)
    ws_k: torch.Tensor | None = None  # [>= gather_blocks, bs, KV, hd], set by the caller
    ws_v: torch.Tensor | None = None
    short: ShortGroup | None = None
    long: list[LongChunk] = field(default_factory=list)
    native: NativeGroup | None = None  # short windows, when the native kernel is used

    @property
    def decode1(self) -> bool:
        """One sequence with one query row: the batch-1 decode fast path."""
        sg = self.short
        return not self.long and sg is not None and sg.b == 1 and sg.q == 1


def _slots_for(block_ids: list[int], lo: int, hi: int, bs: int) -> list[int]:
    return [block_ids[p // bs] * bs + p % bs for p in range(lo, hi)]


def _key_source(block_ids: list[int], ctx_len: int, bs: int, device) -> KeySource:
    nb = -(-ctx_len // bs)
    first = block_ids[0]
    if all(block_ids[i] == first + i for i in range(1, nb)):
        return KeySource(ctx_len, lo=first * bs)
    return KeySource(ctx_len, blocks=torch.tensor(block_ids[:nb], dtype=torch.long, device=device))


def build_metadata(seqs: list[tuple[int, int, list[int]]], bs: int, group_size: int,
                   device: torch.device, native=None) -> AttnMetadata:
    """seqs: (start_position, n_rows, block_ids) per sequence, in batch order.
    ``native``: the compiled kernel module (native_attention.load()), which then
    attends every short window (CPU only)."""
    slots: list[int] = []
    positions: list[int] = []
    short: list[tuple[int, int, int, list[int]]] = []  # (row0, start, n, block_ids)
    long: list[LongChunk] = []
    native_rows: list[tuple[int, int, int, list[int]]] = []  # (row0, n, start, blocks)
    row = 0
    per_seq = len(seqs) > 1 and sum(st + n for st, n, _ in seqs
                                    if n <= SHORT_QUERY_MAX) > BATCH_GATHER_MAX_KEYS
    for start, n, block_ids in seqs:
        slots.extend(_slots_for(block_ids, start, start + n, bs))
        positions.extend(range(start, start + n))
        if n <= SHORT_QUERY_MAX and native is not None:
            native_rows.append((row, n, start, block_ids[:blocks_needed(start + n, bs)]))
        elif n <= SHORT_QUERY_MAX and not per_seq:
            short.append((row, start, n, block_ids))
        elif n <= SHORT_QUERY_MAX:
            keys = _key_source(block_ids, start + n, bs, device)
            long.append(LongChunk(row, n, start, keys, _fold_mask(start, n, group_size, device),
                                  fold=True))
        else:
            keys = _key_source(block_ids, start + n, bs, device)
            mask = None
            if start > 0:  # query i sees keys [0, start + i]
                q_pos = torch.arange(start, start + n, device=device)[:, None]
                mask = torch.arange(start + n, device=device)[None, :] <= q_pos
            long.append(LongChunk(row, n, start, keys, mask))
        row += n
    meta = AttnMetadata(
        slots=torch.tensor(slots, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        block_size=bs, long=long)
    if native_rows:
        width = max(len(b) for *_, b in native_rows)
        tables = torch.tensor([b + [0] * (width - len(b)) for *_, b in native_rows],
                              dtype=torch.long, device=device)
        info = torch.tensor([r[:3] for r in native_rows], dtype=torch.long, device=device)
        meta.native = NativeGroup(native, info, tables)
    if short:
        meta.short = _short_group(short, row, bs, group_size, device)
        sg = meta.short
        if sg.gather is not None:
            meta.gather_blocks = sg.gather.numel()
        elif sg.single.blocks is not None:
            meta.gather_blocks = sg.single.blocks.numel()
    for ch in long:
        if (ch.start > 0 or ch.fold) and ch.keys.blocks is not None:
            meta.gather_blocks = max(meta.gather_blocks, ch.keys.blocks.numel())
    return meta


def _fold_mask(start: int, n: int, g: int, device) -> torch.Tensor | None:
    """[1, 1, G*n, start+n] bool for n query rows with GQA heads folded in; None if n == 1."""
    if n == 1:
        return None
    qp = torch.arange(start, start + n, device=device)[:, None]
    m = torch.arange(start + n, device=device)[None, :] <= qp  # query j sees [0, start+j]
    return m.unsqueeze(0).expand(g, n, start + n).reshape(1, 1, g * n, start + n)


def _short_group(short, total_rows: int, bs: int, g: int, device) -> ShortGroup:
    b = len(short)
    q = max(n for _, _, n, _ in short)
    lmax = max(start + n for _, start, n, _ in short)
    rows, out_rows, dst_rows = [], [], []
    for i, (row0, _, n, _) in enumerate(short):
        rows.extend(row0 + min(j, n - 1) for j in range(q))
        out_rows.extend(i * q + j for j in range(n))
        dst_rows.extend(range(row0, row0 + n))
    t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    identity = b * q == total_rows == len(dst_rows) and rows == list(range(total_rows))
    if b == 1:
        _, start, n, block_ids = short[0]
        keys = _key_source(block_ids, start + n, bs, device)
        mask = _fold_mask(start, n, g, device)
        return ShortGroup(t(rows), t(out_rows), t(dst_rows), 1, q, keys, None, mask, identity)
    # Gather whole blocks (rows of bs*KV*hd contiguous elements: cheap to copy);
    # key slots past a sequence's own length are masked out.
    nbmax = -(-lmax // bs)
    gather = torch.empty(b, nbmax, dtype=torch.long)
    valid = torch.zeros(b, q, nbmax * bs, dtype=torch.bool)
    for i, (_, start, n, block_ids) in enumerate(short):
        nb = -(-(start + n) // bs)
        gather[i, :nb] = torch.tensor(block_ids[:nb])
        gather[i, nb:] = block_ids[0]
        for j in range(q):  # padded query rows repeat the last real row
            valid[i, j, :start + min(j, n - 1) + 1] = True
    lp = nbmax * bs
    mask = valid.unsqueeze(1).expand(b, g, q, lp).reshape(b, 1, g * q, lp)
    return ShortGroup(t(rows), t(out_rows), t(dst_rows), b, q, None, gather.to(device),
                      mask.to(device), identity)


def _gather(flat: torch.Tensor, blocks: torch.Tensor, bs: int, ws: torch.Tensor) -> torch.Tensor:
    """Copy whole blocks into the workspace: [n, bs, KV, hd] (index_select is ~10x
    faster than advanced indexing on CPU)."""
    kv, hd = flat.shape[1], flat.shape[2]
    out = ws[:blocks.numel()]
    return torch.index_select(flat.view(-1, bs, kv, hd), 0, blocks, out=out)


def _keys(flat: torch.Tensor, src: KeySource, bs: int, ws: torch.Tensor) -> torch.Tensor:
    """[ctx_len, n_kv, hd] keys or values of one sequence."""
    if src.blocks is None:
        return flat[src.lo:src.lo + src.ctx_len]
    kv, hd = flat.shape[1], flat.shape[2]
    return _gather(flat, src.blocks, bs, ws).view(-1, kv, hd)[:src.ctx_len]


def paged_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                    k_flat: torch.Tensor, v_flat: torch.Tensor,
                    meta: AttnMetadata) -> torch.Tensor:
    """Write this step's K/V into the pool, then attend.

    q: [T, H, hd]; k_new, v_new: [T, KV, hd]; k_flat, v_flat: [slots, KV, hd].
    Returns [T, H*hd].
    """
    k_flat.index_copy_(0, meta.slots, k_new)
    v_flat.index_copy_(0, meta.slots, v_new)
    t, n_heads, hd = q.shape
    n_kv, bs = k_new.shape[1], meta.block_size
    g = n_heads // n_kv
    sg = meta.short
    if meta.decode1:  # batch-1 decode: no mask, no padding (views when contiguous)
        # 4-D inputs: 3-D ones fall back to the slow math kernel on CPU
        k = _keys(k_flat, sg.single, bs, meta.ws_k).transpose(0, 1)[None]  # [1, KV, L, hd]
        v = _keys(v_flat, sg.single, bs, meta.ws_v).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(q.reshape(1, n_kv, g, hd), k, v)  # [1, KV, G, hd]
        return o.reshape(1, n_heads * hd)
    out = torch.empty(t, n_heads, hd, dtype=q.dtype, device=q.device)
    if meta.native is not None:
        ng = meta.native
        ng.ext.paged_short_attention(q.contiguous(), k_flat, v_flat, ng.info, ng.tables, bs,
                                     1.0 / math.sqrt(hd), out)
    if sg is not None:
        b, qn = sg.b, sg.q
        qs = q if sg.identity else q.index_select(0, sg.rows)  # [B*Q, H, hd]
        # fold the G query heads of each KV head into the query dim: [B, KV, G*Q, hd]
        qs = qs.reshape(b, qn, n_kv, g, hd).permute(0, 2, 3, 1, 4).reshape(b, n_kv, g * qn, hd)
        if sg.single is not None:
            k = _keys(k_flat, sg.single, bs, meta.ws_k).transpose(0, 1)[None]  # [1, KV, L, hd]
            v = _keys(v_flat, sg.single, bs, meta.ws_v).transpose(0, 1)[None]
        else:
            nb, flat_idx = sg.gather.shape[1], sg.gather.view(-1)
            k = _gather(k_flat, flat_idx, bs, meta.ws_k).view(b, nb * bs, n_kv, hd)
            v = _gather(v_flat, flat_idx, bs, meta.ws_v).view(b, nb * bs, n_kv, hd)
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, KV, nb*bs, hd]
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=sg.mask)  # [B, KV, G*Q, hd]
        o = o.view(b, n_kv, g, qn, hd).permute(0, 3, 1, 2, 4).reshape(b * qn, n_heads, hd)
        if sg.identity:
            out.copy_(o)
        else:
            out.index_copy_(0, sg.dst_rows, o.index_select(0, sg.out_rows))
    for ch in meta.long:
        if ch.fold:  # [1, KV, G*n, hd] against un-repeated K/V
            qc = q[ch.row0:ch.row0 + ch.n].reshape(ch.n, n_kv, g, hd).permute(1, 2, 0, 3)
            k = _keys(k_flat, ch.keys, bs, meta.ws_k).transpose(0, 1)[None]  # [1, KV, L, hd]
            v = _keys(v_flat, ch.keys, bs, meta.ws_v).transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(qc.reshape(1, n_kv, g * ch.n, hd), k, v,
                                               attn_mask=ch.mask)  # [1, KV, G*n, hd]
            out[ch.row0:ch.row0 + ch.n] = o.view(n_kv, g, ch.n, hd).permute(2, 0, 1, 3).reshape(
                ch.n, n_heads, hd)
            continue
        qc = q[ch.row0:ch.row0 + ch.n].transpose(0, 1).unsqueeze(0)  # [1, H, n, hd]
        if ch.start == 0:  # whole context is this chunk: plain causal attention
            k = k_new[ch.row0:ch.row0 + ch.n]
            v = v_new[ch.row0:ch.row0 + ch.n]
        else:
            k = _keys(k_flat, ch.keys, bs, meta.ws_k)  # [L, KV, hd]
            v = _keys(v_flat, ch.keys, bs, meta.ws_v)
        k = k.transpose(0, 1).unsqueeze(0)  # [1, KV, L, hd]
        v = v.transpose(0, 1).unsqueeze(0)
        if g > 1:
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
        o = F.scaled_dot_product_attention(qc, k, v, attn_mask=ch.mask,
                                           is_causal=ch.mask is None)
        out[ch.row0:ch.row0 + ch.n] = o[0].transpose(0, 1)
    return out.view(t, n_heads * hd)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return math.ceil(num_tokens / block_size)
