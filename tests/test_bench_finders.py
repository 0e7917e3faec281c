"""The benchmark's peer finders (tools/bench/finders.py) driven by scripted outcomes: no TensorFlow,
milliseconds per test. Each is a pure Finder run on edgebatch's records (outcomes.py)."""

import dataclasses
import sys
from pathlib import Path

import pytest
from search_simulation import linear, runs, simulate

from edgebatch.errors import UsageError
from edgebatch.probing.outcomes import edge_of, effective_budget_bytes
from edgebatch.probing.search import ANSWER_READINGS, SLOW_START, Done, Outcome, Run, SearchConfig, Skip

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "bench"))

import finders  # noqa: E402
import probe_bench  # noqa: E402
from finders import FINDERS, estimate_candidates, shrink_sequence  # noqa: E402

MIB = 1024**2


def next_step(config, outcomes, finder="binsearch"):
    """The named finder's next step (finders.FINDERS)."""
    return FINDERS[finder].next_step(config, outcomes)


def drive(config, finder, fits_at, peak_of=lambda batch: 0, limit=100):
    """Run the finder named `finder` to Done against a device where batch b fits iff fits_at(b).

    A batch that fits reports peak_of(b) (kept under the budget); one that does not is a real OOM.
    Returns (answer, batches run in order).
    """
    outcomes, ran = [], []
    for _ in range(limit):
        step = next_step(config, outcomes, finder)
        if isinstance(step, Done):
            return step.max_batch, ran
        assert not isinstance(step, Skip), "baselines never skip on a model's prediction"
        ran.append(step.batch)
        if fits_at(step.batch):
            outcomes.append(Outcome(step.batch, ran=True, peak_bytes=int(peak_of(step.batch))))
        else:
            outcomes.append(Outcome(step.batch, ran=False))
    raise AssertionError(f"finder did not finish in {limit} steps: {ran}")


def shrink_config(**kwargs):
    return SearchConfig(budget_bytes=10**12, start_batch=128, **kwargs)


def test_the_benchmark_runs_every_finder_by_its_name_and_edgebatchs_own_search_among_them():
    for name in ("binsearch", "binsearch_checked", "power", "shrink_x0.9", "shrink_x0.5", "one_shot_estimate"):
        assert FINDERS[name].name == name
    assert FINDERS["slow_start"] is SLOW_START
    assert {name for name, _ in probe_bench.METHODS} == set(FINDERS)
    # Only the finders that read their answer in fresh workers ask run_search for its lines about it.
    assert {name for name, finder in FINDERS.items() if finder.checks_answer} == {"slow_start", "binsearch_checked"}


def test_shrink_sequence_is_accelerates_int_times_factor():
    assert shrink_sequence(128, 0.5) == [128, 64, 32, 16, 8, 4, 2, 1]
    assert shrink_sequence(128, 0.9)[:6] == [128, 115, 103, 92, 82, 73]
    assert shrink_sequence(10, 0.9)[-3:] == [3, 2, 1]
    assert shrink_sequence(64, 0.5, multiple=8) == [64, 32, 16, 8]
    with pytest.raises(UsageError, match="1.5"):
        shrink_sequence(128, 1.5)


def test_shrink_stops_at_the_first_fit_and_never_grows():
    answer, ran = drive(shrink_config(), "shrink_x0.9", fits_at=lambda b: b <= 1000)
    assert (answer, ran) == (128, [128])


@pytest.mark.parametrize("name, ceiling, expected_runs", [
    ("shrink_x0.9", 100, [128, 115, 103, 92]),
    ("shrink_x0.5", 100, [128, 64]),
    ("shrink_x0.5", 63, [128, 64, 32]),
])
def test_shrink_walks_down_by_its_factor(name, ceiling, expected_runs):
    answer, ran = drive(shrink_config(), name, fits_at=lambda b: b <= ceiling)
    assert ran == expected_runs
    assert answer == expected_runs[-1] <= ceiling


