"""PieceCost (training/piece_cost.py): a piece's predicted seconds, and the cut of least total."""

import itertools
import random

import pytest

from edgebatch.profiles.model import LengthCeiling, Trial
from edgebatch.training import LengthCeilings
from edgebatch.training.piece_cost import PieceCost

COST = PieceCost(overhead_seconds=0.003, seconds_per_token=5e-6, seconds_per_token_squared=1.2e-7)


def trial(batch, length, seconds, ok=True, steady=True):
    return Trial(batch=batch, ok=ok, error=None if ok else "oom", peak_bytes=1, process_peak_bytes=1,
                 allocator_peak_bytes=None, step_seconds=seconds, samples_per_second=batch / seconds,
                 steady=steady, seq_len=length)


def total_seconds(cost, lengths, sizes):
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return sum(cost.seconds(size, max(lengths[start : start + size])) for start, size in zip(starts, sizes))


def compositions(count):
    """Every way to cut `count` consecutive examples into pieces."""
    for cuts in itertools.product([False, True], repeat=count - 1):
        sizes, size = [], 1
        for cut in cuts:
            if cut:
                sizes.append(size)
                size = 1
            else:
                size += 1
        yield sizes + [size]


@pytest.mark.parametrize("seed", range(25))
def test_the_cut_has_the_least_predicted_time_of_every_cut_within_the_limits(seed):
    rng = random.Random(seed)
    lengths = sorted(rng.choice([3, 8, 20, 60, 200, 500]) for _ in range(rng.randint(1, 9)))
    cost = PieceCost(rng.choice([0.0, 1e-4, 3e-3, 0.1]), rng.choice([1e-6, 5e-6]), rng.choice([0.0, 1.2e-7]))

    def limit_at(length):
        return {3: 6, 8: 5, 20: 4, 60: 3, 200: 2, 500: 1}[length]

    sizes = cost.cut(lengths, limit_at)
    assert sum(sizes) == len(lengths)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    assert all(size <= limit_at(max(lengths[s : s + size])) for s, size in zip(starts, sizes))
    allowed = [c for c in compositions(len(lengths))
               if all(n <= limit_at(max(lengths[sum(c[:i]) : sum(c[:i]) + n])) for i, n in enumerate(c))]
    best = min(total_seconds(cost, lengths, c) for c in allowed)
    assert total_seconds(cost, lengths, sizes) == pytest.approx(best, rel=1e-12, abs=1e-15)


def test_with_no_step_cost_no_piece_is_padded_and_with_a_large_one_pieces_are_as_few_as_greedy():
    lengths = [5] * 7 + [9] * 3 + [30] * 4 + [31]
    free = PieceCost(0.0, 1e-6).cut(lengths, lambda length: 100)
    assert free == [7, 3, 4, 1]  # each piece holds one length: nothing is padded
    costly = PieceCost(10.0, 1e-6).cut(lengths, lambda length: 100)
    assert costly == [15]
    table = LengthCeilings.from_mapping({10: 8, 40: 3})
    greedy = table.split(lengths, 8, 8)
    assert len(PieceCost(10.0, 1e-6).cut(lengths, lambda length: table.piece_limit(8, length, 8))) == len(greedy)


def test_a_cut_respects_the_governor_share_and_the_cap_through_length_ceilings():
    table = LengthCeilings(((64, 120), (256, 40)), piece_cost=COST)
    lengths = [10] * 150 + [100] * 50 + [250] * 30
    for micro, cap in ((120, None), (60, None), (120, 25)):
        sizes = table.split(lengths, micro, 120, max_examples=cap)
        assert sum(sizes) == len(lengths)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for start, size in zip(starts, sizes):
            assert size <= min(cap or 10**9, table.piece_limit(micro, max(lengths[start : start + size]), 120))


def test_padding_falls_against_the_greedy_cut_on_a_skewed_update():
    rng = random.Random(0)
    lengths = sorted(min(512, int(rng.lognormvariate(3.0, 1.1)) + 1) for _ in range(256))
    greedy = LengthCeilings.from_mapping({64: 601, 128: 208, 256: 59, 512: 15})
    costed = LengthCeilings(greedy.table, piece_cost=COST)

    def padded_share(sizes):
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        run = sum(size * max(lengths[s : s + size]) for s, size in zip(starts, sizes))
        return 1 - sum(lengths) / run

    greedy_sizes, costed_sizes = greedy.split(lengths, 601, 601), costed.split(lengths, 601, 601)
    assert padded_share(costed_sizes) < 0.5 * padded_share(greedy_sizes)
    assert total_seconds(COST, lengths, costed_sizes) < total_seconds(COST, lengths, greedy_sizes)


def test_from_trials_recovers_the_terms_from_timed_trials_at_several_lengths():
    truth = PieceCost(0.002, 4e-6, 1e-7)
    trials = [trial(b, length, truth.seconds(b, length)) for length, batches in
              ((64, (8, 16, 64, 300)), (256, (8, 40)), (512, (4, 15))) for b in batches]
    trials += [trial(900, 64, 99.0, ok=False), trial(8, 128, 99.0, steady=False)]  # neither counts
    fitted = PieceCost.from_trials(trials)
    for name in ("overhead_seconds", "seconds_per_token", "seconds_per_token_squared"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6)


def test_from_trials_is_none_where_the_terms_are_undetermined():
    assert PieceCost.from_trials([]) is None
    assert PieceCost.from_trials([trial(b, 64, 0.01 * b) for b in (1, 2, 4, 8, 16)]) is None  # one length
    assert PieceCost.from_trials([trial(8, 64, 0.1), trial(8, 128, 0.2), trial(8, 256, 0.4)]) is None  # three


def test_length_ceilings_from_a_profile_take_the_cost_of_its_timed_trials():
    truth = PieceCost(0.002, 4e-6, 1e-7)

    class Profile:
        per_length = {64: LengthCeiling(max_batch=130, safe_batch=117, peak_bytes=1),
                      256: LengthCeiling(max_batch=44, safe_batch=39, peak_bytes=1)}
        trials = [trial(b, length, truth.seconds(b, length)) for length, b in ((64, 8), (64, 117), (256, 8), (256, 39))]

    ceilings = LengthCeilings.from_profile(Profile())
    assert ceilings.table == ((64, 117), (256, 39))
    assert ceilings.piece_cost.overhead_seconds == pytest.approx(0.002, rel=1e-6)


def test_piece_times_refit_every_refit_pieces_from_what_fit_timed():
    from edgebatch.training.piece_cost import REFIT_PIECES, PieceTimes

    truth = PieceCost(0.001, 2e-5, 3e-8)
    times = PieceTimes()
    sizes, lengths = [4, 9, 30], [200, 40, 8]

    def add_update():
        times.add(sizes, lengths, [truth.seconds(n, length) for n, length in zip(sizes, lengths)])

    for _ in range((REFIT_PIECES - 1) // len(sizes)):
        add_update()
        assert times.refit() is None  # not yet REFIT_PIECES pieces
    add_update()
    fitted = times.refit()
    assert fitted.overhead_seconds == pytest.approx(0.001, rel=1e-6)
    assert fitted.seconds_per_token == pytest.approx(2e-5, rel=1e-6)
    add_update()
    assert times.refit() is None  # the next fit waits for REFIT_PIECES more
    times.add([5], [10], [0.0])  # a piece without a time is left out
    assert len(times.points) == len(sizes) * (REFIT_PIECES // len(sizes) + 2)
