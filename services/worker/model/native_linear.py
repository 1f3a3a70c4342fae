"""The native fp32 linear layer for decode and verify steps (CPU).

``native/linear_rows.cpp`` computes ``x @ w.T`` from a weight repacked once at
load into units of 16 output rows interleaved along k. On the project's 2-core
AVX2 CPU, over the default model's 30 layers and LM head (538 MB of fp32
weights), side by side in one process (``python -m
dspark.worker.model.native_linear``), against oneDNN's packed weights (what
an fp32 worker used before) and F.linear:

    rows          1      2      4      8     16     32     64    128    256    512
    F.linear   45.0   85.5   86.7   89.2   97.1  127.0  187.2  386.4  637.8 1105.3
    oneDNN     33.3   50.5   53.6   65.3   76.2  101.3  186.9  314.0  573.1 1116.5
    native     22.5   22.4   26.0   34.7   44.4   67.6  118.9  235.3  446.3 1043.7  ms

Every output is the plain sum over k in order, whatever the number of rows, so
a row's result does not depend on the batch it runs in: a verify window's rows
equal the same rows decoded one at a time, bit for bit.

``native/linear_bf16.cpp`` (``Bf16Linear``) is the same for bf16 on CPUs with
AVX512-BF16: k in pairs, one VDPBF16PS per pair and 16 outputs, float sums
rounded to bf16 once; a row's result independent of the batch as well. On the
project's 2-core AVX512-BF16 EPYC (``python -m dspark.worker.model.native_linear
--bf16``):

    rows          1      2      8     32    128    512
    F.linear   23.8   19.2   23.5   38.7   99.6  396.4
    oneDNN     12.2   14.3   13.7   27.9   86.4  374.0
    native      6.8    9.0   10.5   24.8   82.0  347.2  ms

A worker with ``--linear auto`` (the default) uses them for an fp32 model on
CPU, and a bf16 one where the CPU has AVX512-BF16, when the native kernels are
built (``make setup``); ``--linear native`` builds them if needed and refuses
to start without them; ``--linear torch`` keeps oneDNN's packed weights (or
``F.linear``).
"""
from __future__ import annotations

import logging
import sys
import time
from typing import NamedTuple

import torch

from . import hugepages, native_attention

log = logging.getLogger(__name__)
BACKENDS = ("auto", "native", "torch")
UNIT = 16  # outputs per packed unit (linear_rows.cpp, kUnit)


class RowsWeight(NamedTuple):
    """A weight [n, k] packed for ``linear_rows``: wp [ceil(n / 16), k, 16], or
    for ``linear_bf16``: wp [ceil(n / 16), k / 2, 16, 2]."""
    wp: torch.Tensor
    n: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.wp.shape[1] * (2 if self.wp.dim() == 4 else 1)


class GgufWeight(NamedTuple):
    """A weight [n, k] kept as its GGUF blocks, packed for ``linear_gguf``
    (``native/linear_gguf.cpp``): qp [ceil(n / 16), k / 32 * block bytes] uint8."""
    qp: torch.Tensor
    n: int
    k: int
    kind: int  # GGUF_KINDS index

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.k


# GGUF block types the kernel reads: (name, bytes a block of 32 weights in the file)
GGUF_KINDS = (("q4_1", 20), ("q8_0", 34))
GGUF_BLOCK = 32


def gguf_kind(name: str) -> int:
    names = [n for n, _ in GGUF_KINDS]
    if name not in names:
        raise ValueError(f"GGUF block type {name!r} is not supported: must be one of "
                         f"{', '.join(names)}")
    return names.index(name)