def test_shrink_counts_over_budget_as_failure_and_reaching_zero_as_nothing_fits():
    config = SearchConfig(budget_bytes=1000, start_batch=128)
    outcomes = [Outcome(128, ran=True, peak_bytes=2000)]  # ran, but measured over the budget
    assert next_step(config, outcomes, "shrink_x0.5") == Run(64)
    answer, ran = drive(shrink_config(), "shrink_x0.5", fits_at=lambda b: False)
    assert answer is None
    assert ran == [128, 64, 32, 16, 8, 4, 2, 1]


def test_shrink_honours_the_multiple_and_the_outcome_order():
    config = shrink_config(multiple=8)
    answer, ran = drive(config, "shrink_x0.9", fits_at=lambda b: b <= 90)
    assert ran == [128, 112, 96, 80]  # int(128 x 0.9) = 115 -> 112, int(112 x 0.9) = 100 -> 96, ...
    assert answer == 80
    shuffled = [Outcome(112, ran=False), Outcome(128, ran=False)]
    assert next_step(config, shuffled, "shrink_x0.9") == Run(96)


def linear_device(baseline_bytes, per_sample_bytes):
    return lambda batch: baseline_bytes + per_sample_bytes * batch


def estimate_config(budget_mib, baseline_mib, **kwargs):
    return SearchConfig(
        budget_bytes=budget_mib * MIB, baseline_bytes=baseline_mib * MIB, max_batch_limit=100_000, **kwargs,
    )


def test_estimate_calibrates_at_batch_one_then_checks_around_the_estimate():
    config = estimate_config(1000, 600)
    peak = linear_device(600 * MIB, 2 * MIB)  # ceiling (1000 - 600) / 2 = 200
    assert next_step(config, [], "one_shot_estimate") == Run(1)
    calibration = Outcome(1, ran=True, peak_bytes=peak(1))
    assert estimate_candidates(config, calibration) == [190, 200, 210]
    answer, ran = drive(config, "one_shot_estimate", fits_at=lambda b: peak(b) <= config.budget_bytes, peak_of=peak)
    assert ran == [1, 190, 200, 210]
    assert answer == 200


def test_estimate_keeps_the_largest_candidate_that_fits():
    config = estimate_config(1000, 600)
    peak = linear_device(600 * MIB, 2 * MIB)
    answer, ran = drive(config, "one_shot_estimate", fits_at=lambda b: b <= 195, peak_of=peak)  # the truth is lower than the line
    assert ran == [1, 190, 200]  # stops at the first failure
    assert answer == 190


def test_estimate_that_misses_low_answers_the_calibration_batch_not_a_failure():
    config = estimate_config(1000, 600)
    peak = linear_device(600 * MIB, 2 * MIB)
    answer, ran = drive(config, "one_shot_estimate", fits_at=lambda b: b <= 50, peak_of=peak)
    assert ran == [1, 190]
    assert answer == 1


def test_estimate_with_a_calibration_that_adds_nothing_goes_to_max_batch_limit():
    config = estimate_config(1000, 600)
    flat = Outcome(1, ran=True, peak_bytes=590 * MIB)  # below the baseline: RSS noise
    assert estimate_candidates(config, flat) == [config.max_batch_limit]


def test_estimate_when_nothing_fits():
    config = estimate_config(1000, 600)
    assert drive(config, "one_shot_estimate", fits_at=lambda b: False) == (None, [1])
    full = estimate_config(500, 600)  # the baseline alone is over the budget
    assert estimate_candidates(full, Outcome(1, ran=True, peak_bytes=601 * MIB)) == []


def test_estimate_rounds_to_the_multiple():
    config = estimate_config(1000, 600, multiple=8)
    peak = linear_device(600 * MIB, 2 * MIB)
    assert next_step(config, [], "one_shot_estimate") == Run(8)
    answer, ran = drive(config, "one_shot_estimate", fits_at=lambda b: peak(b) <= config.budget_bytes, peak_of=peak)
    assert all(b % 8 == 0 for b in ran)
    assert answer == 200


