"""max/safe/knee from trial tables: pure, no TensorFlow."""

import dataclasses

import pytest

from edgebatch.probing import summary
from edgebatch.probing.search import Done, Outcome, Run, SearchConfig, Skip, next_step
from edgebatch.profiles import MemoryModel, Trial

MIB = 1024**2


def trial(batch, peak_mib, rate=None, ok=True, error=None, measured=True, fresh=False):
    return Trial(
        batch=batch, ok=ok, error=error, peak_bytes=None if peak_mib is None else int(peak_mib * MIB),
        process_peak_bytes=None, allocator_peak_bytes=None, step_seconds=None if rate is None else batch / rate,
        samples_per_second=rate, measured=measured, fresh=fresh,
    )


TRIALS = [
    trial(8, 800, 60),
    trial(16, 880, 90),
    trial(32, 1040, 100),
    trial(64, 1360, 97),
    trial(128, 2000, 80),
    trial(256, 3280, None, ok=False, error="over_budget"),
    trial(512, None, ok=False, error="oom"),
]
BUDGET = 2100 * MIB


def test_max_batch_is_the_largest_measured_fit():
    assert summary.max_batch_of(TRIALS, BUDGET) == 128


def test_knee_is_the_smallest_batch_within_5_percent_of_the_best_rate():
    assert summary.throughput_knee_of(TRIALS, BUDGET) == 32  # 97 >= 95 but 64 > 32
    assert summary.throughput_knee_of([trial(8, 800, 100), trial(16, 900, 96)], BUDGET) == 8


def test_knee_leaves_out_trials_that_timed_their_warm_up_step():
    # A trial whose one timed step was its warm-up step (steady=False) says nothing about the
    # plateau, whichever way it errs: here it would be the best rate and move the knee to 1248.
    steady = [trial(32, 800, 100), trial(256, 1000, 126), trial(1024, 1500, 125)]
    warm_up = dataclasses.replace(trial(1248, 1700, 140), steady=False)
    assert summary.throughput_knee_of([*steady, dataclasses.replace(warm_up, steady=True)], BUDGET * 10) == 1248
    assert summary.throughput_knee_of([*steady, warm_up], BUDGET * 10) == 256
    # Every fit timed its warm-up: no steady figure, no knee.
    assert summary.throughput_knee_of([warm_up], BUDGET * 10) is None


def test_memory_model_uses_every_trial_that_ran_including_over_budget():
    model = summary.memory_model_of(TRIALS)
    assert model.points == 6  # 8..128 and 256, which read over budget; 512 raised an OOM: no reading
    assert model.per_sample_bytes == pytest.approx(10 * MIB, rel=1e-6)
    assert model.fixed_bytes == pytest.approx(720 * MIB, rel=1e-6)


def test_safe_batch_steps_down_from_the_largest_fit_by_per_sample_bytes():
    model = MemoryModel(720 * MIB, 10 * MIB, 1.0, 5)
    # safe budget 0.9 x 2100 = 1890 MiB; from 128 at 2000 MiB step down 11 samples -> 117.
    assert summary.safe_batch_of(TRIALS, BUDGET, 0.10, 1, model) == 117
    assert summary.safe_batch_of(TRIALS, BUDGET, 0.10, 8, model) == 112
    # Without a model only measured trials count.
    assert summary.safe_batch_of(TRIALS, BUDGET, 0.10, 1, None) == 64


def test_safe_batch_never_exceeds_max_batch_and_none_without_fits():
    model = MemoryModel(720 * MIB, 10 * MIB, 1.0, 5)
    assert summary.safe_batch_of(TRIALS, BUDGET, 0.0, 1, model) == 128
    assert summary.safe_batch_of([trial(8, None, ok=False, error="oom")], BUDGET, 0.1, 1, model) is None


def test_safe_batch_respects_the_worst_reading_when_readings_are_not_monotone():
    # The default mobilenet_v2 probe on this machine kind: the scout read 21.84 GiB at 1643, a
    # fresh worker 20.48 GiB at 1694. 1694 is under the safe budget only by its own low reading.
    gib = 1024**3
    trials = [trial(8, 1.03 * 1024, 55), trial(1643, 21.84 * 1024, 16), trial(1694, 20.48 * 1024, 20)]
    model = MemoryModel(971 * MIB, 12.39 * MIB, 0.996, 5)
    budget = 23.15 * gib
    safe = summary.safe_batch_of(trials, budget, 0.10, 1, model)
    assert 1540 <= safe <= 1570  # 1643 - (21.84 - 20.835) GiB / 12.39 MiB = 1560


# An address-space cap binds far below the budget: dense_wide under a 600 MiB cap in CI, where 256
# ran in the probe's worker and failed in the next fresh process.
CAPPED = [
    trial(32, 776, 650),
    trial(156, 1045, 1106),
    trial(249, 1229, 1087),
    trial(256, 1239, 1068),
    trial(260, None, ok=False, error="oom"),
    trial(264, None, ok=False, error="oom"),
]
CAP_BUDGET = 16 * 1024 * MIB