def _decode_blocks(blocks: torch.Tensor, kind: int
                   ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """File blocks [N, nb, file block bytes] -> (their float32 scales, each
    [N, nb, 1]: Q4_1 [d, m], Q8_0 [d]; q [N, nb, 32] in k order: Q4_1 0..15 as
    uint8, Q8_0 the int8 bytes as uint8)."""
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()
    if GGUF_KINDS[kind][0] == "q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16).float()
        qs = blocks[..., 4:]  # byte j: weight j (low nibble), weight j + 16 (high)
        return [d, m], torch.cat([qs & 15, qs >> 4], -1)
    return [d], blocks[..., 2:]


def pack_gguf(raw: torch.Tensor, kind: int) -> torch.Tensor:
    """The file's blocks of a matrix, raw [n, k / 32 * file block bytes] uint8 (row
    after row, as GGUF stores them), -> the layout ``linear_gguf`` reads: per
    unit of 16 outputs and block of 32 k, float32 scales (Q4_1: d[16] then
    m[16]; Q8_0: d[16]), then per k the 16 outputs' q (Q4_1: 8 bytes, output i
    in the low nibble of byte i and output i + 8 in its high nibble; Q8_0: 16
    int8). Padding outputs are zero (d = m = 0)."""
    name, file_bytes = GGUF_KINDS[kind]
    n, width = raw.shape
    if raw.dtype != torch.uint8 or width % file_bytes:
        raise ValueError(f"pack_gguf: a uint8 [n, blocks * {file_bytes}] matrix of {name} "
                         f"blocks, got {raw.dtype} {tuple(raw.shape)}")
    nb = width // file_bytes
    units = -(-n // UNIT)
    blocks = torch.zeros(units * UNIT, nb, file_bytes, dtype=torch.uint8)
    blocks[:n] = raw.view(n, nb, file_bytes)
    scales, q = _decode_blocks(blocks, kind)
    # [units, 16, nb, ...] -> [units, nb, ...]: per unit and block
    per_unit = [s.view(units, UNIT, nb).transpose(1, 2).contiguous().view(torch.uint8)
                for s in scales]  # [units, nb, 64] each
    q = q.view(units, UNIT, nb, GGUF_BLOCK).permute(0, 2, 3, 1)  # [units, nb, 32 k, 16]
    if name == "q4_1":
        q = q[..., :8] | (q[..., 8:] << 4)  # [units, nb, 32, 8]
    q = q.reshape(units, nb, -1)
    return torch.cat(per_unit + [q], -1).reshape(units, -1).contiguous()


def random_gguf_blocks(kind: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """GGUF blocks of a random [n, k] matrix as a file stores them (tests and
    benchmarks): every q value occurs, finite fp16 scales of both signs."""
    g = torch.Generator().manual_seed(seed)
    name, nbytes = GGUF_KINDS[kind]
    nb = k // GGUF_BLOCK
    raw = torch.randint(0, 256, (n, nb, nbytes), dtype=torch.uint8, generator=g)
    raw[..., 0:2] = (torch.randn(n, nb, generator=g) * 0.02).half().view(torch.uint8) \
        .view(n, nb, 2)
    if name == "q4_1":
        raw[..., 2:4] = (torch.randn(n, nb, generator=g) * 0.1).half().view(torch.uint8) \
            .view(n, nb, 2)
    return raw.view(n, nb * nbytes)


def packed_gguf_bytes(n: int, k: int, kind: int) -> int:
    """Bytes of a [n, k] matrix packed by ``pack_gguf`` (scales in float32)."""
    per_block = {"q4_1": 2 * UNIT * 4 + GGUF_BLOCK * UNIT // 2,
                 "q8_0": UNIT * 4 + GGUF_BLOCK * UNIT}[GGUF_KINDS[kind][0]]
    return -(-n // UNIT) * (k // GGUF_BLOCK) * per_block


def dequantize_gguf(raw: torch.Tensor, kind: int) -> torch.Tensor:
    """raw blocks [n, k / 32 * file block bytes] -> float32 [n, k], as the model's
    conversion computes them (numpy's d * q + m, or d * q), for checks."""
    n = raw.shape[0]
    scales, q = _decode_blocks(raw.reshape(n, -1, GGUF_KINDS[kind][1]), kind)
    if len(scales) == 2:  # Q4_1
        return (scales[0] * q.float() + scales[1]).reshape(n, -1)
    return (q.contiguous().view(torch.int8).float() * scales[0]).reshape(n, -1)


class _RowOps:
    """The native row ops a packed linear brings along, in its dtype: RMSNorm,
    the SwiGLU product (``native/row_ops.cpp``) and the drafter's attention
    (``native/drafter_attention.cpp``)."""

    def __init__(self, ext):
        self.ext = ext
        # packed weights go on huge pages where the OS gives them (hugepages.py)
        self.arena = hugepages.arena("cpu")

    def _place(self, wp: torch.Tensor) -> torch.Tensor:
        """A packed weight, moved into the arena (where there is one); the bf16
        kernel prefetches it as its pages call for (``huge_pages``)."""
        return wp if self.arena is None else self.arena.copy_in(wp)

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """F.rms_norm(x, (d,), w, eps) for x [T, d]."""
        return self.ext.rms_norm_rows(x.contiguous(), w, eps)

    def add_rms_norm(self, x: torch.Tensor, add: torch.Tensor, w: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """``x += add`` in place (x [T, d] contiguous), then ``rms_norm(x, w, eps)``:
        the residual stream's update and the next norm in one call."""
        return self.ext.add_rms_norm_rows(x, add.contiguous(), w, eps)

    def silu_mul(self, gu: torch.Tensor) -> torch.Tensor:
        """[gate | up] [T, 2I] -> F.silu(gate) * up."""
        return self.ext.silu_mul_rows(gu.contiguous())

    def rope(self, qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
             heads: int) -> torch.Tensor:
        """llama.py's rotate-half RoPE of the first ``heads`` heads of qkv [T, W] at
        cos / sin_signed [T, hd] -> [T, heads, hd] (x * cos + roll(x) * sin_signed,
        rounded as those ops round)."""
        return self.ext.rope_rows(qkv, cos, sin_signed, heads)

    def drafter_attention(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                          kb: torch.Tensor, vb: torch.Tensor, valid: torch.Tensor
                          ) -> torch.Tensor:
        """q [B, K, H, hd]; kc, vc [B, C, KV, hd]; kb, vb [B, K, KV, hd]; valid
        [B, C] bool -> [B, K, H, hd]: SDPA (scale hd^-0.5, GQA) of the block rows
        over the valid context rows and the whole block."""
        return self.ext.drafter_attention(q, kc, vc, kb, vb, valid, q.shape[-1] ** -0.5)


class RowsLinear(_RowOps):
    """``linear(x, w)`` and ``pack(w)`` over the native kernel (fp32, CPU)."""

    dtype = torch.float32

    def pack(self, w: torch.Tensor) -> RowsWeight:
        wp = self.ext.pack_rows_weight(w.detach().float().contiguous())
        return RowsWeight(self._place(wp), int(w.shape[0]))

    def pack_gguf(self, raw: torch.Tensor, kind: int) -> GgufWeight:
        """A matrix from its GGUF blocks (``pack_gguf``): the same float32 values
        as the dequantized matrix, ~1/5 of its bytes."""
        n = int(raw.shape[0])
        k = raw.shape[1] // GGUF_KINDS[kind][1] * GGUF_BLOCK
        return GgufWeight(self._place(pack_gguf(raw, kind)), n, k, kind)

    def unpack(self, w: GgufWeight) -> torch.Tensor:
        """The float32 values [n, k] a GGUF-packed weight holds."""
        return self.ext.unpack_gguf_weight(w.qp, w.n, w.k, w.kind)

    def __call__(self, x: torch.Tensor, w: RowsWeight | GgufWeight) -> torch.Tensor:
        gguf = isinstance(w, GgufWeight)
        if x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous():
            # the serving case: no wrapping ops
            return (self.ext.linear_gguf(x, w.qp, w.n, w.kind) if gguf
                    else self.ext.linear_rows(x, w.wp, w.n))
        lead, dt = x.shape[:-1], x.dtype
        x2 = x.reshape(-1, x.shape[-1]).float().contiguous()
        y = (self.ext.linear_gguf(x2, w.qp, w.n, w.kind) if gguf
             else self.ext.linear_rows(x2, w.wp, w.n))
        return y.view(*lead, w.n).to(dt)


class Bf16Linear(_RowOps):
    """``linear(x, w)`` and ``pack(w)`` over the AVX512-BF16 kernel
    (``native/linear_bf16.cpp``): bf16 weights and activations, float sums,
    a row's result independent of the batch; with the native RMSNorm and
    SwiGLU product in bf16 (computed in float, rounded once)."""

    dtype = torch.bfloat16

    def pack(self, w: torch.Tensor) -> RowsWeight:
        w = w.detach().to(torch.bfloat16)
        if w.shape[1] % 2:  # k in pairs: a zero column (x gets one too)
            w = torch.nn.functional.pad(w, (0, 1))
        return RowsWeight(self._place(self.ext.pack_bf16_weight(w.contiguous())), int(w.shape[0]))

    def __call__(self, x: torch.Tensor, w: RowsWeight) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.bfloat16 and x.is_contiguous() and \
                not x.shape[1] % 2:
            # the serving case: no wrapping ops
            return self.ext.linear_bf16(x, w.wp, w.n, self.arena is not None)
        lead, dt = x.shape[:-1], x.dtype
        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if x2.shape[1] % 2:
            x2 = torch.nn.functional.pad(x2, (0, 1))
        y = self.ext.linear_bf16(x2.contiguous(), w.wp, w.n, self.arena is not None)
        return y.view(*lead, w.n).to(dt)


def resolve(backend: str, device: torch.device,
            dtype: torch.dtype) -> RowsLinear | Bf16Linear | None:
    """The native linear (fp32, or bf16 on AVX512-BF16) for a worker's
    ``--linear`` choice, or None (oneDNN or F.linear). "auto" only loads kernels
    already built, so a worker never spends its start-up compiling; "native"
    builds them when missing, and one that cannot be had (another device or
    dtype, a CPU without AVX512-BF16 for bf16, no compiler) is a start-up error."""
    if backend not in BACKENDS:
        raise ValueError(f"linear={backend!r} is invalid: must be one of {', '.join(BACKENDS)}")
    if backend == "torch":
        return None
    why = ""
    if device.type != "cpu":
        why = f"it is a CPU kernel and the device is {device.type}"
    elif dtype not in (torch.float32, torch.bfloat16):
        why = (f"it is a float32 or bfloat16 kernel and the dtype is "
               f"{str(dtype).removeprefix('torch.')}")
    if why:
        if backend == "native":
            raise ValueError(f"linear='native' is unavailable: {why}")
        return None
    ext = native_attention.load(build=backend == "native")
    if ext is None:
        if backend == "native":
            raise ValueError(f"linear='native' is unavailable: "
                             f"{native_attention.unavailable_reason()}")
        log.warning("native linear unavailable (%s); using oneDNN",
                    native_attention.unavailable_reason())
        return None
    if dtype == torch.bfloat16:
        if not ext.has_linear_bf16():
            if backend == "native":
                raise ValueError("linear='native' is unavailable: the bfloat16 kernel needs "
                                 "a CPU with AVX512-BF16")
            return None
        return Bf16Linear(ext)
    return RowsLinear(ext)


def main() -> int:
    """Side by side, one process: native vs oneDNN-packed vs F.linear over the
    default model's layer shapes (30 layers + a 49152-row LM head), fp32 (and
    the native kernel over GGUF blocks of those shapes) or (``--bf16``, on a
    CPU with AVX512-BF16) bf16, where the fp32 upcast that prefill chunks use
    (``llama.fp32_linear``) runs beside them."""
    from .llama import fp32_linear, pack_weight, packed_linear, use_packed_linear

    ext = native_attention.load(build=True)
    if ext is None:
        print(f"native kernels unavailable: {native_attention.unavailable_reason()}",
              file=sys.stderr)
        return 1
    args = [a for a in sys.argv[1:] if a != "--bf16"]
    dtype = torch.bfloat16 if "--bf16" in sys.argv[1:] else torch.float32
    if dtype == torch.bfloat16 and not ext.has_linear_bf16():
        print("this CPU has no AVX512-BF16: no native bf16 kernel", file=sys.stderr)
        return 1
    lin = Bf16Linear(ext) if dtype == torch.bfloat16 else RowsLinear(ext)
    counts = [int(a) for a in args] or [1, 2, 4, 8, 16, 32, 64, 128, 256]
    g = torch.Generator().manual_seed(0)
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
    plain = [(torch.randn(n, k, generator=g) * 0.05).to(dtype) for n, k in shapes]
    impls = {"F.linear": (torch.nn.functional.linear, plain),
             "native": (lin, [lin.pack(w) for w in plain])}
    if use_packed_linear(plain[0]):
        impls["oneDNN"] = (packed_linear, [pack_weight(w) for w in plain])
    if dtype == torch.bfloat16:
        impls["fp32 upcast"] = (fp32_linear, plain)
    else:  # the default model's matrices as its GGUF file has them: layers Q4_1, head Q8_0
        kinds = [gguf_kind("q8_0" if n == 49152 else "q4_1") for n, _ in shapes]
        impls["GGUF blocks"] = (lin, [lin.pack_gguf(random_gguf_blocks(kd, n, k, seed=i), kd)
                                      for i, ((n, k), kd) in enumerate(zip(shapes, kinds))])
    print("rows  " + "  ".join(f"{n:>11}" for n in impls) + "   (ms, best of 5)")
    for m in counts:
        xs = {k: torch.randn(m, k, generator=g).to(dtype) for k in (576, 1536)}
        res = []
        for fn, ws in impls.values():
            def go():
                for w in ws:
                    fn(xs[w.shape[1]], w)
            go()
            ts = []
            for _ in range(5):
                t0 = time.perf_counter()
                go()
                ts.append(time.perf_counter() - t0)
            res.append(min(ts) * 1e3)
        print(f"{m:>4}  " + "  ".join(f"{t:11.1f}" for t in res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