def test_estimate_needs_the_baseline_and_names_it():
    config = SearchConfig(budget_bytes=1000 * MIB)
    with pytest.raises(UsageError, match="baseline_bytes"):
        next_step(config, [Outcome(1, ran=True, peak_bytes=700 * MIB)], "one_shot_estimate")

def test_power_keeps_the_last_success_of_plain_doubling():
    answer, steps = simulate(SearchConfig(budget_bytes=1000 * MIB), linear(100, 5), decide=finders.power_step)
    assert runs(steps) == [8, 16, 32, 64, 128, 256]
    assert answer == 128


def test_binsearch_keeps_lightnings_arithmetic_midpoint():
    """dense_wide under a 300 MiB address-space cap, told only the RAM: where edgebatch's search bisects
    geometrically (tests/test_probe_search.py), binsearch halves the interval as Lightning does."""
    peak = linear(770, 2.1)
    config = SearchConfig(budget_bytes=int(23 * 1024 * MIB * 0.99), start_batch=8, max_batch_limit=4096)
    plain = simulate(config, peak, crash_above=128, decide=finders.binsearch_step)[1]
    assert runs(plain)[:9] == [8, 16, 32, 64, 128, 256, 192, 160, 144]
    assert finders.midpoint(32, 4096) == 2064


def test_a_fit_inside_a_band_does_not_clear_failures_below_it_so_checked_binsearch_moves_on():
    """Checked binsearch on mlp under a 256 MiB cap (BENCHMARKS.md at a9fb42f) asked for 18944 40
    times and 20224 100 times, 162 trials in all. A new process fitted 21504 at 1,009.7 MiB and another
    ran out of memory there; the fit cleared every over-budget reading below it while the OOM bounded
    the edge, so the midpoint's readings over the lowered budget counted neither way. Its first 26
    trials as the run recorded them: (batch, peak MiB, worker, ran)."""
    from edgebatch.probing.margins import fit_budget_bytes

    rows = [(8, 808.3, "new", True), (16, 808.4, "reused", True), (32, 808.6, "reused", True),
            (64, 809.2, "reused", True), (128, 811.2, "reused", True), (256, 811.5, "reused", True),
            (512, 812.6, "reused", True), (1024, 820.3, "reused", True), (2048, 828.2, "reused", True),
            (4096, 849.6, "reused", True), (8192, 886.0, "reused", True), (16384, 978.7, "reused", True),
            (32768, None, "reused", False), (24576, None, "child", False), (20480, 1026.5, "child", True),
            (22528, 1076.5, "child", True), (21504, 1037.3, "child", True), (22016, 1060.2, "child", True),
            (21760, 1039.6, "child", True), (21760, None, "new", False), (21760, 1012.1, "new", True),
            (21504, 1009.7, "new", True), (21504, None, "new", False), (20992, 1073.5, "child", True),
            (20992, 1030.7, "child", True), (18944, 1011.4, "child", True)]
    outcomes = [Outcome(batch, ran=ran, peak_bytes=int(peak * MIB) if peak else 0, fresh=kind != "reused",
                        forked={"child": True, "new": False}.get(kind)) for batch, peak, kind, ran in rows]
    config = SearchConfig(budget_bytes=fit_budget_bytes(1114910720, 1), max_batch_limit=65536)
    lowered = effective_budget_bytes(outcomes, config.budget_bytes)
    assert 1010 * MIB < lowered < 1011 * MIB  # 18944 read 1,011.4 MiB: over it
    assert edge_of(outcomes, lowered).hi == 18944, "the reading over the lowered budget counts"
    step = next_step(config, outcomes, "binsearch_checked")
    assert isinstance(step, Run) and 16384 < step.batch < 18944, step
    # Below the band a fresh fit still clears an over-budget reading of a smaller batch.
    below = [Outcome(100, ran=True, peak_bytes=1100 * MIB, fresh=True, forked=True),
             Outcome(120, ran=True, peak_bytes=900 * MIB, fresh=True, forked=False),
             Outcome(200, ran=False, fresh=True, forked=False)]
    assert edge_of(below, 1000 * MIB).hi == 200