def test_a_failure_the_budget_does_not_explain_keeps_the_safe_batch_clear_of_the_edge():
    model = summary.memory_model_of(CAPPED)
    assert model.predict_bytes(260) < CAP_BUDGET
    assert summary.hidden_limit_edge_of(CAPPED, CAP_BUDGET, model) == 256
    # The budget alone would allow 256 (the largest fit); 10% below the edge in samples is 230.
    assert summary.safe_batch_of(CAPPED, CAP_BUDGET, 0.10, 1, model) == 230
    assert summary.safe_batch_of(CAPPED, CAP_BUDGET, 0.10, 8, model) == 224
    assert summary.safe_batch_of(CAPPED, CAP_BUDGET, 0.10, 1, None) == 230
    # The edge's own margin (margins.HIDDEN_LIMIT_MARGIN) holds with no headroom, and a larger
    # headroom takes its place.
    assert summary.safe_batch_of(CAPPED, CAP_BUDGET, 0.0, 1, model) == 230
    assert summary.safe_batch_of(CAPPED, CAP_BUDGET, 0.20, 1, model) == 204


def test_failures_the_budget_explains_leave_the_safe_batch_to_the_budget():
    model = MemoryModel(720 * MIB, 10 * MIB, 1.0, 5)
    # TRIALS' OOM at 512 is predicted at 5840 MiB, far over the 2100 MiB budget: no hidden limit.
    assert summary.hidden_limit_edge_of(TRIALS, BUDGET, model) is None
    over_budget_only = [t for t in CAPPED if t.ok] + [trial(300, None, ok=False, error="over_budget")]
    assert summary.hidden_limit_edge_of(over_budget_only, CAP_BUDGET, model) is None
    # A failure below every fit has no edge under it.
    assert summary.hidden_limit_edge_of([trial(8, None, ok=False, error="oom"), trial(16, 900)], BUDGET, model) is None


# --- One edge: the profile reads the trials by the search's rule (outcomes.edge_of) ---

# The transient: a worker killed once at 16 (the scout's second trial), 16 and up to 334
# fitted later in fresh workers. The old summary took 16 for a hidden limit: max 334, safe 13.
LINE_MIB = (740, 2.5)
TRANSIENT = [
    trial(8, 760, fresh=True),
    trial(16, None, ok=False, error="worker_killed"),
    trial(12, 770, fresh=True),
    trial(14, 775),
    trial(15, 777.5),
    trial(16, 780, fresh=True),
    trial(32, 820),
    trial(300, 1490, fresh=True),
    trial(334, 1575, fresh=True),
]
LINE_BUDGET = 1600 * MIB


def test_a_failure_a_fresh_fit_contradicts_is_recorded_but_does_not_count():
    model = summary.memory_model_of(TRANSIENT)
    assert summary.max_batch_of(TRANSIENT, LINE_BUDGET) == 334
    assert summary.hidden_limit_edge_of(TRANSIENT, LINE_BUDGET, model) is None
    # 0.9 x 1600 MiB = 1440 MiB on the line 740 + 2.5 x batch: 280.
    assert summary.safe_batch_of(TRANSIENT, LINE_BUDGET, 0.10, 1, model, max_batch=334) == 280
    # Without the fresh fits at and above 16, the same death counts: it is the edge.
    uncontradicted = [t for t in TRANSIENT if t.batch < 16 or t.error]
    assert summary.max_batch_of(uncontradicted, LINE_BUDGET) == 15
    assert summary.safe_batch_of(uncontradicted, LINE_BUDGET, 0.10, 1, None) == 13


def test_the_safe_batch_never_lands_above_a_failure_that_counts():
    # A peer's finder can answer past a failure (binsearch: 334 with an OOM at 200 no fresh fit
    # contradicts); 0.9 x its answer (300) would land above the OOM. The safe batch stays under it.
    trials = [trial(8, 760, fresh=True), trial(16, 780), trial(32, 820), trial(150, 1115), trial(200, None, ok=False,
              error="oom", fresh=True), trial(334, 1575)]
    model = summary.memory_model_of(trials)
    safe = summary.safe_batch_of(trials, LINE_BUDGET, 0.10, 1, model, max_batch=334)
    assert safe <= 150 * 0.9  # the edge (150), less the headroom: the OOM is a limit the budget does not see
    # When nothing but the smallest allowed batch is under the reduced budget, that is the answer:
    # no fallback of 0.9 x max_batch.
    heavy = [trial(8, 1400, fresh=True), trial(16, 1420), trial(32, 1460), trial(64, 1540)]
    assert summary.safe_batch_of(heavy, LINE_BUDGET, 0.5, 8, summary.memory_model_of(heavy), max_batch=64) == 8


