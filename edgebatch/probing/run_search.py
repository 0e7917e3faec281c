"""The search in workers: each step search.py decides is run in a worker, judged and reported.

run_search is the loop (the finder's next_step, then the trial or the repeats side by side it asks
for, then the lines that say what happened and what is left); fresh_workers.py starts the workers it
needs. The finder is the probe's own search (search.SLOW_START) unless a caller passes another: the
benchmark runs the peers' finders (tools/bench/finders.py) on these same workers and rules.
"""

from __future__ import annotations

import dataclasses
import time

from edgebatch.probing import eta
from edgebatch.probing.fresh_workers import (
    FreshWorkers,
    repeats_side_by_side,
    seconds_per_sample_seen,
    side_by_side_count,
    worker_for,
)
from edgebatch.probing.outcomes import (
    BAND_READINGS_FACTOR,
    SPREAD_NOISE_FRACTION,
    Finder,
    answer_readings_wanted,
    child_level_excess,
    effective_budget_bytes,
    levels_seen,
    oom_band_seen,
    peak_spread_fraction,
)
from edgebatch.probing.readings import Progress, trial_from_reply, trial_line
from edgebatch.probing.search import SLOW_START, Done, Outcome, SearchConfig, Skip
from edgebatch.probing.squeeze import RoomWatch
from edgebatch.probing.worker import Worker, WorkerSetup
from edgebatch.profiles import Trial
from edgebatch.units import format_bytes


def run_search(config: SearchConfig, setup: WorkerSetup, workers: list[Worker], measure: str, progress: Progress,
               fork: FreshWorkers | None = None, watch: RoomWatch | None = None, finder: Finder = SLOW_START):
    """Run the steps `finder.next_step` decides in workers until it is done: (trials, Done). `watch`
    keeps the room around each failed trial (squeeze.py)."""
    watch = watch or RoomWatch()
    outcomes: list[Outcome] = []
    trials: list[Trial] = []
    times: list[eta.TrialTime] = []
    began = time.monotonic()
    while True:
        step = finder.next_step(config, outcomes)
        step_began = time.monotonic()
        room_before = watch.room(workers)
        if isinstance(step, Done):
            return trials, step
        if isinstance(step, Skip):
            outcomes.append(Outcome(step.batch, ran=False, peak_bytes=step.predicted_peak_bytes, measured=False))
            trials.append(Trial(
                batch=step.batch, ok=False, error="predicted_over_budget", peak_bytes=step.predicted_peak_bytes,
                process_peak_bytes=None, allocator_peak_bytes=None, step_seconds=None, samples_per_second=None,
                measured=False,
            ))
            progress(f"  batch {step.batch:>6}  skipped: predicted peak {format_bytes(step.predicted_peak_bytes)} > budget")
            continue
        # A repeat of a batch a fresh worker already read runs in a new process, not a fork-server
        # child: children of one server read alike (mobilenet_v2 at 31: three children at 1.48 GiB),
        # where new processes, like the training they stand for, differ (docs/probe-evidence.md,
        # "Peaks that differ between processes"). So does a first reading the search asks of a new
        # process (Run.new_process) where a fork server would otherwise give a child, with a
        # repeat's steps; without a fork server every fresh worker is a new process anyway.
        forked_otherwise = fork is not None and fork.server is not None
        tried = sum(1 for o in outcomes if o.batch == step.batch and o.fresh and o.measured)
        repeat = step.fresh and (tried > 0 or (step.new_process and forked_otherwise))
        missing = step.readings if repeat else 1
        together = side_by_side_count(missing, fork)
        if together > 1:
            # What is left of the repeats runs as many at once as the machine has room and cores
            # for, each in its own new process: their imports overlap (FreshWorkers.side_by_side).
            # The search then asks for what is still missing, unless a reading failed.
            for worker in workers:
                worker.close()
            workers.clear()
            new_trials, ahead = repeats_side_by_side(step.batch, together, config, setup, measure,
                                                     seconds_per_sample=seconds_per_sample_seen(trials), fork=fork)
            started = f", {ahead} of them started ahead" if ahead else ""
            note = f"  (fresh worker, a new process; {together} side by side{started})"
        else:
            worker = worker_for(step.batch, config, setup, workers, fresh=step.fresh, fork=fork, repeat=repeat)
            if worker.step_seconds_per_sample is None:
                worker.step_seconds_per_sample = seconds_per_sample_seen(trials)
            reply = worker.run_trial(step.batch)
            fresh = worker.trials_run == 1
            new_trials = [dataclasses.replace(trial_from_reply(reply, measure, config.budget_bytes), fresh=fresh,
                                              forked=worker.forked)]
            if worker.started_ahead:
                note = "  (fresh worker, a new process started ahead)"
            else:
                note = "  (fresh worker, a new process)" if repeat and forked_otherwise else "  (fresh worker)"
        watch.note(new_trials, (room_before, watch.room(workers)))
        if fork is not None and step.fresh:
            fork.refill_spares()
        each_seconds = (time.monotonic() - step_began) / len(new_trials)
        for trial in new_trials:
            # The scout's first trial is fresh but its start-up came before the search: it times no start-up.
            times.append(eta.TrialTime(seconds=each_seconds, fresh=trial.fresh and bool(times)))
            record_trial(trial, trials, outcomes, config, progress, note if trial.fresh else "", finder.checks_answer)
        progress(_time_line(config, outcomes, times, time.monotonic() - began, finder.checks_answer))


