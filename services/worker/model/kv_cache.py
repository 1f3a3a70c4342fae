"""Paged KV cache and the attention over it.

The pool holds, per layer, keys and values per block and KV head, so that one
(sequence, KV head) reads each of its blocks as one contiguous run:

* values ``[num_blocks, n_kv, block_size, hd]``;
* keys ``[num_blocks, n_kv, hd / P, block_size, P]``: transposed, dimension
  group by dimension group, with ``P = key_pair(dtype)`` dimensions side by side
  (2 for bf16, the operand order of AVX-512 BF16's pair dot product, so a block
  of 16 keys is scored with one instruction per pair of dimensions and no
  conversion or transpose; 1 otherwise, so a block of one head is already the
  native kernel's transposed 16-key tile).

The scheduler owns block allocation; a sequence's block table says that block
``i`` holds positions ``[i*bs, (i+1)*bs)``, so position ``p`` lives in block
``block_ids[p // bs]`` at offset ``p % bs`` (its flat slot is
``block_ids[p // bs] * bs + p % bs``).

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
  each is attended on its own.

The PyTorch paths gather whole blocks with ``index_select`` and arrange them as
``[KV, L, hd]`` for SDPA, in a reusable workspace.

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


def key_pair(dtype: torch.dtype) -> int:
    """Dimensions stored side by side per key in the key pool (``P``): 2 for
    bf16, else 1."""
    return 2 if dtype == torch.bfloat16 else 1


def pool_shapes(num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                dtype: torch.dtype) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """One layer's key and value pool shapes (the module docstring)."""
    p = key_pair(dtype)
    if head_dim % p:
        raise ValueError(f"head_dim={head_dim} is invalid: must be a multiple of {p} for {dtype}")
    return ((num_blocks, n_kv_heads, head_dim // p, block_size, p),
            (num_blocks, n_kv_heads, block_size, head_dim))


def pack_keys(rows: torch.Tensor, block_size: int) -> torch.Tensor:
    """Keys in slot order ``[num_blocks * bs, KV, hd]`` -> one layer's key pool."""
    n, kvh, hd = rows.shape
    p = key_pair(rows.dtype)
    return (rows.view(n // block_size, block_size, kvh, hd // p, p)
            .permute(0, 2, 3, 1, 4).contiguous())


def pack_values(rows: torch.Tensor, block_size: int) -> torch.Tensor:
    """Values in slot order ``[num_blocks * bs, KV, hd]`` -> one layer's value pool."""
    n, kvh, hd = rows.shape
    return rows.view(n // block_size, block_size, kvh, hd).transpose(1, 2).contiguous()


def unpack_keys(pool: torch.Tensor) -> torch.Tensor:
    """One layer's key pool -> keys in slot order ``[num_blocks * bs, KV, hd]``."""
    nb, kvh, hp, bs, p = pool.shape
    return pool.permute(0, 3, 1, 2, 4).reshape(nb * bs, kvh, hp * p)


def unpack_values(pool: torch.Tensor) -> torch.Tensor:
    """One layer's value pool -> values in slot order ``[num_blocks * bs, KV, hd]``."""
    nb, kvh, bs, hd = pool.shape
    return pool.transpose(1, 2).reshape(nb * bs, kvh, hd)


class PagedKVCache:
    """The worker's KV pool: one key and one value tensor for all layers
    (``k[layer]``, ``v[layer]``: the shapes of ``pool_shapes``)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, n_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device,
                 prefault: bool = False):
        """prefault: make all of the pool resident now (a serving worker: its memory
        is taken at start-up, not as the pool fills under load); otherwise, on huge
        pages, pages become resident as they are first written (training, tests).
        PyTorch's zeros, where there are no huge pages, are written either way."""
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        k_shape, v_shape = pool_shapes(num_blocks, block_size, n_kv_heads, head_dim, dtype)
        k_shape, v_shape = (num_layers,) + k_shape, (num_layers,) + v_shape
        # Zeroed, not empty: padded/masked key slots are still multiplied (by a zero
        # weight), and uninitialized memory may hold NaNs (0 * NaN = NaN).
        # On CPU on huge pages where the OS gives them (hugepages.py: a step reads
        # rows from all over the pool).
        ar = hugepages.arena(device)
        if ar is not None:
            self.k = ar.zeros(k_shape, dtype, resident=prefault)
            self.v = ar.zeros(v_shape, dtype, resident=prefault)
        else:
            self.k = torch.zeros(k_shape, dtype=dtype, device=device)
            self.v = torch.zeros(v_shape, dtype=dtype, device=device)
        self._ws: tuple[torch.Tensor, torch.Tensor] | None = None

    def workspace(self, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Reusable K and V buffers (flat) for the PyTorch paths' gathers of up to
        ``n_blocks`` blocks: room for the gathered blocks and their arrangement.

        Gathering into fresh tensors costs a page fault per 4 KiB every step
        (large allocations are mmapped and returned to the OS), several times
        the copy itself; the buffers only ever grow.
        """
        per_block = self.block_size * self.n_kv_heads * self.head_dim
        if self._ws is None or self._ws[0].numel() < 2 * n_blocks * per_block:
            n = 2 * max(n_blocks, 64) * per_block
            self._ws = (torch.empty(n, dtype=self.k.dtype, device=self.k.device),
                        torch.empty(n, dtype=self.k.dtype, device=self.k.device))
        return self._ws

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, n_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * n_kv_heads * head_dim * elem


@dataclass
class KeySource:
    """Where one sequence's keys [0, ctx_len) live in the flat pool."""

    ctx_len: int
    lo: int = -1  # contiguous blocks [lo, lo + ceil(ctx_len / bs)) when >= 0 (no gather)
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
    # flat buffers of PagedKVCache.workspace(gather_blocks), set by the caller (None:
    # the PyTorch paths allocate)
    ws_k: torch.Tensor | None = None
    ws_v: torch.Tensor | None = None
    # flat element rows this step's K/V are written to, built on the first layer
    write_rows: tuple[torch.Tensor, torch.Tensor] | None = None
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
        return KeySource(ctx_len, lo=first)
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


def _pool_dims(pool: torch.Tensor) -> tuple[int, int, int]:
    """(KV heads, block size, head dim) of one layer's key pool (5-D) or value pool (4-D)."""
    if pool.dim() == 5:
        return pool.shape[1], pool.shape[3], pool.shape[2] * pool.shape[4]
    return pool.shape[1], pool.shape[2], pool.shape[3]


def _arrange(pool: torch.Tensor, blocks: torch.Tensor | None, lo: int, n: int,
             ws: torch.Tensor | None) -> torch.Tensor:
    """Keys or values of ``n`` blocks per sequence, arranged for SDPA: blocks
    ``[B, n]`` (or ``[n]``, or the contiguous run ``[lo, lo + n)`` when blocks is
    None) -> ``[B, KV, n * bs, hd]`` (``[KV, n * bs, hd]``). ``pool`` is one
    layer's key pool (5-D) or value pool (4-D)."""
    batch = () if blocks is None or blocks.dim() == 1 else (blocks.shape[0],)
    kvh, bs, hd = _pool_dims(pool)
    m = n * (batch[0] if batch else 1)
    size = m * bs * kvh * hd
    if blocks is None:
        sel = pool.narrow(0, lo, n)
    else:
        out = None if ws is None else ws[:size].view((m,) + tuple(pool.shape[1:]))
        sel = torch.index_select(pool, 0, blocks.reshape(-1), out=out)
    sel = sel.view(batch + (n,) + tuple(pool.shape[1:]))
    d = len(batch)  # the block axis
    if pool.dim() == 5:  # [.., n, KV, hd/P, bs, P] -> [.., KV, n, bs, hd/P, P]
        src = sel.permute(*range(d), d + 1, d, d + 3, d + 2, d + 4)
    else:  # [.., n, KV, bs, hd] -> [.., KV, n, bs, hd]
        src = sel.transpose(d, d + 1)
    shape = batch + (kvh, n * bs, hd)
    if ws is None:
        return src.reshape(shape)
    dst = ws[size:2 * size].view(src.shape)
    dst.copy_(src)
    return dst.view(shape)


def _keys(pool: torch.Tensor, src: KeySource, ws: torch.Tensor | None) -> torch.Tensor:
    """[KV, ctx_len, hd] keys or values of one sequence."""
    n = -(-src.ctx_len // _pool_dims(pool)[1])
    return _arrange(pool, src.blocks, src.lo, n, ws)[:, :src.ctx_len]


def _write_rows(meta: AttnMetadata, k_pool: torch.Tensor):
    """Rows of the flat pools (keys ``[-1, P]``, values ``[-1, hd]``) that this
    step's K/V go to: one per (row, KV head, dimension group) and (row, KV head)."""
    _, kvh, hp, bs, _ = k_pool.shape
    blk, off = meta.slots // bs, meta.slots % bs
    head = (blk[:, None] * kvh + torch.arange(kvh, device=blk.device))  # [T, KV]
    v_rows = head * bs + off[:, None]
    k_rows = (head[:, :, None] * hp + torch.arange(hp, device=blk.device)) * bs + off[:, None, None]
    return k_rows.reshape(-1), v_rows.reshape(-1)


def write_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, k_new: torch.Tensor,
             v_new: torch.Tensor, meta: AttnMetadata) -> None:
    """Write this step's K/V ``[T, KV, hd]`` into one layer's pools at meta.slots."""
    if meta.write_rows is None:
        meta.write_rows = _write_rows(meta, k_pool)
    k_rows, v_rows = meta.write_rows
    p, hd = k_pool.shape[4], v_pool.shape[3]
    k_pool.view(-1, p).index_copy_(0, k_rows, k_new.reshape(-1, p))
    v_pool.view(-1, hd).index_copy_(0, v_rows, v_new.reshape(-1, hd))


def paged_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                    k_pool: torch.Tensor, v_pool: torch.Tensor,
                    meta: AttnMetadata) -> torch.Tensor:
    """Write this step's K/V into the pool, then attend.

    q: [T, H, hd]; k_new, v_new: [T, KV, hd]; k_pool, v_pool: one layer's pools
    (``pool_shapes``). Returns [T, H*hd].
    """
    write_kv(k_pool, v_pool, k_new, v_new, meta)
    t, n_heads, hd = q.shape
    n_kv = k_new.shape[1]
    g = n_heads // n_kv
    sg = meta.short
    ws_k, ws_v = meta.ws_k, meta.ws_v
    if meta.decode1:  # batch-1 decode: no mask, no padding
        # 4-D inputs: 3-D ones fall back to the slow math kernel on CPU
        k = _keys(k_pool, sg.single, ws_k)[None]  # [1, KV, L, hd]
        v = _keys(v_pool, sg.single, ws_v)[None]
        o = F.scaled_dot_product_attention(q.reshape(1, n_kv, g, hd), k, v)  # [1, KV, G, hd]
        return o.reshape(1, n_heads * hd)
    out = torch.empty(t, n_heads, hd, dtype=q.dtype, device=q.device)
    if meta.native is not None:
        ng = meta.native
        ng.ext.paged_short_attention(q.contiguous(), k_pool, v_pool, ng.info, ng.tables,
                                     1.0 / math.sqrt(hd), out)
    if sg is not None:
        b, qn = sg.b, sg.q
        qs = q if sg.identity else q.index_select(0, sg.rows)  # [B*Q, H, hd]
        # fold the G query heads of each KV head into the query dim: [B, KV, G*Q, hd]
        qs = qs.reshape(b, qn, n_kv, g, hd).permute(0, 2, 3, 1, 4).reshape(b, n_kv, g * qn, hd)
        if sg.single is not None:
            k = _keys(k_pool, sg.single, ws_k)[None]  # [1, KV, L, hd]
            v = _keys(v_pool, sg.single, ws_v)[None]
        else:
            nb = sg.gather.shape[1]
            k = _arrange(k_pool, sg.gather, -1, nb, ws_k)  # [B, KV, nb*bs, hd]
            v = _arrange(v_pool, sg.gather, -1, nb, ws_v)
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=sg.mask)  # [B, KV, G*Q, hd]
        o = o.view(b, n_kv, g, qn, hd).permute(0, 3, 1, 2, 4).reshape(b * qn, n_heads, hd)
        if sg.identity:
            out.copy_(o)
        else:
            out.index_copy_(0, sg.dst_rows, o.index_select(0, sg.out_rows))
    for ch in meta.long:
        if ch.fold:  # [1, KV, G*n, hd] against un-repeated K/V
            qc = q[ch.row0:ch.row0 + ch.n].reshape(ch.n, n_kv, g, hd).permute(1, 2, 0, 3)
            k = _keys(k_pool, ch.keys, ws_k)[None]  # [1, KV, L, hd]
            v = _keys(v_pool, ch.keys, ws_v)[None]
            o = F.scaled_dot_product_attention(qc.reshape(1, n_kv, g * ch.n, hd), k, v,
                                               attn_mask=ch.mask)  # [1, KV, G*n, hd]
            out[ch.row0:ch.row0 + ch.n] = o.view(n_kv, g, ch.n, hd).permute(2, 0, 1, 3).reshape(
                ch.n, n_heads, hd)
            continue
        qc = q[ch.row0:ch.row0 + ch.n].transpose(0, 1).unsqueeze(0)  # [1, H, n, hd]
        if ch.start == 0:  # whole context is this chunk: plain causal attention
            k = k_new[ch.row0:ch.row0 + ch.n].transpose(0, 1)  # [KV, L, hd]
            v = v_new[ch.row0:ch.row0 + ch.n].transpose(0, 1)
        else:
            k = _keys(k_pool, ch.keys, ws_k)  # [KV, L, hd]
            v = _keys(v_pool, ch.keys, ws_v)
        k, v = k.unsqueeze(0), v.unsqueeze(0)  # [1, KV, L, hd]
        if g > 1:
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
        o = F.scaled_dot_product_attention(qc, k, v, attn_mask=ch.mask,
                                           is_causal=ch.mask is None)
        out[ch.row0:ch.row0 + ch.n] = o[0].transpose(0, 1)
    return out.view(t, n_heads * hd)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return math.ceil(num_tokens / block_size)
