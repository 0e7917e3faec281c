"""The padding arithmetic of tools/bench/padding_bench.py (pure: no TensorFlow, no processes)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "bench"))

from padding_bench import fixed_batches, padded_share, sorted_pieces  # noqa: E402


def test_padding_is_counted_per_batch_and_sorting_within_an_update_reduces_it():
    lengths = [1, 9, 2, 8, 3, 7, 4, 6]
    assert fixed_batches(lengths, 2) == [[1, 9], [2, 8], [3, 7], [4, 6]]
    assert padded_share(fixed_batches(lengths, 2)) == (40, 18 + 16 + 14 + 12)
    assert sorted_pieces(lengths, 4, 2) == [[1, 2], [8, 9], [3, 4], [6, 7]]
    assert padded_share(sorted_pieces(lengths, 4, 2)) == (40, 4 + 18 + 8 + 14)
    assert padded_share(sorted_pieces([1, 9, 9, 1], 2, 1)) == padded_share(fixed_batches([1, 9, 9, 1], 1))  # no padding
    assert padded_share(sorted_pieces([1, 9, 1, 9], 4, 2)) == (20, 2 + 18)  # one update: [1, 1], [9, 9]
