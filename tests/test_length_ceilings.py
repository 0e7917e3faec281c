"""LengthCeilings (training/length_ceilings.py): pure rules for micro-batch ceilings by sequence length."""

import pytest

from edgebatch.errors import UsageError
from edgebatch.profiles.model import LengthCeiling
from edgebatch.training import LengthCeilings

CEILINGS = LengthCeilings.from_mapping({256: 40, 64: 120, 128: 80})


def test_a_length_takes_the_ceiling_of_its_bucket_the_next_probed_length_up():
    assert CEILINGS.table == ((64, 120), (128, 80), (256, 40))
    assert [CEILINGS.ceiling_at(n) for n in (1, 64, 65, 128, 200, 256)] == [120, 120, 80, 80, 40, 40]
    assert CEILINGS.reference_ceiling == 120  # the shortest length's: the finest governor steps


def test_beyond_the_longest_probed_length_the_ceiling_falls_with_the_square_of_the_length():
    assert CEILINGS.ceiling_at(512) == 10  # 40 x (256/512)^2
    assert CEILINGS.ceiling_at(300) == 29  # floor(40 x 0.728)
    assert CEILINGS.ceiling_at(100_000) == 1  # never below one example


@pytest.mark.parametrize("a, b", [(1.0, 0.0), (0.0, 1.0), (3.0, 0.01), (0.5, 2.0)])
def test_the_square_rule_never_exceeds_the_ceiling_of_a_linear_plus_quadratic_memory(a, b):
    # Per-example memory a x L + b x L^2 under a fixed budget: the true ceiling at L is the room
    # over that; the rule scales the longest probed ceiling by (Lmax / L)^2.
    room, longest = 1e6, 256

    def true_ceiling(length):
        return int(room // (a * length + b * length**2))

    ceilings = LengthCeilings.from_mapping({longest: true_ceiling(longest)})
    for length in (257, 300, 512, 1000, 4096):
        assert ceilings.ceiling_at(length) <= max(1, true_ceiling(length))


def test_the_governor_share_applies_at_every_length_and_never_passes_the_ceiling():
    assert CEILINGS.piece_limit(120, 64, 120) == 120 and CEILINGS.piece_limit(120, 256, 120) == 40  # each its own
    assert CEILINGS.piece_limit(60, 64, 120) == 60 and CEILINGS.piece_limit(60, 256, 120) == 20  # half
    assert CEILINGS.piece_limit(1, 512, 120) == 1  # at least one example
    assert CEILINGS.piece_limit(400, 256, 120) == 40  # never above the length's ceiling
    # A governor held at 32 by its effective batch, not by memory, allows the whole ceiling.
    assert CEILINGS.piece_limit(32, 256, 32) == 40 and CEILINGS.piece_limit(16, 256, 32) == 20


def test_split_packs_short_examples_into_larger_pieces_and_sums_to_the_update():
    lengths = [10] * 150 + [100] * 50 + [250] * 30
    sizes = CEILINGS.split(lengths, 120, 120)
    assert sizes == [120, 30 + 50, 30]
    assert CEILINGS.split(lengths, 32, 32) == sizes  # the governor at its largest: the same
    # Half the governor's micro-batch: every piece at most half its bucket's ceiling.
    sizes = CEILINGS.split(lengths, 60, 120)
    assert sizes == [60, 60, 30 + 10, 40, 20, 10]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for start, size in zip(starts, sizes):
        assert size <= CEILINGS.piece_limit(60, max(lengths[start : start + size]), 120)


def test_split_takes_the_longest_example_of_a_piece_even_out_of_order():
    assert LengthCeilings.from_mapping({10: 4, 20: 2}).split([20, 1, 1, 1], 4, 4) == [2, 2]
    assert CEILINGS.split([], 120, 120) == []


def test_a_cap_in_examples_bounds_every_piece_besides_the_length_limit():
    table = LengthCeilings.from_mapping({10: 4, 20: 2})
    assert table.split([1] * 8, 4, 4) == [4, 4]
    assert table.split([1] * 8, 4, 4, max_examples=3) == [3, 3, 2]
    assert table.split([20] * 4, 4, 4, max_examples=3) == [2, 2]  # the length's limit is the smaller
    assert table.split([1, 1], 4, 4, max_examples=0) == [1, 1]  # at least one example a piece


def test_an_oom_counts_in_the_governors_units_at_most_the_running_micro_batch():
    assert CEILINGS.governor_size(120, 64, 120, 120) == 120
    assert CEILINGS.governor_size(30, 256, 120, 120) == 90  # 30 at 256 tokens: as much as 90 at 64
    assert CEILINGS.governor_size(1, 512, 3, 120) == 3  # one example past the table: the whole share
    assert CEILINGS.governor_size(2, 64, 40, 120) == 2
    assert CEILINGS.governor_size(20, 256, 32, 32) == 16  # half of 256's ceiling: half the governor's largest


def test_from_a_profile_per_length_uses_safe_batch_or_max_batch():
    class Profile:
        per_length = {64: LengthCeiling(max_batch=130, safe_batch=117, peak_bytes=1),
                      256: LengthCeiling(max_batch=44, safe_batch=39, peak_bytes=1)}

    assert LengthCeilings.from_profile(Profile()).table == ((64, 117), (256, 39))
    assert LengthCeilings.from_profile(Profile(), use_max_batch=True).table == ((64, 130), (256, 44))


@pytest.mark.parametrize("make, words", [
    (lambda: LengthCeilings(()), "at least one"),
    (lambda: LengthCeilings(((64, 10), (64, 5))), "ascending"),
    (lambda: LengthCeilings(((128, 10), (64, 5))), "ascending"),
    (lambda: LengthCeilings.from_mapping({64: 0}), "ceiling must be an integer >= 1"),
    (lambda: LengthCeilings(((64.5, 10),)), "length must be an integer >= 1"),
    (lambda: LengthCeilings.from_profile(object()), "--seq-lens"),
])
def test_bad_tables_are_one_line_usage_errors(make, words):
    with pytest.raises(UsageError) as error:
        make()
    assert words in str(error.value) and "\n" not in str(error.value)