def _time_line(config: SearchConfig, outcomes: list[Outcome], times: list[eta.TrialTime], elapsed_seconds: float,
               checks_answer: bool) -> str:
    """The progress line after each step: trials and time so far, and the estimate of what is left (eta.py)."""
    left = eta.trials_left(config, outcomes, checks_answer=checks_answer)
    estimate = eta.estimate(left, times)
    so_far = f"    {len(times)} trial{'' if len(times) == 1 else 's'}, {elapsed_seconds:.0f} s so far"
    return so_far + (f"; {estimate.describe()}" if estimate is not None else "")


def record_trial(trial: Trial, trials: list[Trial], outcomes: list[Outcome], config: SearchConfig, progress: Progress,
                 note: str, checks_answer: bool = True) -> None:
    """Add one trial to the search's records, and say so; and when repeated readings now differ, what that does
    (`checks_answer`, Finder's: also how many fresh readings its answer then needs)."""
    trials.append(trial)
    ran = trial.ok or trial.error == "over_budget"
    spread_before = peak_spread_fraction(outcomes)
    band_before = oom_band_seen(outcomes)
    levels_before = levels_seen(outcomes)
    outcomes.append(Outcome(trial.batch, ran=ran, peak_bytes=trial.peak_bytes, fresh=trial.fresh, forked=trial.forked))
    progress(trial_line(trial) + note)
    if checks_answer and not band_before and oom_band_seen(outcomes):
        progress(f"  fresh workers both ran and ran out of memory at or below batch {trial.batch}: the edge is a "
                 f"band here, so the answer needs {config.answer_readings * BAND_READINGS_FACTOR} fresh readings")
    spread = peak_spread_fraction(outcomes)
    if spread > max(spread_before, SPREAD_NOISE_FRACTION):
        readings = ""
        if checks_answer and not (band_before or spread_before > SPREAD_NOISE_FRACTION):
            readings = f", and the answer needs {answer_readings_wanted(config.answer_readings, outcomes)} fresh readings"
        progress(f"  fresh workers read batch {trial.batch} {spread:.1%} apart: peaks differ between processes "
                 f"here, so readings must now fit {format_bytes(effective_budget_bytes(outcomes, config.budget_bytes))}"
                 + readings)
    excess = child_level_excess(outcomes)
    if (checks_answer and excess is not None and not levels_before
            and not band_before and spread <= SPREAD_NOISE_FRACTION):
        batch, above_lift, lift = excess
        progress(f"  a fork-server child read batch {batch} {format_bytes(above_lift)} above the "
                 f"{format_bytes(lift)} children read over new processes elsewhere: peaks take levels here, so the "
                 f"answer needs {answer_readings_wanted(config.answer_readings, outcomes)} fresh readings")
