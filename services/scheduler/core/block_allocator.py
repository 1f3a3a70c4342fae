"""Paged-KV block allocator: hands out block ids of the worker's KV pool.

The scheduler owns the ids; the worker only ever uses the ids a step names.
Block ``i`` of a request's table holds positions ``[i*bs, (i+1)*bs)``.
"""
from __future__ import annotations

from collections import deque


class BlockAllocator:
    """A free list over ``num_blocks`` block ids, ``0 .. num_blocks-1``.

    Freed ids go to the back of the free list (FIFO reuse), so a just-freed
    block is handed out as late as possible. Freeing an id that is not
    currently allocated raises, which catches double frees.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks!r} is invalid: must be >= 1")
        self._num_total = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._allocated: set[int] = set()

    @property
    def num_total(self) -> int:
        return self._num_total

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_allocated(self) -> int:
        return len(self._allocated)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh block ids, or None (and nothing allocated) if too few are free."""
        if n < 0:
            raise ValueError(f"n={n!r} is invalid: must be >= 0")
        if n > len(self._free):
            return None
        ids = [self._free.popleft() for _ in range(n)]
        self._allocated.update(ids)
        return ids

    def free(self, ids: list[int]) -> None:
        """Return ``ids`` to the pool; all-or-nothing: raises if any is not allocated."""
        ids = list(ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"free({ids}): block id listed twice")
        bad = [i for i in ids if i not in self._allocated]
        if bad:
            raise ValueError(f"free({ids}): blocks {bad} are not allocated (double free?)")
        self._allocated.difference_update(ids)
        self._free.extend(ids)
