"""`edgebatch.probe(...)`: find a device's safe batch ceiling for a model and cache it.

The recipe (run_probe): resolve the device and budget; start a scout worker (it builds the model
and traces the step); look for a cached profile as soon as the scout says what the model is
(before its trace, which a reused profile does not wait for); run the search (search.py decides,
run_search.py runs it in workers, fresh_workers.py starts them); build the profile
(build_profile.py); write it atomically. The parent process never imports TensorFlow, so its own
memory stays out of the measurement and a crashing trial cannot take the probe down.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from edgebatch.errors import ProbeError, UsageError
from edgebatch.settings.malloc_arenas import malloc_arena_max_in_effect
from edgebatch.probing import budget_answer, per_length, token_fit
from edgebatch.probing.budget import (
    Budget,
    DeviceFacts,
    default_device,
    device_facts,
    probe_budget,
    with_worker_gpu_details,
)
from edgebatch.probing.build_profile import profile_of
from edgebatch.probing.fresh_workers import REPEAT_STEPS, FreshWorkers, spare_setup
from edgebatch.probing.margins import DEFAULT_HEADROOM, bump_edge_fraction
from edgebatch.probing.outcomes import ANSWER_READINGS, DEFAULT_MAX_BATCH_LIMIT, DEFAULT_START_BATCH, DEFAULT_TOLERANCE
from edgebatch.probing.probe_run import ProbeRun
from edgebatch.probing.readings import Progress
from edgebatch.probing.reuse import BUDGET_TOLERANCE_FRACTION, answered_from_readings, reuse_problem, safe_rule_matches
from edgebatch.probing.run_search import run_search
from edgebatch.probing.search import SLOW_START, Finder, SearchConfig
from edgebatch.probing.squeeze import RoomWatch, host_room_with_workers
from edgebatch.probing.strategy_option import check_strategy, deprecated_strategy
from edgebatch.probing.worker import (
    DEFAULT_INTER_OP_THREADS,
    DEFAULT_STEPS_PER_TRIAL,
    DEFAULT_TRIAL_SECONDS,
    Worker,
    WorkerSetup,
    await_identity,
    await_ready,
    spawn_worker,
)
from edgebatch.profiles import DeviceProfile, find_profile, model_key, resolve_profiles_dir, save_profile
from edgebatch.settings.threads import checked_inter_op_threads
from edgebatch.units import format_bytes
from edgebatch.models.zoo import OPTIMIZATIONS, OPTIMIZERS, PRECISIONS, ModelSpec, keras_flavor, parse_model_spec


@dataclass(frozen=True, kw_only=True)
class ProbeRequest:
    """What a probe is asked. The CLI reads every default from here; the search's and the trial's
    come from their owners (outcomes.py, worker.py, margins.py); the rest are owned here.

    `max_batch_limit` is the largest batch the search may try; `max_batch` is only ever the answer.
    `allow_overcommit` accepts an explicit budget above what the device can give now.
    `optimize` ("qat", "prune") probes the model wrapped by TFMOT; the worker builds it as a tf_keras
    model and is the only process that imports tensorflow_model_optimization (models/zoo.py).
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
    headroom: float = DEFAULT_HEADROOM
    steps_per_trial: int = DEFAULT_STEPS_PER_TRIAL
    trial_seconds: float = DEFAULT_TRIAL_SECONDS
    # TensorFlow inter-op threads in the workers (0: TensorFlow's own pool); see worker.DEFAULT_INTER_OP_THREADS.
    inter_op_threads: int = DEFAULT_INTER_OP_THREADS
    # Fresh readings of the answer before slow_start gives it (outcomes.ANSWER_READINGS).
    answer_readings: int = ANSWER_READINGS
    # How close the search brackets the edge, as a share of the answer (outcomes.DEFAULT_TOLERANCE).
    tolerance: float = DEFAULT_TOLERANCE
    strategy: str = SLOW_START.name  # the search the profile records (run_probe's finder); deprecated as an option
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
            # The workers inherit this process's environment (edgebatch/settings/malloc_arenas.py).
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
        check_strategy(self.strategy, f"strategy={self.strategy!r}")


