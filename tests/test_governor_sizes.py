"""Micro-batch size arithmetic: legal sizes under a multiple, accumulation, splitting an update."""

import pytest

from edgebatch.governor import accumulation_steps_for, split_micro_batches
from edgebatch.governor.sizes import is_legal_size, legal_above, legal_at_least, legal_at_most, legal_below


@pytest.mark.parametrize("total, micro_batch", [(100, 32), (128, 32), (7, 7), (1, 64), (65, 8), (0, 4)])
def test_split_sums_exactly_with_full_micro_batches_first(total, micro_batch):
    sizes = split_micro_batches(total, micro_batch)
    assert sum(sizes) == total
    assert len(sizes) == accumulation_steps_for(total, micro_batch)
    assert all(size == micro_batch for size in sizes[:-1])
    assert all(0 < size <= micro_batch for size in sizes)


def test_split_example():
    assert split_micro_batches(100, 32) == [32, 32, 32, 4]


@pytest.mark.parametrize("total, micro_batch, quoted", [(-1, 4, "-1"), (10, 0, "0"), (10, 2.0, "2.0")])
def test_split_rejects_bad_arguments(total, micro_batch, quoted):
    with pytest.raises(ValueError, match=quoted.replace(".", r"\.")):
        split_micro_batches(total, micro_batch)


@pytest.mark.parametrize("multiple", [1, 2, 3, 8])
def test_legal_rounding_agrees_with_is_legal(multiple):
    for size in range(1, 50):
        down, up = legal_at_most(size, multiple), legal_at_least(size, multiple)
        assert is_legal_size(down, multiple) and down <= size
        assert is_legal_size(up, multiple) and up >= size
        assert not any(is_legal_size(s, multiple) for s in range(down + 1, size + 1))  # tightest
        assert not any(is_legal_size(s, multiple) for s in range(size, up))
        assert legal_above(size, multiple) > size and is_legal_size(legal_above(size, multiple), multiple)
        assert legal_below(size, multiple) < size
