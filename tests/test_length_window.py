"""The length window's plan (training/length_window.py): pure, no TensorFlow."""

import numpy as np
import pytest

from edgebatch.errors import UsageError
from edgebatch.training.length_window import WindowedExamples, plan_window, updates_done, window_seed

LENGTHS = [9, 1, 30, 4, 4, 17, 2, 25, 8, 3, 12, 6]


def test_every_position_is_in_exactly_one_update_of_similar_lengths():
    plan = plan_window(LENGTHS, 4, False, window_seed(0, 0))
    assert sorted(p for group in plan for p in group) == list(range(len(LENGTHS)))
    assert all(len(group) == 4 for group in plan)
    # Each update is a run of the sorted lengths: the shortest four, the middle four, the longest four.
    assert sorted(sorted(LENGTHS[p] for p in group) for group in plan) == [[1, 2, 3, 4], [4, 6, 8, 9], [12, 17, 25, 30]]
    # Equal lengths keep the dataset's order (stable sort): position 3 (4 tokens) goes with the
    # shortest, position 4 (also 4 tokens) opens the next update.
    assert [1, 6, 9, 3] in plan and [4, 11, 8, 0] in plan


def test_a_window_pads_less_than_consecutive_updates():
    rng = np.random.default_rng(1)
    lengths = [int(n) for n in rng.integers(1, 200, size=256)]

    def padded(groups):
        return sum(max(lengths[p] for p in g) * len(g) - sum(lengths[p] for p in g) for g in groups)

    consecutive = [list(range(start, start + 16)) for start in range(0, 256, 16)]
    windowed = plan_window(lengths, 16, False, window_seed(0, 0))
    assert padded(windowed) < 0.2 * padded(consecutive)


def test_the_update_order_is_shuffled_and_fixed_by_epoch_and_window():
    plan = plan_window(LENGTHS, 2, False, window_seed(0, 0))
    assert plan == plan_window(LENGTHS, 2, False, window_seed(0, 0))
    firsts = [min(LENGTHS[p] for p in group) for group in plan]
    assert firsts != sorted(firsts)  # not shortest-first
    others = [plan_window(LENGTHS, 2, False, window_seed(epoch, window)) for epoch, window in [(1, 0), (0, 1)]]
    assert all(other != plan for other in others)


def test_in_tokens_an_update_takes_the_fewest_sorted_examples_reaching_the_budget():
    plan = plan_window(LENGTHS, 20, True, window_seed(0, 0))
    by_start = sorted(plan, key=lambda group: min(LENGTHS[p] for p in group))
    sums = [sum(LENGTHS[p] for p in group) for group in by_start]
    # Sorted: 1 2 3 4 4 6 | 8 9 12 | 17 25 | 30 (20 = 1+2+3+4+4+6; 29 = 8+9+12; 42; then the rest)
    assert sums == [20, 29, 42, 30]
    assert [len(group) for group in by_start] == [6, 3, 2, 1]


def test_updates_done_finds_the_prefix_a_checkpoint_consumed():
    plan = [[0, 1, 2], [3], [4, 5]]
    assert [updates_done(plan, consumed) for consumed in (0, 3, 4, 6)] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        updates_done(plan, 2)


class ListBuffer:
    """ExampleBuffer's take() over a list of token rows, with a label per row."""

    def __init__(self, rows, skip):
        self.rows, self.position = rows[skip:], 0

    def take(self, count):
        chunk = self.rows[self.position : self.position + count]
        if not chunk:
            return None
        self.position += len(chunk)
        tokens = np.empty(len(chunk), dtype=object)
        tokens[:] = [np.zeros(n) for n in chunk]
        return [tokens, np.arange(len(chunk))], len(chunk)

    def pop_read_seconds(self):
        return 0.0


def lengths_taken(examples):
    out = []
    while (taken := examples.take(4)) is not None:
        out.append(sorted(len(row) for row in taken[0][0]))
    return out


def test_a_resumed_epoch_runs_the_rest_of_its_window_and_no_update_twice():
    rows = LENGTHS * 2  # 24 examples, windows of 12: three updates of 4 each
    whole = lengths_taken(WindowedExamples(ListBuffer(rows, 0), 12, 4, False, epoch=0, consumed_in_epoch=0))
    assert len(whole) == 6
    for done in range(7):
        consumed = 4 * done
        start = WindowedExamples.window_start(consumed, 12)
        rest = lengths_taken(WindowedExamples(ListBuffer(rows, start), 12, 4, False, epoch=0, consumed_in_epoch=consumed))
        assert rest == whole[done:]


def test_a_checkpoint_made_with_other_settings_is_a_one_line_usage_error():
    examples = WindowedExamples(ListBuffer(LENGTHS, 0), 12, 4, False, epoch=0, consumed_in_epoch=2)
    with pytest.raises(UsageError) as error:
        examples.take(4)
    assert "length_window_examples" in str(error.value) and "\n" not in str(error.value)
