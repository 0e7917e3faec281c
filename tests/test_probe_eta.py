"""The probe's estimate of what is left (probing/eta.py): pure, from tables of outcomes."""

import pytest

from edgebatch.probing import eta
from edgebatch.probing.outcomes import Outcome, SearchConfig

MIB = 1024**2
CONFIG = SearchConfig(budget_bytes=1000 * MIB, start_batch=8)


def read(batch, peak_mib, fresh=True):
    return Outcome(batch, ran=True, peak_bytes=int(peak_mib * MIB), fresh=fresh)


def test_nothing_fits_yet_is_no_estimate():
    assert eta.trials_left(CONFIG, [Outcome(8, ran=False, fresh=True)], checks_answer=True) is None


def test_a_bracket_costs_its_bisections_to_the_tolerance_and_the_answers_readings():
    outcomes = [read(100, 600), read(200, 1100)]
    # (200 - 100) / (2% of 100) = 50 -> 6 bisections; then the answer's 2 more fresh readings.
    assert eta.trials_left(CONFIG, outcomes, checks_answer=True) == 6 + 2
    assert eta.trials_left(CONFIG, outcomes, checks_answer=False) == 6


def test_a_closed_bracket_costs_only_the_readings_still_missing():
    outcomes = [read(100, 900), read(101, 1100), read(100, 901)]
    assert eta.trials_left(CONFIG, outcomes, checks_answer=True) == 1


def test_before_a_failure_a_memory_line_gives_a_jump_and_bisections_around_it():
    climbing = [read(8, 108), read(16, 116, fresh=False), read(32, 132, fresh=False)]
    assert eta.trials_left(CONFIG, climbing, checks_answer=True) == 1 + eta.BISECTIONS_AROUND_THE_LINE + 2


def test_at_the_batch_limit_only_the_answers_readings_are_left():
    config = SearchConfig(budget_bytes=1000 * MIB, start_batch=8, max_batch_limit=64)
    assert eta.trials_left(config, [read(8, 108), read(64, 170)], checks_answer=True) == 2


def test_seconds_left_come_from_the_fresh_trials_where_any_ran():
    times = [eta.TrialTime(2.0, fresh=False), eta.TrialTime(20.0, fresh=True), eta.TrialTime(30.0, fresh=True)]
    assert eta.estimate(4, times) == eta.Estimate(trials_left=4, seconds_left=100.0)
    assert eta.estimate(3, times[:1]).seconds_left == pytest.approx(6.0)
    assert eta.estimate(None, times) is None and eta.estimate(3, []) is None and eta.estimate(0, times) is None


@pytest.mark.parametrize(("left", "seconds", "text"), [
    (1, 12.4, "about 1 trial, ~12 s left"), (5, 300, "about 5 trials, ~5 min left"), (2, 0.2, "about 2 trials, ~1 s left"),
])
def test_the_estimate_reads_in_seconds_or_minutes(left, seconds, text):
    assert eta.Estimate(left, seconds).describe() == text