def test_checked_binsearch_costs_binsearch_its_answer_readings_and_no_more_on_a_clean_device():
    """binsearch_checked prices slow_start's answer rule alone: on a device where every reading is
    the truth, it takes binsearch's trials, then reads the same answer in answer_readings fresh workers."""
    peak = linear(700, 2.5)
    budget = 1536 * MIB
    plain, plain_steps = simulate(SearchConfig(budget_bytes=budget), peak, decide=finders.binsearch_step)
    checked, checked_steps = simulate(SearchConfig(budget_bytes=budget), peak, decide=finders.checked_binsearch_step)
    assert checked == plain
    assert runs(checked_steps) == runs(plain_steps) + [plain] * ANSWER_READINGS
    assert [s.fresh for s in checked_steps if isinstance(s, Run)][-ANSWER_READINGS:] == [True] * ANSWER_READINGS


def test_checked_binsearch_walks_down_where_fresh_processes_fail_what_its_reused_worker_ran():
    """mlp under a 256 MiB address-space cap (BENCHMARKS.md at ba7149b): binsearch's worker ran 25600,
    fresh processes failed from 21443. Checked, a fresh failure of the answer counts and the
    bisection goes on below it; the answer then ran in answer_readings fresh workers."""
    fresh_limit, reused_limit = 21321, 25600
    peak = linear(765, 0.0095)
    config = SearchConfig(budget_bytes=10_000 * MIB, max_batch_limit=65536)
    outcomes = []
    for _ in range(200):
        step = next_step(config, outcomes, "binsearch_checked")
        if isinstance(step, Done):
            break
        limit = fresh_limit if step.fresh else reused_limit
        ran = step.batch <= limit
        outcomes.append(Outcome(step.batch, ran, int(peak(step.batch)) if ran else None, fresh=step.fresh))
    else:
        raise AssertionError(f"no answer: {outcomes}")
    plain = simulate(config, peak, crash_above=reused_limit, decide=finders.binsearch_step)[0]
    assert plain > fresh_limit  # what the check is for
    assert (1 - config.tolerance) * fresh_limit <= step.max_batch <= fresh_limit, step
    readings = [o for o in outcomes if o.batch == step.max_batch and o.fresh]
    assert len(readings) == ANSWER_READINGS and all(o.ran for o in readings)


def test_checked_binsearch_judges_its_answer_by_the_spread_of_its_fresh_readings():
    """As slow_start's: readings of the answer 3.4% apart lower the budget by that spread, and the
    batch, whose lowest reading no longer fits the lowered budget, is not the answer."""
    budget = 1000 * MIB
    config = SearchConfig(budget_bytes=budget)
    outcomes = [Outcome(b, True, int(linear(500, 1)(b))) for b in (8, 16, 32, 64, 128, 256)]
    outcomes += [Outcome(512, True, 1012 * MIB), Outcome(384, True, 884 * MIB), Outcome(448, True, 948 * MIB),
                 Outcome(480, True, 980 * MIB), Outcome(496, True, 996 * MIB), Outcome(504, True, 1004 * MIB)]
    outcomes = [dataclasses.replace(o, ran=False, peak_bytes=None) if o.batch == 512 else o for o in outcomes]
    assert next_step(config, outcomes, "binsearch_checked") == Run(496, fresh=True, readings=ANSWER_READINGS)
    outcomes.append(Outcome(496, True, 970 * MIB, fresh=True))
    assert next_step(config, outcomes, "binsearch_checked") == Run(496, fresh=True, readings=ANSWER_READINGS - 1)
    outcomes += [Outcome(496, True, 1003 * MIB, fresh=True), Outcome(496, True, 975 * MIB, fresh=True)]
    assert effective_budget_bytes(outcomes, budget) < budget
    assert edge_of(outcomes, effective_budget_bytes(outcomes, budget)).hi <= 496
    step = next_step(config, outcomes, "binsearch_checked")
    assert isinstance(step, Run) and step.batch < 496, step