def test_a_bump_a_fresh_fit_contradicted_still_holds_the_safe_batch_down():
    # 300 read 60 MiB above the line in a fresh worker, 320 then fitted fresh: 300 no longer bounds
    # max_batch, but its reading is an anchor for the safe batch (0.9 x 1600 MiB = 1440 MiB):
    # 300 - (1550 - 1440) / 2.5 = 256, where the line alone says 280.
    trials = [trial(8, 760, fresh=True), trial(16, 780), trial(32, 820),
              trial(300, 1550, ok=False, error="over_budget", fresh=True), trial(320, 1540, fresh=True)]
    budget = 1545 * MIB
    model = summary.memory_model_of(trials)
    assert summary.max_batch_of(trials, budget) == 320
    assert summary.safe_batch_of(trials, budget, 1 - 1440 / 1545, 1, model, max_batch=320) == 256


def test_the_profile_edge_is_the_search_answer_on_the_same_outcomes():
    # Drive the search on a device with a bump, record the trials as api._search does, and read
    # them back: max_batch_of gives the search's own answer.
    def peak(batch):
        return (740 + 2.5 * batch + (80 if 295 <= batch <= 306 else 0)) * MIB

    config = SearchConfig(budget_bytes=1536 * MIB)
    outcomes, trials = [], []
    for _ in range(50):
        step = next_step(config, outcomes)
        if isinstance(step, Done):
            break
        if isinstance(step, Skip):
            outcomes.append(Outcome(step.batch, ran=False, peak_bytes=step.predicted_peak_bytes, measured=False))
            trials.append(trial(step.batch, step.predicted_peak_bytes / MIB, ok=False,
                                error="predicted_over_budget", measured=False))
            continue
        assert isinstance(step, Run)
        fresh = step.fresh or not outcomes
        reading = int(peak(step.batch))
        outcomes.append(Outcome(step.batch, ran=True, peak_bytes=reading, fresh=fresh))
        fits = reading <= config.budget_bytes
        trials.append(trial(step.batch, reading / MIB, ok=fits, error=None if fits else "over_budget", fresh=fresh))
    assert step.max_batch is not None and step.max_batch > 306
    assert summary.max_batch_of(trials, config.budget_bytes) == step.max_batch
    model = summary.memory_model_of(trials)
    # The line alone puts the safe batch at 256 (0.9 x 1536 MiB); the bump's readings hold it lower.
    assert summary.safe_batch_of(trials, config.budget_bytes, 0.10, 1, model, step.max_batch) < 256


def test_the_profile_judges_readings_by_the_budget_the_repeats_lowered():
    """Three fresh readings of 30 spread 8% (mobilenet_v2 on AMD EPYC read 30 at 1,364-1,512 MiB), the
    highest over a 1,520 MiB budget: 29, read once at 1,467 MiB, fits that budget but not the budget
    lowered by the spread (1,407 MiB), and neither does 30's lowest reading."""
    trials = [trial(8, 1170), trial(16, 1300), trial(27, 1380, fresh=True), trial(29, 1467, fresh=True),
              trial(30, 1420, fresh=True), trial(30, 1533.6, fresh=True), trial(30, 1450, fresh=True)]
    budget = 1520 * MIB
    assert summary.judged_budget_bytes(trials, budget) == pytest.approx(budget / (1533.6 / 1420), abs=2)
    assert summary.max_batch_of(trials, budget) == 27
    assert summary.safe_batch_of(trials, budget, 0.0, 1, None) == 27
    agreeing = [t for t in trials if t.batch != 30 or t.peak_bytes == 1420 * MIB]
    assert summary.max_batch_of(agreeing, budget) == 30


def test_a_level_behind_a_spread_is_counted_once_in_the_safe_batch():
    # New processes on a line of 800 MiB + 1 MiB per sample; one of two read 300 a level higher
    # (1,210 against 1,100 MiB: a 10% spread, so readings are judged against 1,340 / 1.1 MiB).
    def new_process(batch, peak_mib):
        return dataclasses.replace(trial(batch, peak_mib, fresh=True), forked=False)

    trials = [new_process(8, 808), new_process(200, 1000), new_process(300, 1100), new_process(300, 1210)]
    model = MemoryModel(fixed_bytes=800 * MIB, per_sample_bytes=1 * MIB, r2=1.0, points=4)
    budget = 1340 * MIB
    assert summary.judged_budget_bytes(trials, budget) == int(budget / 1.1)
    # The high reading, carried down the line, needs 4 samples fewer to fit 90% of the budget
    # (1,206 MiB); the low ones, carried up, meet 90% of the lowered budget (1,096.4 MiB) at 296
    # too. Judging the high reading against the lowered budget as well would count its level twice
    # and answer 186.
    assert summary.safe_batch_of(trials, budget, 0.10, 1, model, max_batch=300) == 296
    # Without the high reading there is no spread, and the line meets 1,206 MiB at 406: the edge, 300.
    assert summary.safe_batch_of(trials[:3], budget, 0.10, 1, model, max_batch=300) == 300
