"""The peers' finders (baselines.py) driven by scripted outcomes: no TensorFlow, milliseconds per test."""

import pytest

from edgebatch.errors import UsageError
from edgebatch.probing.baselines import estimate_candidates, shrink_sequence
from edgebatch.probing.search import STRATEGIES, Done, Outcome, Run, SearchConfig, Skip, next_step

MIB = 1024**2


def drive(config, fits_at, peak_of=lambda batch: 0, limit=100):
    """Run the strategy to Done against a device where batch b fits iff fits_at(b).

    A batch that fits reports peak_of(b) (kept under the budget); one that does not is a real OOM.
    Returns (answer, batches run in order).
    """
    outcomes, ran = [], []
    for _ in range(limit):
        step = next_step(config, outcomes)
        if isinstance(step, Done):
            return step.max_batch, ran
        assert not isinstance(step, Skip), "baselines never skip on a model's prediction"
        ran.append(step.batch)
        if fits_at(step.batch):
            outcomes.append(Outcome(step.batch, ran=True, peak_bytes=int(peak_of(step.batch))))
        else:
            outcomes.append(Outcome(step.batch, ran=False))
    raise AssertionError(f"strategy did not finish in {limit} steps: {ran}")


def shrink_config(factor_name, **kwargs):
    return SearchConfig(budget_bytes=10**12, start_batch=128, strategy=factor_name, **kwargs)


def test_baselines_are_known_strategies():
    for name in ("shrink_x0.9", "shrink_x0.5", "one_shot_estimate"):
        assert name in STRATEGIES
        SearchConfig(budget_bytes=1, strategy=name)  # accepted


def test_shrink_sequence_is_accelerates_int_times_factor():
    assert shrink_sequence(128, 0.5) == [128, 64, 32, 16, 8, 4, 2, 1]
    assert shrink_sequence(128, 0.9)[:6] == [128, 115, 103, 92, 82, 73]
    assert shrink_sequence(10, 0.9)[-3:] == [3, 2, 1]
    assert shrink_sequence(64, 0.5, multiple=8) == [64, 32, 16, 8]
    with pytest.raises(UsageError, match="1.5"):
        shrink_sequence(128, 1.5)


def test_shrink_stops_at_the_first_fit_and_never_grows():
    answer, ran = drive(shrink_config("shrink_x0.9"), fits_at=lambda b: b <= 1000)
    assert (answer, ran) == (128, [128])


@pytest.mark.parametrize("name, ceiling, expected_runs", [
    ("shrink_x0.9", 100, [128, 115, 103, 92]),
    ("shrink_x0.5", 100, [128, 64]),
    ("shrink_x0.5", 63, [128, 64, 32]),
])
def test_shrink_walks_down_by_its_factor(name, ceiling, expected_runs):
    answer, ran = drive(shrink_config(name), fits_at=lambda b: b <= ceiling)
    assert ran == expected_runs
    assert answer == expected_runs[-1] <= ceiling


def test_shrink_counts_over_budget_as_failure_and_reaching_zero_as_nothing_fits():
    config = SearchConfig(budget_bytes=1000, start_batch=128, strategy="shrink_x0.5")
    outcomes = [Outcome(128, ran=True, peak_bytes=2000)]  # ran, but measured over the budget
    assert next_step(config, outcomes) == Run(64)
    answer, ran = drive(shrink_config("shrink_x0.5"), fits_at=lambda b: False)
    assert answer is None
    assert ran == [128, 64, 32, 16, 8, 4, 2, 1]


def test_shrink_honours_the_multiple_and_the_outcome_order():
    config = shrink_config("shrink_x0.9", multiple=8)
    answer, ran = drive(config, fits_at=lambda b: b <= 90)
    assert ran == [128, 112, 96, 80]  # int(128 x 0.9) = 115 -> 112, int(112 x 0.9) = 100 -> 96, ...
    assert answer == 80
    shuffled = [Outcome(112, ran=False), Outcome(128, ran=False)]
    assert next_step(config, shuffled) == Run(96)


def linear_device(baseline_bytes, per_sample_bytes):
    return lambda batch: baseline_bytes + per_sample_bytes * batch


def estimate_config(budget_mib, baseline_mib, **kwargs):
    return SearchConfig(
        budget_bytes=budget_mib * MIB, baseline_bytes=baseline_mib * MIB, strategy="one_shot_estimate",
        max_batch_limit=100_000, **kwargs,
    )


def test_estimate_calibrates_at_batch_one_then_checks_around_the_estimate():
    config = estimate_config(1000, 600)
    peak = linear_device(600 * MIB, 2 * MIB)  # ceiling (1000 - 600) / 2 = 200
    assert next_step(config, []) == Run(1)
    calibration = Outcome(1, ran=True, peak_bytes=peak(1))
    assert estimate_candidates(config, calibration) == [190, 200, 210]
    answer, ran = drive(config, fits_at=lambda b: peak(b) <= config.budget_bytes, peak_of=peak)
    assert ran == [1, 190, 200, 210]
    assert answer == 200


def test_estimate_keeps_the_largest_candidate_that_fits():
    config = estimate_config(1000, 600)
    peak = linear_device(600 * MIB, 2 * MIB)
    answer, ran = drive(config, fits_at=lambda b: b <= 195, peak_of=peak)  # the truth is lower than the line
    assert ran == [1, 190, 200]  # stops at the first failure
    assert answer == 190


def test_estimate_that_misses_low_answers_the_calibration_batch_not_a_failure():
    config = estimate_config(1000, 600)
    peak = linear_device(600 * MIB, 2 * MIB)
    answer, ran = drive(config, fits_at=lambda b: b <= 50, peak_of=peak)
    assert ran == [1, 190]
    assert answer == 1


def test_estimate_with_a_calibration_that_adds_nothing_goes_to_max_batch_limit():
    config = estimate_config(1000, 600)
    flat = Outcome(1, ran=True, peak_bytes=590 * MIB)  # below the baseline: RSS noise
    assert estimate_candidates(config, flat) == [config.max_batch_limit]


def test_estimate_when_nothing_fits():
    config = estimate_config(1000, 600)
    assert drive(config, fits_at=lambda b: False) == (None, [1])
    full = estimate_config(500, 600)  # the baseline alone is over the budget
    assert estimate_candidates(full, Outcome(1, ran=True, peak_bytes=601 * MIB)) == []


def test_estimate_rounds_to_the_multiple():
    config = estimate_config(1000, 600, multiple=8)
    peak = linear_device(600 * MIB, 2 * MIB)
    assert next_step(config, []) == Run(8)
    answer, ran = drive(config, fits_at=lambda b: peak(b) <= config.budget_bytes, peak_of=peak)
    assert all(b % 8 == 0 for b in ran)
    assert answer == 200


def test_estimate_needs_the_baseline_and_names_it():
    config = SearchConfig(budget_bytes=1000 * MIB, strategy="one_shot_estimate")
    with pytest.raises(UsageError, match="baseline_bytes"):
        next_step(config, [Outcome(1, ran=True, peak_bytes=700 * MIB)])
