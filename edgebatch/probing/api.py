"""`edgebatch.probe(...)`: find a device's safe batch ceiling for a model and cache it.

The recipe: resolve the device and budget; start a scout worker (it builds the model and traces the
step); look for a cached profile as soon as the scout says what the model is (before its trace, which
a reused profile does not wait for); run the search (search.py decides, workers measure); summarise;
write the profile atomically. The parent process never imports TensorFlow, so its own memory stays
out of the measurement and a crashing trial cannot take the probe down.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from edgebatch.errors import ProbeError, UsageError
from edgebatch.malloc_arenas import malloc_arena_max_in_effect
from edgebatch.probing import budget_answer, eta, per_length, summary, token_fit
from edgebatch.probing.budget_answer import BudgetQuestion
from edgebatch.probing.budget import DeviceFacts, default_device, device_facts, resolve_budget, with_worker_gpu_details
from edgebatch.probing.margins import bump_edge_fraction, fit_budget_bytes
from edgebatch.probing.reuse import BUDGET_TOLERANCE_FRACTION, answered_below, reuse_problem
from edgebatch.probing.outcomes import (
    ANSWER_READINGS,
    BAND_READINGS_FACTOR,
    CHECKED_BINSEARCH,
    DEFAULT_MAX_BATCH_LIMIT,
    DEFAULT_START_BATCH,
    DEFAULT_STRATEGY,
    DEFAULT_TOLERANCE,
    SPREAD_NOISE_FRACTION,
    answer_readings_wanted,
    child_level_excess,
    effective_budget_bytes,
    levels_seen,
    oom_band_seen,
    peak_spread_fraction,
)
from edgebatch.probing.search import Done, Outcome, SearchConfig, Skip, next_step
from edgebatch.probing.spares import SpareWorkers, no_room_line, spare_count
from edgebatch.probing.spares import wanted as spares_wanted
from edgebatch.probing.squeeze import RoomWatch, host_room_with_workers
from edgebatch.probing.trial import MAX_STEPS_PER_TRIAL
from edgebatch.probing.worker import (
    BASELINE_FIELDS,
    DEFAULT_INTER_OP_THREADS,
    DEFAULT_STEPS_PER_TRIAL,
    DEFAULT_TRIAL_SECONDS,
    MEASURE_FIELDS,
    Worker,
    WorkerSetup,
    await_identity,
    await_ready,
    spawn_worker,
    start_worker,
)
from edgebatch.profiles import (
    SCHEMA_VERSION,
    DeviceProfile,
    Trial,
    find_profile,
    model_key,
    resolve_profiles_dir,
    save_profile,
)
from edgebatch.threads import checked_inter_op_threads
from edgebatch.units import format_bytes
from edgebatch.zoo import OPTIMIZATIONS, OPTIMIZERS, PRECISIONS, keras_flavor, parse_model_spec

# The strategies that read their answer in fresh workers (search._repeat_answer), and say when it needs more readings.
ANSWER_CHECKING_STRATEGIES = ("slow_start", CHECKED_BINSEARCH)

# Fresh workers run this many steps at the start batch (at most half the trial's) before their
# trial, where prewarm_of gives one: with TensorFlow's inter-op pool the resident peak climbs over
# the first steps, and children read unsteadily without it (docs/probe-rules.md, "api.PREWARM_STEPS").
PREWARM_STEPS = 5


def prewarm_of(batch: int, start_batch: int, capped: bool, *, new_process: bool,
               inter_op_threads: int = DEFAULT_INTER_OP_THREADS) -> tuple[int | None, int]:
    """(prewarm batch, prewarm steps) for a fresh worker whose first trial runs `batch`.

    None under an address-space cap, and none for a new process with one inter-op thread: each then
    runs what the training (and the benchmark's truth) runs, the step traced at batch 1 and then the
    batch, where a prewarm moved the edge or lifted the reading by one allocator region
    (docs/probe-rules.md, "api.prewarm_of"). Fork-server children keep it.
    """
    if capped:
        return None, 0
    if new_process and inter_op_threads == 1:
        return None, 0
    return max(1, min(start_batch, batch // 2)), PREWARM_STEPS


# A repeat (a batch a fresh worker already read, read again in a new process) stands for training,
# and a process's peak can jump as late as step 7, after the settle rule stops waiting: so a repeat
# runs this many timed steps, within --trial-seconds (docs/probe-rules.md, "api.REPEAT_STEPS").
REPEAT_STEPS = MAX_STEPS_PER_TRIAL


def _fresh_setup(setup: WorkerSetup, batch: int, start_batch: int, *, new_process: bool,
                 repeat: bool = False) -> WorkerSetup:
    """`setup` with the prewarm a fresh worker whose first trial runs `batch` gets (prewarm_of),
    and for a `repeat` at least REPEAT_STEPS steps."""
    prewarm, steps = prewarm_of(batch, start_batch, capped=bool(setup.address_space_headroom_bytes),
                                new_process=new_process, inter_op_threads=setup.inter_op_threads)
    steps_per_trial = max(setup.steps_per_trial, REPEAT_STEPS) if repeat else setup.steps_per_trial
    return WorkerSetup(**{**setup.__dict__, "prewarm_batch": prewarm, "prewarm_steps": steps,
                          "steps_per_trial": steps_per_trial})


def _spare_setup(setup: WorkerSetup, config: SearchConfig, fork: _FreshWorkers) -> WorkerSetup:
    """The setup of the new-process workers the search will ask for: repeats where a fork server
    serves first readings, first readings as well where none does. With one inter-op thread it
    does not depend on the batch (prewarm_of); with the pool it does only below twice the start."""
    return _fresh_setup(setup, config.max_batch_limit, config.start_batch, new_process=True,
                        repeat=fork.server is not None)


Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class ProbeRequest:
    """What a probe is asked. The CLI reads every default from here; the search's and the trial's
    come from their owners (outcomes.py, worker.py), headroom and the rest are owned here.

    `max_batch_limit` is the largest batch the search may try; `max_batch` is only ever the answer.
    `allow_overcommit` accepts an explicit budget above what the device can give now.
    `optimize` ("qat", "prune") probes the model wrapped by TFMOT; the worker builds it as a tf_keras
    model and is the only process that imports tensorflow_model_optimization (zoo.py).
    """

    model: str = "mobilenet_v2"
    device: str | None = None
    memory_budget: str | int | None = None
    allow_overcommit: bool = False
    precision: str = "float32"
    optimizer: str = "adam"
    optimize: str = "none"
    start: int = DEFAULT_START_BATCH
    max_batch_limit: int = DEFAULT_MAX_BATCH_LIMIT
    multiple: int = 1
    headroom: float = 0.10
    steps_per_trial: int = DEFAULT_STEPS_PER_TRIAL
    trial_seconds: float = DEFAULT_TRIAL_SECONDS
    # TensorFlow inter-op threads in the workers (0: TensorFlow's own pool); see worker.DEFAULT_INTER_OP_THREADS.
    inter_op_threads: int = DEFAULT_INTER_OP_THREADS
    # Fresh readings of the answer before slow_start gives it (outcomes.ANSWER_READINGS).
    answer_readings: int = ANSWER_READINGS
    # How close the search brackets the edge, as a share of the answer (outcomes.DEFAULT_TOLERANCE).
    tolerance: float = DEFAULT_TOLERANCE
    strategy: str = DEFAULT_STRATEGY
    worker_address_space_headroom_bytes: int | None = None
    # Sequence lengths (tokens) to probe a model with a variable sequence axis at: "64,128,256" or
    # a sequence of ints. None: a built-in sequence model's default ladder (token_fit.default_lengths),
    # a plain probe for every other model (per_length.resolve_lengths).
    seq_lens: str | tuple[int, ...] | None = None

    def search_settings(self, seq_lens: tuple[int, ...] | None = None) -> dict:
        """The settings a profile records under `search` (reuse.py compares those that change the answer).

        `seq_lens`: the lengths a probe per length resolved (recorded only then).
        """
        settings = {
            "strategy": self.strategy,
            "start": self.start,
            "multiple": self.multiple,
            "max_batch_limit": self.max_batch_limit,
            "steps_per_trial": self.steps_per_trial,
            "trial_seconds": self.trial_seconds,
            "inter_op_threads": self.inter_op_threads,
            "answer_readings": self.answer_readings,
            "tolerance": self.tolerance,
            # The workers inherit this process's environment (edgebatch/malloc_arenas.py).
            "malloc_arena_max": malloc_arena_max_in_effect(),
        }
        if seq_lens:
            settings["seq_lens"] = list(seq_lens)
        return settings

    def validate(self) -> None:
        if self.precision not in PRECISIONS:
            raise UsageError(f"unknown precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"unknown optimizer {self.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
        if self.optimize not in OPTIMIZATIONS:
            raise UsageError(f"unknown --optimize {self.optimize!r}: choose one of {', '.join(OPTIMIZATIONS)}")
        if not 0 <= self.headroom < 1:
            raise UsageError(f"--headroom must be in [0, 1), got {self.headroom!r}")
        if not 0 < self.tolerance < 1:
            raise UsageError(f"--tolerance must be in (0, 1), e.g. 0.05 for 5%, got {self.tolerance!r}")
        if self.steps_per_trial < 1:
            raise UsageError(f"--steps-per-trial must be >= 1, got {self.steps_per_trial!r}")
        if self.start < 1:
            raise UsageError(f"--start must be >= 1, got {self.start!r}")
        if self.multiple < 1:
            raise UsageError(f"--multiple must be >= 1, got {self.multiple!r}")
        if self.max_batch_limit < self.multiple:
            raise UsageError(
                f"--max-batch-limit must be at least --multiple ({self.multiple}), got {self.max_batch_limit!r}"
            )
        if self.trial_seconds <= 0:
            raise UsageError(f"trial seconds must be positive, got {self.trial_seconds!r}")
        checked_inter_op_threads(self.inter_op_threads, "--inter-op-threads")
        if isinstance(self.answer_readings, bool) or not isinstance(self.answer_readings, int) or self.answer_readings < 1:
            raise UsageError(f"--answer-readings must be a whole number >= 1, got {self.answer_readings!r}")
        token_fit.parse_seq_lens(self.seq_lens)


def probe(
    model="mobilenet_v2",
    *,
    profiles_dir: str | Path | None = None,
    force: bool = False,
    save: bool = True,
    progress: Progress | None = None,
    **options,
) -> DeviceProfile:
    """Probe the largest safe training batch of `model` on `device` and return its DeviceProfile.

    `model` is a built-in name, "FILE.py:FUNCTION", a ".keras" path, or a Keras model object (saved
    to a temporary .keras file for the worker). `options` are ProbeRequest's fields, with its
    defaults: device, memory_budget, allow_overcommit, precision, optimizer, optimize, start, max_batch_limit,
    multiple, headroom, steps_per_trial, trial_seconds, inter_op_threads, answer_readings, tolerance, strategy,
    worker_address_space_headroom_bytes, seq_lens. The ceiling holds for training run with the same `inter_op_threads` (default 1, one
    TensorFlow inter-op thread: set_inter_op_threads in edgebatch; docs/probe-evidence.md).
    A model with a variable sequence axis (transformer_tiny, lstm_small, your own with an input of
    shape (None,)) is probed per length: `seq_lens` ("64,128,256" or ints; a built-in's default is
    a ladder up to its longest length) and the profile's `per_length` and `token_model` (per_length.py).
    A cached profile is returned, unless `force`, only where it answers this request: same device
    (fingerprint, memory limit included) and model key, the same settings that change the answer,
    and a budget up to 3% above the profile's or any below it, which its readings answer
    (probing/reuse.py, probing/budget_answer.py); `progress` is told why it was or was not reused. See
    device_profiles/README.md for every field.

    Raises:
        UsageError: a bad option (unknown name, a unit-less budget under 1 MiB, a budget above what
            the device can give without allow_overcommit, ...).
        ProbeError: the probe could not finish (no batch fits, a worker failed).
    """
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(ProbeRequest)})
    if unknown:
        raise UsageError(f"unknown probe option(s) {', '.join(unknown)}: see edgebatch.probing.ProbeRequest")
    temp_model_file = None
    if not isinstance(model, str):
        optimize = options.get("optimize", "none")
        if optimize != "none" and keras_flavor(model) != "tf_keras":
            raise UsageError(
                f"--optimize {optimize} needs a tf_keras model (TFMOT does not handle Keras 3) and this is a Keras 3 "
                f"{type(model).__name__}: build it with `import tf_keras` (as in tests/models/tf_keras_mlp.py)"
            )
        temp_model_file = _save_model_object(model)
        model = temp_model_file
    request = ProbeRequest(model=model, **options)
    try:
        return run_probe(request, profiles_dir=profiles_dir, force=force, save=save, progress=progress or _silent)
    finally:
        if temp_model_file:
            os.unlink(temp_model_file)


def run_probe(request: ProbeRequest, *, profiles_dir=None, force=False, save=True, progress: Progress = print) -> DeviceProfile:
    request.validate()
    spec = parse_model_spec(request.model)
    lengths = per_length.resolve_lengths(spec, request.seq_lens)
    device = (request.device or default_device()).upper()
    facts = device_facts(device)
    budget_bytes, budget_source = resolve_budget(device, request.memory_budget, request.allow_overcommit)
    config = SearchConfig(
        budget_bytes=fit_budget_bytes(budget_bytes, request.inter_op_threads),
        start_batch=request.start,
        max_batch_limit=request.max_batch_limit,
        multiple=request.multiple,
        tolerance=request.tolerance,
        strategy=request.strategy,
        refuse_predicted_over_budget=facts.kind == "CPU",
        bump_edge_fraction=bump_edge_fraction(request.inter_op_threads),
        answer_readings=request.answer_readings,
    )
    setup = WorkerSetup(
        model_spec=spec.text,
        precision=request.precision,
        optimizer=request.optimizer,
        optimize=request.optimize,
        device=device,
        steps_per_trial=request.steps_per_trial,
        trial_seconds=request.trial_seconds,
        inter_op_threads=request.inter_op_threads,
        address_space_headroom_bytes=request.worker_address_space_headroom_bytes,
        # The scout runs the first length a probe per length searches.
        sequence_length=token_fit.probe_order(lengths)[0] if lengths else None,
    )
    started = time.monotonic()
    progress(f"probing {spec.text} on {device} ({facts.description}), budget {format_bytes(budget_bytes)} ({budget_source})")
    scout = spawn_worker(setup)
    workers: list[Worker] = [scout]
    fork = None
    at_once = False
    try:
        # What the model is, as soon as the scout has built it: a cached profile is found (or not)
        # without waiting for the trace, which takes most of a large model's start-up.
        identity = await_identity(scout)
        facts = with_worker_gpu_details(facts, identity.get("gpu"))
        # Built-ins are known by their name; a user's function or file by the model's own name.
        name = spec.name if spec.kind == "builtin" else identity["name"]
        per_length.check_sequence_axis(name, lengths, identity.get("variable_sequence_axis", False))
        key = model_key(
            name,
            identity["config_hash"],
            identity["inputs"],
            request.precision,
            request.optimizer,
            identity["tensorflow"],
            optimize=request.optimize,
            seq_lens=lengths,
        )
        fingerprint = facts.fingerprint
        directory = resolve_profiles_dir(profiles_dir)
        cached = None if force else find_profile(directory, fingerprint, key)
        if cached is not None:
            reused = _reused(cached, request, budget_bytes, budget_source, lengths, directory, progress)
            if reused is not None:
                at_once = True  # the scout is still tracing a step no trial will use
                return reused
        elif not force:
            progress(f"no cached profile for this device and model in {directory}; probing")
        model_facts = await_ready(scout).facts
        # The worker says what its trials measure (worker.measure_of) and, on a GPU NVML does not
        # see, what TensorFlow calls it.
        measure = model_facts["measure"]
        if model_facts.get("inter_op_threads") != setup.inter_op_threads:
            raise ProbeError(
                f"the probe's worker runs {model_facts.get('inter_op_threads')} TensorFlow inter-op threads where "
                f"{setup.inter_op_threads} were asked for: its readings would not describe the setting the profile records"
            )
        _refuse_budget_below_baseline(budget_bytes, model_facts, measure, device)
        # What one-shot estimators start from: the worker's memory before any trial batch.
        baseline = model_facts.get(BASELINE_FIELDS[measure])
        config = dataclasses.replace(config, baseline_bytes=baseline)
        optimized = "" if request.optimize == "none" else f", TFMOT {request.optimize}"
        progress(
            f"model {model_facts['name']}: {model_facts['parameters']:,} parameters, {model_facts['keras_flavor']}{optimized}"
        )
        fork = _FreshWorkers(device, budget_bytes, progress)
        if not lengths:
            fork.start_spares(_spare_setup(setup, config, fork), baseline)
        # An overcommitted budget is above the room by the user's choice: failures there are theirs to judge.
        watch = RoomWatch(None if request.allow_overcommit else host_room_with_workers(device))
        search = functools.partial(_search, watch=watch)
        if lengths:
            by_length = per_length.search_lengths(lengths, config, setup, workers, measure, progress, fork, search)
        else:
            trials, final = search(config, setup, workers, measure, progress, fork)
        squeezed = watch.problem(budget_bytes)
        if squeezed is not None:
            raise ProbeError(squeezed)
    except BaseException:
        # Ctrl-C, SIGTERM or an error: a worker in the middle of a trial is killed, not waited for.
        at_once = True
        raise
    finally:
        for worker in workers:
            worker.close(at_once=at_once)
        if fork is not None:
            fork.close()  # after its children: they die with it
    if lengths:
        profile = _per_length_profile(
            request, name, device, facts, fingerprint, key, model_facts, budget_bytes, budget_source, measure,
            by_length, lengths, time.monotonic() - started,
        )
    else:
        if final.max_batch is None:
            raise ProbeError(
                f"no batch of {request.multiple} or more fits the budget of {format_bytes(budget_bytes)} on {device}: "
                "raise --memory-budget, use a smaller model or input, or lower --multiple"
            )
        profile = _build_profile(
            request, name, device, facts, fingerprint, key, model_facts, budget_bytes, budget_source, measure,
            trials, final.max_batch, time.monotonic() - started,
        )
    if save:
        path = save_profile(profile, directory)
        progress(f"saved {path}")
    return profile


def _search(config: SearchConfig, setup: WorkerSetup, workers: list[Worker], measure: str, progress: Progress,
            fork: _FreshWorkers | None = None, watch: RoomWatch | None = None):
    """Run the search's steps in workers until it is done: (trials, Done). `watch` keeps the room
    around each failed trial (squeeze.py)."""
    watch = watch or RoomWatch()
    outcomes: list[Outcome] = []
    trials: list[Trial] = []
    times: list[eta.TrialTime] = []
    began = time.monotonic()
    while True:
        step = next_step(config, outcomes)
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
        together = _side_by_side_count(missing, fork)
        if together > 1:
            # What is left of the repeats runs as many at once as the machine has room and cores
            # for, each in its own new process: their imports overlap (_FreshWorkers.side_by_side).
            # The search then asks for what is still missing, unless a reading failed.
            for worker in workers:
                worker.close()
            workers.clear()
            new_trials, ahead = _repeats_side_by_side(step.batch, together, config, setup, measure,
                                                      seconds_per_sample=_seconds_per_sample_seen(trials), fork=fork)
            started = f", {ahead} of them started ahead" if ahead else ""
            note = f"  (fresh worker, a new process; {together} side by side{started})"
        else:
            worker = _worker_for(step.batch, config, setup, workers, fresh=step.fresh, fork=fork, repeat=repeat)
            if worker.step_seconds_per_sample is None:
                worker.step_seconds_per_sample = _seconds_per_sample_seen(trials)
            reply = worker.run_trial(step.batch)
            fresh = worker.trials_run == 1
            new_trials = [dataclasses.replace(_trial_from_reply(reply, measure, config.budget_bytes), fresh=fresh,
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
            _record(trial, trials, outcomes, config, progress, note if trial.fresh else "")
        progress(_time_line(config, outcomes, times, time.monotonic() - began))


def _time_line(config: SearchConfig, outcomes: list[Outcome], times: list[eta.TrialTime], elapsed_seconds: float) -> str:
    """The progress line after each step: trials and time so far, and the estimate of what is left (eta.py)."""
    left = eta.trials_left(config, outcomes, checks_answer=config.strategy in ANSWER_CHECKING_STRATEGIES)
    estimate = eta.estimate(left, times)
    so_far = f"    {len(times)} trial{'' if len(times) == 1 else 's'}, {elapsed_seconds:.0f} s so far"
    return so_far + (f"; {estimate.describe()}" if estimate is not None else "")


def _record(trial: Trial, trials: list[Trial], outcomes: list[Outcome], config: SearchConfig, progress: Progress,
            note: str) -> None:
    """Add one trial to the search's records, and say so; and when repeated readings now differ, what that does."""
    trials.append(trial)
    ran = trial.ok or trial.error == "over_budget"
    spread_before = peak_spread_fraction(outcomes)
    band_before = oom_band_seen(outcomes)
    levels_before = levels_seen(outcomes)
    outcomes.append(Outcome(trial.batch, ran=ran, peak_bytes=trial.peak_bytes, fresh=trial.fresh, forked=trial.forked))
    progress(_trial_line(trial) + note)
    if config.strategy in ANSWER_CHECKING_STRATEGIES and not band_before and oom_band_seen(outcomes):
        progress(f"  fresh workers both ran and ran out of memory at or below batch {trial.batch}: the edge is a "
                 f"band here, so the answer needs {config.answer_readings * BAND_READINGS_FACTOR} fresh readings")
    spread = peak_spread_fraction(outcomes)
    if spread > max(spread_before, SPREAD_NOISE_FRACTION):
        readings = ""
        if config.strategy in ANSWER_CHECKING_STRATEGIES and not (band_before or spread_before > SPREAD_NOISE_FRACTION):
            readings = f", and the answer needs {answer_readings_wanted(config.answer_readings, outcomes)} fresh readings"
        progress(f"  fresh workers read batch {trial.batch} {spread:.1%} apart: peaks differ between processes "
                 f"here, so readings must now fit {format_bytes(effective_budget_bytes(outcomes, config.budget_bytes))}"
                 + readings)
    excess = child_level_excess(outcomes)
    if (config.strategy in ANSWER_CHECKING_STRATEGIES and excess is not None and not levels_before
            and not band_before and spread <= SPREAD_NOISE_FRACTION):
        batch, above_lift, lift = excess
        progress(f"  a fork-server child read batch {batch} {format_bytes(above_lift)} above the "
                 f"{format_bytes(lift)} children read over new processes elsewhere: peaks take levels here, so the "
                 f"answer needs {answer_readings_wanted(config.answer_readings, outcomes)} fresh readings")


def _side_by_side_count(missing: int, fork: _FreshWorkers | None) -> int:
    """How many of `missing` repeats run at once: the most the fork server's machine has room and
    cores for (_FreshWorkers.side_by_side), 1 where that is none. Six readings on two cores run as
    three pairs, where asking for all six at once ran five of them one by one."""
    if fork is None:
        return 1
    return next((count for count in range(missing, 1, -1) if fork.side_by_side(count)), 1)


def _seconds_per_sample_seen(trials: list[Trial]) -> float | None:
    """The slowest step seconds per sample among the trials that ran, or None before any did.

    It foresees a fresh worker's first trial for its reply deadline (Worker.trial_deadline) when the
    worker ran no prewarm to time (prewarm_of). Small batches overstate it, which only lengthens
    the deadline. Pure.
    """
    rates = [trial.step_seconds / trial.batch for trial in trials if trial.step_seconds and trial.batch > 0]
    return max(rates) if rates else None


def _repeats_side_by_side(batch: int, count: int, config: SearchConfig, setup: WorkerSetup, measure: str,
                          seconds_per_sample: float | None = None,
                          fork: _FreshWorkers | None = None) -> tuple[list[Trial], int]:
    """`count` fresh trials at `batch` at once, each in a new worker process, in the order they were
    started, and how many of those processes were started ahead (fork.spawn_new_process).

    `seconds_per_sample` foresees the trial's step time for its deadline (_seconds_per_sample_seen).
    All of them are started before any is waited for, so their TensorFlow imports overlap, and then
    their trials run together. One thread does it all, the one that runs the probe: the workers die
    with it (PR_SET_PDEATHSIG), and Ctrl-C or SIGTERM kills them at once, as it does the search's
    other workers (a thread per worker would make a stop wait for every trial to finish).
    """
    fresh_setup = _fresh_setup(setup, batch, config.start_batch, new_process=True, repeat=True)
    started: list[Worker] = []
    stopping = True
    try:
        for _ in range(count):
            started.append(fork.spawn_new_process(fresh_setup) if fork is not None else spawn_worker(fresh_setup))
        for worker in started:
            await_ready(worker)
            if worker.step_seconds_per_sample is None:
                worker.step_seconds_per_sample = seconds_per_sample
        for worker in started:
            worker.begin_trial(batch)
        replies = [worker.finish_trial() for worker in started]
        stopping = False
    finally:
        for worker in started:
            worker.close(at_once=stopping)
    trials = [dataclasses.replace(_trial_from_reply(reply, measure, config.budget_bytes), fresh=True, forked=False)
              for reply in replies]
    return trials, sum(1 for worker in started if worker.started_ahead)


def _worker_for(batch: int, config: SearchConfig, setup: WorkerSetup, workers: list[Worker], fresh: bool = False,
                fork: _FreshWorkers | None = None, repeat: bool = False) -> Worker:
    """The live worker whose readings stay right at `batch`, or a fresh one (see worker.py); a
    fresh one for a `repeat` is a new process (never a fork-server child) and runs REPEAT_STEPS
    steps (_fresh_setup).

    Workers that cannot run this trial (all of them when the search asks for a `fresh` one) are
    closed first: a scout that ran a batch above this one may hold most of the budget in resident
    memory (RSS never shrinks: docs/tensorflow-memory.md#resident-memory-never-shrinks), and the next
    trial must not run beside it. The search rarely climbs back above a worker's largest batch
    after stepping below it, so little is lost.
    """
    usable = None if fresh else next((worker for worker in workers if worker.can_run(batch)), None)
    for worker in [w for w in workers if w is not usable]:
        worker.close()
        workers.remove(worker)
    if usable is not None:
        return usable

    def setup_for(new_process: bool) -> WorkerSetup:
        return _fresh_setup(setup, batch, config.start_batch, new_process=new_process, repeat=repeat)

    if fork is None:
        fresh = start_worker(setup_for(True))
    else:
        fresh = fork.new_process(setup_for(True)) if repeat else fork.start(setup_for)
    workers.append(fresh)
    return fresh


def fits_side_by_side(count: int, room_bytes: int | None, budget_bytes: int, cores: int) -> bool:
    """Whether `count` trials of `budget_bytes` may run at once on a device with `room_bytes` free:
    room for all of them and the fork server's reserve, and at most one per core. Pure."""
    return room_bytes is not None and count <= cores and room_bytes - count * budget_bytes >= FORK_SERVER_RESERVE_BYTES


# What the fork server keeps to itself: 286 MiB anonymous memory after importing TensorFlow and
# Keras (docs/probe-evidence.md, "Fresh workers from a fork server"), rounded up. Children share it copy-on-write.
FORK_SERVER_RESERVE_BYTES = 512 * 1024**2


class _FreshWorkers:
    """Starts fresh workers: forked from a fork server (forkserver.py) where one may run, else as new processes.

    The server holds memory of its own beside every trial, so it runs only where the device has
    FORK_SERVER_RESERVE_BYTES of room beyond the budget: with an explicit budget under what the
    machine has, not with the default budget (all of the available RAM). It starts in the
    background when the probe begins searching, while the scout runs its trials.
    """

    def __init__(self, device: str, budget_bytes: int, progress: Progress) -> None:
        from edgebatch.probing.budget import device_room_bytes
        from edgebatch.probing.forkserver import ForkServer, fork_server_wanted
        from edgebatch.probing.worker import worker_environment

        self._progress = progress
        self.server = None
        self.spares: SpareWorkers | None = None
        self._budget_bytes = budget_bytes
        self._room_bytes = room = device_room_bytes(device) if fork_server_wanted(device) else None
        if room is not None and room - budget_bytes >= FORK_SERVER_RESERVE_BYTES:
            self.server = ForkServer(worker_environment(device))

    def side_by_side(self, count: int) -> bool:
        """Whether `count` fresh workers may run at once (fits_side_by_side), only where a fork server runs."""
        return self.server is not None and fits_side_by_side(count, self._room_bytes, self._budget_bytes,
                                                             os.cpu_count() or 1)

    def start(self, setup_for: Callable[[bool], WorkerSetup]) -> Worker:
        """A fresh worker with the setup `setup_for(new_process)` gives for how it is started."""
        from edgebatch.probing.forkserver import ForkServerError

        if self.server is not None:
            try:
                return start_worker(setup_for(False), server=self.server)
            except ForkServerError as error:
                self._progress(f"  {error}; fresh workers start as new processes")
                self.close_server()
        return self.new_process(setup_for(True))

    def start_spares(self, setup: WorkerSetup, baseline_bytes: int | None) -> None:
        """Where spares are turned on (spares.wanted), start those the room allows ahead of need
        (spares.py), or say there is room for none."""
        if not spares_wanted():
            return
        reserve = FORK_SERVER_RESERVE_BYTES if self.server is not None else 0
        count = spare_count(self._room_bytes, self._budget_bytes, reserve, baseline_bytes, os.cpu_count() or 1)
        if count == 0:
            self._progress(no_room_line(self._room_bytes, self._budget_bytes))
            return
        self.spares = SpareWorkers(setup, count, self._progress)
        self._progress(f"  {count} new-process worker(s) will be started ahead of the fresh readings that need them")

    def refill_spares(self) -> None:
        """Start spares up to their count (after a step that read fresh: see SpareWorkers)."""
        if self.spares is not None:
            self.spares.fill()

    def new_process(self, setup: WorkerSetup) -> Worker:
        """A ready fresh worker started as a new process: a spare where one matches `setup`, else started now."""
        spare = self.spares.take(setup) if self.spares is not None else None
        return spare if spare is not None else start_worker(setup)

    def spawn_new_process(self, setup: WorkerSetup) -> Worker:
        """As new_process, but not waited for (await_ready): a spare may still be starting."""
        spare = self.spares.take(setup, ready=False) if self.spares is not None else None
        return spare if spare is not None else spawn_worker(setup)

    def close(self) -> None:
        if self.spares is not None:
            self.spares.close()
        self.close_server()

    def close_server(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _trial_from_reply(reply: dict, measure: str, budget_bytes: int) -> Trial:
    if not reply.get("ok"):
        return Trial(
            batch=reply["batch"], ok=False, error=reply.get("error") or "oom", peak_bytes=None,
            process_peak_bytes=None, allocator_peak_bytes=None, step_seconds=None, samples_per_second=None,
        )
    peak = reply.get(MEASURE_FIELDS[measure])
    fits = peak is not None and peak <= budget_bytes
    return Trial(
        batch=reply["batch"],
        ok=fits,
        error=None if fits else "over_budget",
        peak_bytes=peak,
        process_peak_bytes=reply.get("process_peak_bytes"),
        allocator_peak_bytes=reply.get("allocator_peak_bytes"),
        step_seconds=reply.get("step_seconds"),
        samples_per_second=reply.get("samples_per_second"),
        settled=reply.get("resident_settled"),
        steady=reply.get("steady"),
    )


def _trial_line(trial: Trial) -> str:
    if trial.peak_bytes is None:
        return f"  batch {trial.batch:>6}  {trial.error.upper().replace('_', ' ')}"
    status = "ok" if trial.ok else "OVER BUDGET"
    return (
        f"  batch {trial.batch:>6}  {status:<11} peak {format_bytes(trial.peak_bytes):>11}  "
        f"{trial.samples_per_second:8.1f} samples/s" + ("  (peak still rising)" if trial.settled is False else "")
    )


def _reuse_problem(cached: DeviceProfile, request: ProbeRequest, budget_bytes: int,
                   lengths: tuple[int, ...] | None = None) -> str | None:
    return reuse_problem(
        cached_search=cached.search,
        cached_headroom=cached.headroom,
        cached_budget_bytes=cached.budget_bytes,
        requested_search=request.search_settings(lengths),
        requested_headroom=request.headroom,
        requested_budget_bytes=budget_bytes,
        cached_per_length=bool(cached.per_length),
    )


def _reused(cached: DeviceProfile, request: ProbeRequest, budget_bytes: int, budget_source: str,
            lengths: tuple[int, ...] | None, directory, progress: Progress) -> DeviceProfile | None:
    """The cached profile's answer to `request` (as it stands, or read from its readings at a
    smaller budget), saying so in one line; None, with the reason, where it has none."""
    where = directory / cached.path_name
    problem = _reuse_problem(cached, request, budget_bytes, lengths)
    if problem is None and not answered_below(cached.budget_bytes, budget_bytes, bool(cached.per_length)):
        progress(f"reusing cached profile {where}: same device, model and settings, budget within "
                 f"{BUDGET_TOLERANCE_FRACTION:.0%} (--force probes again)")
        return cached
    if problem is None:
        question = BudgetQuestion(budget_bytes=budget_bytes,
                                  fit_budget_bytes=fit_budget_bytes(budget_bytes, request.inter_op_threads),
                                  headroom=request.headroom, multiple=request.multiple, tolerance=request.tolerance)
        answer = budget_answer.answer_at(cached.trials, cached.memory_model, question, cached.max_batch,
                                          cached.safe_batch)
        if isinstance(answer, budget_answer.BudgetAnswer):
            progress(f"reusing cached profile {where}: probed under {format_bytes(cached.budget_bytes)}, its "
                     f"readings answer this smaller budget: {answer.describe()} (--force probes again)")
            return budget_answer.profile_at(cached, answer, question, budget_source)
        problem = answer
    progress(f"not reusing cached profile {where}: {problem}; probing again")
    return None


def _refuse_budget_below_baseline(budget_bytes: int, model_facts: dict, measure: str, device: str) -> None:
    """A budget under what the worker holds before any batch cannot fit one: say so now, not after a whole probe."""
    baseline = model_facts.get(BASELINE_FIELDS[measure])
    if baseline is not None and budget_bytes <= baseline:
        raise UsageError(
            f"memory budget {format_bytes(budget_bytes)} is below what a worker holds on {device} before any batch "
            f"({format_bytes(baseline)} with the model built): raise --memory-budget"
        )


def _per_length_profile(request, name, device, facts: DeviceFacts, fingerprint, key, model_facts, budget_bytes,
                        budget_source, measure, by_length, lengths, probe_seconds) -> DeviceProfile:
    """The profile of a probe per length: the longest length's answer on top, every length in `per_length`."""
    missing = [length for length, (_, max_batch) in by_length.items() if max_batch is None]
    if missing:
        raise ProbeError(
            f"no batch of {request.multiple} or more fits the budget of {format_bytes(budget_bytes)} on {device} "
            f"at {missing[0]} tokens: raise --memory-budget, probe shorter --seq-lens, or lower --multiple"
        )
    fit_budget = fit_budget_bytes(budget_bytes, request.inter_op_threads)
    lengths_summary = per_length.summarise_lengths(by_length, fit_budget, request.headroom, request.multiple)
    longest = max(by_length)
    trials = [trial for length_trials, _ in by_length.values() for trial in length_trials]
    profile = _build_profile(
        request, name, device, facts, fingerprint, key, model_facts, budget_bytes, budget_source, measure,
        by_length[longest][0], by_length[longest][1], probe_seconds, model=lengths_summary.lines[longest],
        seq_lens=lengths,
    )
    return dataclasses.replace(
        profile, trials=tuple(trials), per_length=lengths_summary.per_length, token_model=lengths_summary.token_model
    )


def _build_profile(request, name, device, facts: DeviceFacts, fingerprint, key, model_facts, budget_bytes,
                   budget_source, measure, trials, max_batch, probe_seconds, model=None, seq_lens=None) -> DeviceProfile:
    """The profile of `trials`; `model` (a probe per length: the line at its longest length) replaces their own."""
    model = model if model is not None else summary.memory_model_of(trials)
    fit_budget = fit_budget_bytes(budget_bytes, request.inter_op_threads)
    # One reading of the trials for both: the safe batch stays under the search's answer and under
    # every failure that counts (summary.safe_batch_of), with no fallback of its own.
    safe = summary.safe_batch_of(trials, fit_budget, request.headroom, request.multiple, model, max_batch)
    predicted = model.batch_for_bytes(fit_budget) if model is not None and model.per_sample_bytes > 0 else None
    return DeviceProfile(
        schema_version=SCHEMA_VERSION,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        versions={
            "edgebatch": _version("edgebatch"),
            "tensorflow": model_facts["tensorflow"],
            "keras": _version("keras"),
            "python": platform.python_version(),
            # The packages a TFMOT probe's model came from (package metadata: no import here).
            **({"tf_keras": _version("tf-keras"), "tensorflow_model_optimization": _version("tensorflow-model-optimization")}
               if request.optimize != "none" else {}),
        },
        device={
            "fingerprint": fingerprint,
            "kind": facts.kind,
            "tf_device": device,
            "description": facts.description,
            "cores": facts.cores,
            "memory_total_bytes": facts.memory_total_bytes,
            "memory_limit_bytes": facts.memory_limit_bytes,
            "driver_version": facts.driver_version,
            "compute_capability": facts.compute_capability,
        },
        model={
            "key": key,
            "name": name,
            "config_hash": model_facts["config_hash"],
            "inputs": model_facts["inputs"],
            "precision": request.precision,
            "optimizer": request.optimizer,
            "optimize": request.optimize,
            "parameters": model_facts["parameters"],
            "keras_flavor": model_facts["keras_flavor"],
        },
        budget_bytes=budget_bytes,
        budget_source=budget_source,
        measure=measure,
        headroom=request.headroom,
        max_batch=max_batch,
        safe_batch=safe if safe is not None else request.multiple,  # None only when no fit lies below a failure
        throughput_knee=summary.throughput_knee_of(trials, fit_budget),
        memory_model=model,
        predicted_ceiling=predicted,
        trials=tuple(trials),
        probe_seconds=round(probe_seconds, 2),
        search=request.search_settings(seq_lens),
    )


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _save_model_object(model) -> str:
    import tempfile

    handle, path = tempfile.mkstemp(suffix=".keras", prefix="edgebatch-model-")
    os.close(handle)
    model.save(path)
    return path


def _silent(message: str) -> None:
    del message


__all__ = ["probe", "run_probe", "ProbeRequest"]