def probe(
    model="mobilenet_v2",
    *,
    profiles_dir: str | Path | None = None,
    force: bool = False,
    save: bool = True,
    progress: Progress | None = None,
    **options,
) -> DeviceProfile:
    """Probe the largest safe training batch of `model` on a device and return its DeviceProfile.

    The answer holds for training run the same way: same device, model, precision and optimizer,
    and the same TensorFlow inter-op threads (default 1: edgebatch.set_inter_op_threads). A model
    with a variable sequence axis (transformer_tiny, lstm_small, your own with an input of shape
    (None,)) is probed per length (`seq_lens`; the profile's `per_length` and `token_model`).

    Args:
        model: a built-in name, "FILE.py:FUNCTION", a ".keras" path, or a Keras model object.
        profiles_dir: where profiles are cached (default $EDGEBATCH_PROFILES or ./device_profiles);
            a local folder or an fsspec URL.
        force: probe even where a cached profile answers this request.
        save: write the new profile to `profiles_dir`.
        progress: called with each line of progress (a trial, the time left, why a cached profile
            was or was not reused); default: silent.
        **options: ProbeRequest's fields, with its defaults: device, memory_budget ("1.5GiB",
            bytes; default: what the device can give now), allow_overcommit, precision, optimizer,
            optimize ("qat", "prune"), start, max_batch_limit, multiple, headroom, steps_per_trial,
            trial_seconds, inter_op_threads, answer_readings, tolerance, worker_address_space_headroom_bytes,
            seq_lens; `strategy` is deprecated ("slow_start" warns, any other name is a UsageError).

    Returns:
        The DeviceProfile: `max_batch`, `safe_batch` (the one to train with), the memory line and
        every trial (device_profiles/README.md). A cached one is returned, unless `force`, where
        it answers this request: same device and model key, the same settings that change the
        answer, and a budget up to 3% above the profile's or any below it, answered from its
        readings (probing/reuse.py, probing/budget_answer.py).

    Raises:
        UsageError: a bad option (unknown name, a unit-less budget under 1 MiB, a budget above what
            the device can give without allow_overcommit, ...).
        ProbeError: the probe could not finish (no batch fits, a worker failed, memory was taken
            from outside while a trial failed).

    Example (runs in tests/test_docstring_examples.py):
        >>> import tempfile
        >>> from edgebatch import probe
        >>> profile = probe("mlp", memory_budget="1GiB", max_batch_limit=32, answer_readings=1,
        ...                 profiles_dir=tempfile.mkdtemp())
        >>> profile.max_batch, profile.safe_batch <= profile.max_batch
        (32, True)
    """
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(ProbeRequest)})
    if unknown:
        raise UsageError(f"unknown probe option(s) {', '.join(unknown)}: see edgebatch.probing.ProbeRequest")
    if "strategy" in options:  # the probe has one search: any other is refused (strategy_option.py)
        deprecated_strategy(options.pop("strategy"))
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


@dataclass(frozen=True, kw_only=True)
class ProbePlan:
    """A request as resolved before any worker starts: the model spec, lengths, device, budget,
    the search's config and the workers' setup (the scout's: the first length a probe per length searches)."""

    request: ProbeRequest
    spec: ModelSpec
    lengths: tuple[int, ...] | None
    device: str
    facts: DeviceFacts
    budget: Budget
    config: SearchConfig
    setup: WorkerSetup


