"""The argmax of logits rows, by the native kernel when it is built.

PyTorch's CPU argmax is not vectorized: on the project's 2-core AVX512-BF16
EPYC it takes ~300 us for one verify window's 8 rows of the default model's
49k vocabulary in float32 and ~760 us in bf16, ~2.3 ms for the 64 verify rows
of 8 speculating requests, and 7 of the drafter's 16k-slot rows per draft.
``native/row_ops.cpp``'s ``argmax_rows`` is one pass at vector width (~26 us
for the 8 rows; 10x at every size measured) and returns exactly what
``x.argmax(-1)`` returns: the first maximum, a NaN counting as the maximum
(``tests/worker/test_native_argmax.py``).

Used for every greedy pick on a CPU tensor (sampler, verification, drafting)
once the extension is built (``make setup``), whatever ``--attention`` and
``--linear`` say: the result is the same, only faster. Anything else (another
device, another dtype, no build) takes ``torch.argmax``.
"""
from __future__ import annotations

import torch

from . import native_attention

_KINDS = (torch.float32, torch.bfloat16)
_loaded: list = []  # the extension once found (a pick runs ~8 times a step)


def _ext():
    if not _loaded:
        ext = native_attention.load(build=False)
        if ext is None:  # not built (yet): ask again next time, it is cheap
            return None
        _loaded.append(ext)
    return _loaded[0]


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` for x [..., N] (int64 [...])."""
    if x.device.type != "cpu" or x.dtype not in _KINDS or x.dim() == 0 or x.shape[-1] == 0 \
            or x.numel() == 0:
        return x.argmax(-1)
    ext = _ext()
    if ext is None:
        return x.argmax(-1)
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if rows.stride(-1) != 1 or rows.stride(0) < rows.shape[1]:
        rows = rows.contiguous()
    return ext.argmax_rows(rows).view(x.shape[:-1])
