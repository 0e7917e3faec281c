"""How many timed steps a trial runs (trial.keep_stepping): pure, from tables of step times and peaks."""

import pytest

from edgebatch.probing.trial import MAX_STEPS_PER_TRIAL, SETTLE_SECONDS_FACTOR, keep_stepping, resident_peak_settled

MIB = 1024**2
FLAT = [1400 * MIB] * 20
# A busy host, one inter-op thread: transformer_tiny at 24 x 512 tokens read this over 16 steps.
CLIMBING = [int(p * MIB) for p in (1426.1, 1458.9, 1465.0, 1477.0, 1477.0, 1486.0, 1486.0, 1492.0, 1492.0,
                                   1492.0, 1492.0, 1492.0, 1492.0, 1492.0, 1492.0, 1492.0)]


def steps_run(peaks, step_seconds, steps=3, trial_seconds=10.0, warmup_is_timing=False):
    """Replay a trial's loop: how many timed steps it runs, and the reading it ends on."""
    timings = [step_seconds] if warmup_is_timing else []
    seen = peaks[:1]
    while keep_stepping(timings, seen, steps, trial_seconds, track_resident=True):
        timings.append(step_seconds)
        seen = peaks[: len(seen) + 1]
    return len(timings), seen[-1]


def test_a_flat_peak_runs_the_asked_steps_and_no_more():
    assert steps_run(FLAT, 1.0) == (3, FLAT[0])


def test_a_peak_still_rising_runs_until_it_settles_within_the_trial_time():
    count, reading = steps_run(CLIMBING, 0.5)
    assert reading == max(CLIMBING) and resident_peak_settled(CLIMBING[: count + 1])


def test_past_the_trial_time_short_steps_go_on_until_the_peak_settles():
    # 2.7 s a step: four steps fill 10 s with the peak still rising (1,477 of a final 1,492 MiB);
    # the extension reads it settled at the final peak.
    count, reading = steps_run(CLIMBING, 2.7)
    assert count > 4 and reading == max(CLIMBING)
    assert count * 2.7 < SETTLE_SECONDS_FACTOR * 10.0 + 2.7


def test_long_steps_get_no_extension():
    # A warm-up step longer than the trial time is the timing: another 40 s step is not bought.
    assert steps_run(CLIMBING, 40.0, warmup_is_timing=True) == (1, CLIMBING[0])
    # Steps of 4 s: three would not fit in the trial time, so it ends at the time as before.
    assert steps_run(CLIMBING, 4.0)[0] == 3


def test_never_past_the_step_cap_nor_the_extended_time():
    ever_rising = [int((1400 + 10 * i) * MIB) for i in range(40)]
    assert steps_run(ever_rising, 0.1)[0] == MAX_STEPS_PER_TRIAL
    count, _ = steps_run(ever_rising, 3.0)
    assert count == 10  # 30 s: SETTLE_SECONDS_FACTOR x the trial time


@pytest.mark.parametrize("track", [True, False])
def test_at_least_one_timed_step(track):
    assert keep_stepping([], [], 3, 10.0, track_resident=track)
