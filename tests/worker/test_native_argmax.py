"""The native argmax of logits rows (native/row_ops.cpp ``argmax_rows``, through
``native_argmax.argmax_rows``) returns exactly what ``torch.argmax`` returns.

Kernel tests skip, with the reason, where the native kernels cannot be built
(no C++ compiler); the fallback is tested everywhere.
"""
from __future__ import annotations

import pytest
import torch

from dspark.worker.model import native_argmax, native_attention

EXT = native_attention.load(build=True)
needs_ext = pytest.mark.skipif(
    EXT is None, reason=f"native kernels unavailable: {native_attention.unavailable_reason()}")


def _cases(seed: int):
    """Rows of every width class (below, at and past the 8 lanes; the 16k draft
    and 49k target vocabularies), with ties, -inf masks, all -inf rows and NaNs."""
    g = torch.Generator().manual_seed(seed)
    for trial in range(120):
        m = int(torch.randint(1, 40, (1,), generator=g))
        n = [1, 3, 7, 8, 9, 16, 17, 63, 1000, 16384, 49152][trial % 11]
        if n > 1000:
            m = min(m, 9)
        x = torch.randn(m, n, generator=g) * 4
        kind = trial % 6
        if kind == 1:
            x = x.round()  # many ties: the first maximum must win
        elif kind == 2:
            x[x < 0.5] = float("-inf")
        elif kind == 3:
            x[:] = float("-inf")
            x[m // 2, n - 1] = 1.0
        elif kind == 4:
            idx = torch.randint(0, m * n, (max(1, m // 3),), generator=g)
            x.view(-1)[idx] = float("nan")
        elif kind == 5:
            x[:] = 2.0  # every entry ties
        yield x


@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_torch_argmax(dtype):
    checked = 0
    for x in _cases(0):
        x = x.to(dtype)
        got, want = EXT.argmax_rows(x), x.argmax(-1)
        assert got.dtype == torch.long
        assert torch.equal(got, want), (tuple(x.shape), got.tolist(), want.tolist())
        checked += 1
    assert checked == 120


@needs_ext
def test_wrapper_shapes_and_strides():
    """Strided rows (a slice of a [B, K, V] block, as the drafter's loop reads),
    1-D and 3-D inputs, rows with a stride longer than the row: as torch."""
    g = torch.Generator().manual_seed(1)
    block = torch.randn(3, 7, 500, generator=g)
    for k in range(7):
        assert torch.equal(native_argmax.argmax_rows(block[:, k]), block[:, k].argmax(-1))
    assert torch.equal(native_argmax.argmax_rows(block), block.argmax(-1))
    row = torch.randn(1000, generator=g)
    got = native_argmax.argmax_rows(row)
    assert got.shape == () and int(got) == int(row.argmax())
    wide = torch.randn(4, 64, generator=g)[:, :40]  # row stride 64 > 40
    assert torch.equal(native_argmax.argmax_rows(wide), wide.argmax(-1))
    cols = torch.randn(40, 4, generator=g).t()  # column stride: copied first
    assert torch.equal(native_argmax.argmax_rows(cols), cols.argmax(-1))


def test_fallback_without_the_kernel(monkeypatch):
    """No build (or an int/float64 tensor): torch.argmax, same result."""
    monkeypatch.setattr(native_argmax, "_ext", lambda: None)
    x = torch.randn(5, 33, generator=torch.Generator().manual_seed(2))
    assert torch.equal(native_argmax.argmax_rows(x), x.argmax(-1))
    monkeypatch.undo()
    d = x.double()
    assert torch.equal(native_argmax.argmax_rows(d), d.argmax(-1))
    assert native_argmax.argmax_rows(torch.empty(0, 7)).shape == (0,)