def run_probe(request: ProbeRequest, *, profiles_dir=None, force=False, save=True, progress: Progress = print,
              finder: Finder = SLOW_START) -> DeviceProfile:
    """probe() for a built ProbeRequest: the recipe in the module's docstring, step by step. Workers
    are closed at once on an error or a stop, the fork server after its children; nothing is saved
    unless the probe finished. `finder` decides the search's steps (default: the probe's own; the
    benchmark passes the peers', tools/bench/finders.py), and the profile records its name."""
    request.validate()
    request = dataclasses.replace(request, strategy=finder.name)
    plan = _plan(request)
    started = time.monotonic()
    progress(f"probing {plan.spec.text} on {plan.device} ({plan.facts.description}), "
             f"budget {format_bytes(plan.budget.bytes)} ({plan.budget.source})")
    scout = spawn_worker(plan.setup)
    workers: list[Worker] = [scout]
    fork: FreshWorkers | None = None
    at_once = False
    try:
        # What the model is, as soon as the scout has built it: a cached profile is found (or not)
        # without waiting for the trace, which takes most of a large model's start-up.
        run = _identified(plan, await_identity(scout), profiles_dir)
        reused = None if force else _cached_answer(run, progress)
        if reused is not None:
            at_once = True  # the scout is still tracing a step no trial will use
            return reused
        run = _ready(run, await_ready(scout).facts, progress)
        # What one-shot estimators start from: the worker's memory before any trial batch.
        config = dataclasses.replace(plan.config, baseline_bytes=run.baseline_bytes)
        fork = FreshWorkers(run.device, run.budget.bytes, progress)
        found = _searched(run, config, plan.setup, workers, fork, progress, finder)
    except BaseException:
        # Ctrl-C, SIGTERM or an error: a worker in the middle of a trial is killed, not waited for.
        at_once = True
        raise
    finally:
        for worker in workers:
            worker.close(at_once=at_once)
        if fork is not None:
            fork.close()  # after its children: they die with it
    profile = profile_of(run, found, time.monotonic() - started)
    if save:
        path = save_profile(profile, run.directory)
        progress(f"saved {path}")
    return profile


