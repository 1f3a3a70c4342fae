import pytest

from dspark.scheduler.core import BlockAllocator


def test_allocate_and_free_roundtrip():
    a = BlockAllocator(4)
    ids = a.allocate(3)
    assert len(set(ids)) == 3 and a.num_free == 1 and a.num_total == 4
    a.free(ids)
    assert a.num_free == 4 and a.num_allocated == 0


def test_exhaustion_is_all_or_nothing():
    a = BlockAllocator(3)
    first = a.allocate(2)
    assert a.allocate(2) is None
    assert a.num_free == 1  # the failed call took nothing
    assert a.allocate(1) is not None and a.allocate(1) is None
    assert not a.can_allocate(1)
    assert a.allocate(0) == []
    a.free(first)
    assert a.can_allocate(2)


def test_double_free_and_unowned_free_raise_without_side_effects():
    a = BlockAllocator(4)
    ids = a.allocate(2)
    a.free([ids[0]])
    with pytest.raises(ValueError, match="not allocated"):
        a.free([ids[0]])
    with pytest.raises(ValueError, match="not allocated"):
        a.free([ids[1], 99])
    assert a.num_allocated == 1  # ids[1] was not freed by the failed call
    with pytest.raises(ValueError, match="twice"):
        a.free([ids[1], ids[1]])
    a.free([ids[1]])
    assert a.num_free == 4


def test_freed_blocks_are_reused_last():
    a = BlockAllocator(3)
    x = a.allocate(1)
    a.free(x)
    assert x[0] not in a.allocate(2)


def test_invalid_sizes():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(0)
    with pytest.raises(ValueError):
        BlockAllocator(2).allocate(-1)