def _plan(request: ProbeRequest) -> ProbePlan:
    """What `request` asks of which device and budget, checked before any worker starts."""
    spec = parse_model_spec(request.model)
    lengths = per_length.resolve_lengths(spec, request.seq_lens)
    device = (request.device or default_device()).upper()
    facts = device_facts(device)
    budget = probe_budget(device, request.memory_budget, request.allow_overcommit, request.inter_op_threads)
    config = SearchConfig(
        budget_bytes=budget.fit_bytes,
        start_batch=request.start,
        max_batch_limit=request.max_batch_limit,
        multiple=request.multiple,
        tolerance=request.tolerance,
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
    return ProbePlan(request=request, spec=spec, lengths=lengths, device=device, facts=facts, budget=budget,
                     config=config, setup=setup)


def _identified(plan: ProbePlan, identity: dict, profiles_dir) -> ProbeRun:
    """The probe's record from the scout's identity message: the model's name and key, the device's facts."""
    request = plan.request
    facts = with_worker_gpu_details(plan.facts, identity.get("gpu"))
    # Built-ins are known by their name; a user's function or file by the model's own name.
    name = plan.spec.name if plan.spec.kind == "builtin" else identity["name"]
    per_length.check_sequence_axis(name, plan.lengths, identity.get("variable_sequence_axis", False))
    key = model_key(
        name,
        identity["config_hash"],
        identity["inputs"],
        request.precision,
        request.optimizer,
        identity["tensorflow"],
        optimize=request.optimize,
        seq_lens=plan.lengths,
    )
    return ProbeRun(request=request, lengths=plan.lengths, device=plan.device, facts=facts, budget=plan.budget,
                    fingerprint=facts.fingerprint, directory=resolve_profiles_dir(profiles_dir), name=name, key=key)


def _cached_answer(run: ProbeRun, progress: Progress) -> DeviceProfile | None:
    """The cached profile's answer to this probe (_reused), or None, saying why it probes."""
    cached = find_profile(run.directory, run.fingerprint, run.key)
    if cached is None:
        progress(f"no cached profile for this device and model in {run.directory}; probing")
        return None
    return _reused(cached, run, progress)


def _ready(run: ProbeRun, model_facts: dict, progress: Progress) -> ProbeRun:
    """`run` with the ready scout's facts, checked: the inter-op threads asked for, a budget above
    what the worker holds before any batch. Says what the model is."""
    run = dataclasses.replace(run, model_facts=model_facts)
    # The worker says what its trials measure (worker.measure_of) and, on a GPU NVML does not
    # see, what TensorFlow calls it.
    if model_facts.get("inter_op_threads") != run.request.inter_op_threads:
        raise ProbeError(
            f"the probe's worker runs {model_facts.get('inter_op_threads')} TensorFlow inter-op threads where "
            f"{run.request.inter_op_threads} were asked for: "
            "its readings would not describe the setting the profile records"
        )
    _refuse_budget_below_baseline(run)
    optimized = "" if run.request.optimize == "none" else f", TFMOT {run.request.optimize}"
    progress(f"model {model_facts['name']}: {model_facts['parameters']:,} parameters, "
             f"{model_facts['keras_flavor']}{optimized}")
    return run


def _refuse_budget_below_baseline(run: ProbeRun) -> None:
    """A budget under what the worker holds before any batch cannot fit one: say so now, not after a whole probe."""
    baseline = run.baseline_bytes
    if baseline is not None and run.budget.bytes <= baseline:
        raise UsageError(
            f"memory budget {format_bytes(run.budget.bytes)} is below what a worker holds on {run.device} "
            f"before any batch ({format_bytes(baseline)} with the model built): raise --memory-budget"
        )


def _searched(run: ProbeRun, config: SearchConfig, setup: WorkerSetup, workers: list[Worker], fork: FreshWorkers,
              progress: Progress, finder: Finder):
    """The search's results (per length: per_length.search_lengths'; else run_search's (trials,
    Done)); a ProbeError where its failures met a host squeezed by others (squeeze.py)."""
    if not run.lengths:
        fork.start_spares(spare_setup(setup, config, fork), run.baseline_bytes)
    # An overcommitted budget is above the room by the user's choice: failures there are theirs to judge.
    watch = RoomWatch(None if run.request.allow_overcommit else host_room_with_workers(run.device))
    search = functools.partial(run_search, workers=workers, measure=run.measure, progress=progress, fork=fork,
                               watch=watch, finder=finder)
    if run.lengths:
        found = per_length.search_lengths(run.lengths, config, setup, workers, progress, search)
    else:
        found = search(config, setup)
    squeezed = watch.problem(run.budget.bytes)
    if squeezed is not None:
        raise ProbeError(squeezed)
    return found


def _reuse_problem(cached: DeviceProfile, run: ProbeRun) -> str | None:
    return reuse_problem(
        cached_search=cached.search,
        cached_headroom=cached.headroom,
        cached_budget_bytes=cached.budget_bytes,
        requested_search=run.request.search_settings(run.lengths),
        requested_headroom=run.request.headroom,
        requested_budget_bytes=run.budget.bytes,
        cached_per_length=bool(cached.per_length),
    )


def _reused(cached: DeviceProfile, run: ProbeRun, progress: Progress) -> DeviceProfile | None:
    """The cached profile's answer to the probe (as it stands, or read from its readings at a
    smaller budget or another safe-batch rule), saying so in one line; None, with the reason, where
    it has none."""
    request, budget = run.request, run.budget
    where = run.directory / cached.path_name
    problem = _reuse_problem(cached, run)
    same_rule = safe_rule_matches(cached.schema_version, cached.headroom, request.headroom)
    if problem is None and not answered_from_readings(cached.budget_bytes, budget.bytes, bool(cached.per_length),
                                                      same_rule):
        progress(f"reusing cached profile {where}: same device, model and settings, budget within "
                 f"{BUDGET_TOLERANCE_FRACTION:.0%} (--force probes again)")
        return cached
    if problem is None:
        question = budget_answer.question_at(cached.budget_bytes, budget.bytes, budget.fit_bytes,
                                             headroom=request.headroom, multiple=request.multiple,
                                             tolerance=request.tolerance)
        answer = budget_answer.answer_at(cached.trials, cached.memory_model, question, cached.max_batch,
                                          cached.safe_batch if same_rule else None)
        if isinstance(answer, budget_answer.BudgetAnswer):
            progress(f"reusing cached profile {where}: {budget_answer.why_read_again(cached, question)}: "
                     f"{answer.describe()} (--force probes again)")
            return budget_answer.profile_at(cached, answer, question, budget.source)
        problem = answer
    progress(f"not reusing cached profile {where}: {problem}; probing again")
    return None


def _save_model_object(model) -> str:
    import tempfile

    handle, path = tempfile.mkstemp(suffix=".keras", prefix="edgebatch-model-")
    os.close(handle)
    model.save(path)
    return path


def _silent(message: str) -> None:
    del message


# REPEAT_STEPS is read from here by tools/bench (spare_check.py); it lives in fresh_workers.py.
__all__ = ["REPEAT_STEPS", "ProbeRequest", "probe", "run_probe"]
