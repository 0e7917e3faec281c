"""`fit`: a custom training loop whose micro-batch a Governor sets, update by update.

This module checks what `fit` is given and builds the loop; the loop itself, and the recipe of one
optimizer update with what it promises (no example lost or counted twice on an OOM, and when that
holds), is governed_loop.py's `_GovernedLoop`. On a MultiWorkerMirroredStrategy worker it is
worker_loop.py's `WorkerLoop`, a subclass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import warnings
import weakref
from typing import Any, Callable

from edgebatch.errors import UsageError
from edgebatch.governor import Governor, GovernorConfig, PressureReader
from edgebatch.training.data import prepare_dataset, refuse_unreplayable_order
from edgebatch.training.fit_sequences import check_sequences
from edgebatch.training.governed_loop import _GovernedLoop
from edgebatch.training.injection import injected_oom_plan
from edgebatch.training.loop_parts import Control, Schedule, Trainee
from edgebatch.training.model_checks import (
    batch_norm_layers,
    is_multi_worker,
    loss_scale_kind,
    mirrored_strategy_of,
    random_layers,
    refuse_unsupported_precision,
)
from edgebatch.training.observability import RunLog
from edgebatch.training.options import Checkpointing, Logs, Sequences, moved_keywords
from edgebatch.training.records import FitReport, UpdateRecord
from edgebatch.training.replicas import check_governor_for_replicas, mirrored_governor_config

__all__ = ["BATCH_NORM_CHOICES", "fit"]

# What fit does with a model that has BatchNormalization layers (see fit's docstring).
BATCH_NORM_CHOICES = ("allow", "fixed_micro_batch", "refuse")

# Models already warned about BatchNormalization (once per model, not per fit call).
_warned_batch_norm: "weakref.WeakSet[Any]" = weakref.WeakSet()


def fit(
    model: Any, dataset: Any, *, loss: Any = None, optimizer: Any = None, effective_batch: int | None = None,
    governor: Governor | None = None, epochs: int = 1, max_updates: int | None = None, callbacks: Any = None,
    on_update: Callable[[UpdateRecord], None] | None = None, pressure_reader: PressureReader | None = None,
    batch_norm: str = "allow", adapt: Any = None, worker_shares: Any = None,
    checkpointing: Checkpointing | None = None, sequences: Sequences | None = None, logs: Logs | None = None,
    **moved: Any,
) -> FitReport:
    """Train `model` on `dataset` with governor-sized micro-batches and gradient accumulation.

    Each update takes `effective_batch` consecutive examples and equals the plain loop's update over
    them, whatever the micro-batch split and OOM retries (docs/training-design.md has the detail:
    strategies, resume, which OOMs can be recovered).

    Args:
        model: a compiled or uncompiled Keras 3 or tf_keras model.
        dataset: tf.data.Dataset of (x, y) examples, consumed in order (a batched one is unbatched).
        loss: a Keras loss object (its reduction becomes the exact mean over the update), a loss
            name, or a callable returning per-example losses; default: what `model.compile` set.
        optimizer: a Keras optimizer; default: what `model.compile` set.
        effective_batch: examples per update (an epoch's last update may take fewer). Give it once:
            here (fit builds the governor) or in `governor` (both still work when they agree; with
            `adapt`, this is where adapt starts).
        governor: an edgebatch.Governor (e.g. Governor.from_profile); used as is unless a
            checkpoint restores it.
        epochs: passes over `dataset`.
        max_updates: stop after this many updates in all.
        callbacks: Keras callbacks, driven as model.fit drives them, one "batch" per update with
            logs {"loss": ...}; one that sets `model.stop_training` stops fit after that update.
        on_update: called with each UpdateRecord.
        pressure_reader: an edgebatch.PressureReader, read once per update; without one the
            governor reacts only to OOMs and to slow steps of fixed-length examples.
        batch_norm: BatchNormalization normalizes each micro-batch by its own statistics: "allow"
            trains anyway and warns once per model, "fixed_micro_batch" keeps the starting
            micro-batch (only an OOM shrinks it), "refuse" raises UsageError.
        adapt: an edgebatch.adapt.AdaptConfig: moves the effective batch from gradient statistics;
            the governor still bounds every micro-batch.
        worker_shares: under MultiWorkerMirroredStrategy, one weight per worker (its share of each
            update, each worker's governor deciding); else shares are even, in lockstep.
        checkpointing: Checkpointing(dir, every_updates, max_to_keep): resume where it stopped.
        sequences: Sequences(length_ceilings, batch_unit, length_window_examples) for
            variable-length examples.
        logs: Logs(log_dir, decision_log).
        **moved: the old keywords these records replaced (checkpoint_dir, ...): still work, warn once.

    Returns:
        FitReport of this call: its updates, examples seen, OOM events and exactness.

    Raises:
        UsageError: a bad argument (effective_batch given twice and differing, a strategy other
            than Mirrored or MultiWorkerMirrored, a record field out of range, ...).

    Example (runs in tests/test_docstring_examples.py):
        >>> import edgebatch, keras, numpy as np, tensorflow as tf
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        >>> model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> data = tf.data.Dataset.from_tensor_slices((np.ones((64, 4), "float32"), np.zeros(64, "int64")))
        >>> report = edgebatch.fit(model, data, effective_batch=16)
        >>> len(report.updates), report.examples_seen
        (4, 64)
    """
    return _run(_planned(_FitArguments(**locals())))  # first statement: locals() is exactly fit's arguments


@dataclasses.dataclass(frozen=True)
class _FitArguments:
    """fit's arguments as given (fit's docstring says what each is)."""

    model: Any
    dataset: Any
    loss: Any
    optimizer: Any
    effective_batch: int | None
    governor: Governor | None
    epochs: int
    max_updates: int | None
    callbacks: Any
    on_update: Callable[[UpdateRecord], None] | None
    pressure_reader: PressureReader | None
    batch_norm: str
    adapt: Any
    worker_shares: Any
    checkpointing: Checkpointing | None
    sequences: Sequences | None
    logs: Logs | None
    moved: dict


@dataclasses.dataclass(frozen=True)
class _FitPlan:
    """What fit checked and resolved before training: the loop is built from this."""

    given: _FitArguments
    effective_batch: int
    loss: Any
    optimizer: Any
    strategy: Any
    replicas: int
    multi_worker: bool
    dataset: Any
    element_spec: Any
    unbatched: bool
    governor: Governor
    checkpointing: Checkpointing | None
    sequences: Sequences
    logs: Logs
    normalizers: list[str]


def _planned(given: _FitArguments) -> _FitPlan:
    """Check fit's arguments where they enter and resolve the defaults (UsageError on bad input)."""
    checkpointing, sequences, logs = _check_records(
        *moved_keywords(given.moved, given.checkpointing, given.sequences, given.logs, calls_below_fit=1))
    effective_batch = _effective_batch(given.effective_batch, given.governor)
    _check_arguments(effective_batch, given.epochs, given.max_updates, given.on_update, given.batch_norm, checkpointing)
    loss, optimizer = _compiled_defaults(given.model, given.loss, given.optimizer)
    strategy = mirrored_strategy_of(given.model, optimizer)
    replicas = 1 if strategy is None else int(strategy.num_replicas_in_sync)
    multi_worker = strategy is not None and is_multi_worker(strategy)
    _check_multi_worker(multi_worker, given, checkpointing, optimizer)
    dataset, element_spec, unbatched = prepare_dataset(given.dataset, given.model)
    sequences = check_sequences(sequences, effective_batch, element_spec, given.adapt, strategy)
    if checkpointing is not None:
        refuse_unreplayable_order(dataset)
    normalizers = _check_batch_norm(given.model, given.batch_norm)
    governor = _governor_for(given.governor, effective_batch, replicas, multi_worker, given.adapt, sequences)
    if given.adapt is not None:
        from edgebatch.training.adaptive import check_adapt  # numpy: imported only when asked

        check_adapt(given.adapt, governor.config, replicas, given.batch_norm)
    refuse_unsupported_precision(given.model, optimizer, strategy)
    injected_oom_plan()  # a malformed EDGEBATCH_INJECT_OOM fails now, before any work
    return _FitPlan(given, effective_batch, loss, optimizer, strategy, replicas, multi_worker, dataset, element_spec,
                    unbatched, governor, checkpointing, sequences, logs, normalizers)


def _run(plan: _FitPlan) -> FitReport:
    """Build the loop for `plan` and train. Under a strategy everything runs in its scope: optimizer
    slots, accumulators and restored variables are then the strategy's (mirrored) ones."""
    given = plan.given
    with plan.strategy.scope() if plan.strategy is not None else contextlib.nullcontext():
        _build_optimizer(plan.optimizer, given.model.trainable_variables)
        loop_class, extra = _GovernedLoop, {}
        if plan.multi_worker:
            from edgebatch.training.worker_loop import WorkerLoop
            from edgebatch.training.workers import WorkerGroup

            loop_class, extra = WorkerLoop, {"workers": WorkerGroup(plan.strategy, given.worker_shares)}
        loop = loop_class(
            **extra,
            trainee=Trainee(given.model, plan.dataset, plan.element_spec, plan.loss, plan.optimizer, plan.strategy),
            schedule=Schedule(given.epochs, RunLog(plan.logs.log_dir, plan.logs.decision_log), given.max_updates,
                              given.on_update, _callback_list(given.model, given.callbacks, given.epochs)),
            control=Control(plan.governor, given.pressure_reader,
                            fixed_micro_batch=given.batch_norm == "fixed_micro_batch",
                            adaptive=None if given.adapt is None else _adaptive_batch(given.adapt, plan.effective_batch)),
            checkpointing=plan.checkpointing, sequences=plan.sequences,
        )
        _fill_report(loop.report, given.model, plan.normalizers, given.batch_norm, plan.unbatched, plan.replicas)
        return loop.run()


def _fill_report(report: FitReport, model: Any, normalizers: list[str], batch_norm: str, unbatched: bool,
                 replicas: int) -> None:
    """What fit found before training, in the FitReport."""
    report.batch_norm_layers = normalizers
    report.batch_norm = batch_norm
    report.random_layers = random_layers(model)
    report.exactness = _exactness(normalizers, report.random_layers)
    report.unbatched_input = unbatched
    report.replicas = replicas


def _check_records(checkpointing: Any, sequences: Any, logs: Any) -> tuple[Any, Sequences, Logs]:
    """fit's records, the defaults filled in; UsageError for anything else in their place."""
    for name, value, kind in (("checkpointing", checkpointing, Checkpointing), ("sequences", sequences, Sequences),
                              ("logs", logs, Logs)):
        if value is not None and not isinstance(value, kind):
            raise UsageError(f"{name} must be an edgebatch.training.{kind.__name__}, got {value!r}")
    return checkpointing, sequences or Sequences(), logs or Logs()


def _check_multi_worker(multi_worker: bool, given: _FitArguments, checkpointing: Checkpointing | None,
                        optimizer: Any) -> None:
    """UsageError, one line with the reason, for what fit cannot run under MultiWorkerMirroredStrategy."""
    if given.worker_shares is not None and not multi_worker:
        raise UsageError("worker_shares applies only under tf.distribute.MultiWorkerMirroredStrategy")
    if not multi_worker:
        return
    if checkpointing is not None:
        raise UsageError("checkpointing (checkpoint_dir) is not supported under MultiWorkerMirroredStrategy yet: drop it")
    if given.adapt is not None:
        raise UsageError(
            "adapt=... is not supported under MultiWorkerMirroredStrategy yet: its decisions come from each "
            "process's own gradient statistics, and fit has no step that makes every worker take the same one; "
            "drop adapt, or train on one worker"
        )
    if loss_scale_kind(optimizer) is not None:
        raise UsageError(
            f"loss scaling ({type(optimizer).__name__}) is not supported under MultiWorkerMirroredStrategy yet: "
            "fit's exact accumulation with a dynamic loss scale is checked on one device only; use "
            "mixed_bfloat16 (no loss scaling), or train on one worker"
        )


def _effective_batch(effective_batch: Any, governor: Any) -> Any:
    """fit's effective_batch, or the given governor's when fit was not given one."""
    if effective_batch is not None:
        return effective_batch
    if governor is None:
        raise UsageError("fit needs effective_batch=... (examples per optimizer update) or a governor=... built for it")
    if not isinstance(governor, Governor):
        raise UsageError(f"governor must be an edgebatch.governor.Governor, got {governor!r}")
    return governor.config.effective_batch


def _governor_for(governor: Governor | None, effective_batch: int, replicas: int, multi_worker: bool, adapt: Any,
                  sequences: Sequences) -> Governor:
    """The given governor, checked against fit's other settings, or the default one for them."""
    if governor is None and replicas > 1 and not multi_worker:
        governor = Governor(mirrored_governor_config(effective_batch, replicas))
    elif governor is None:
        ceiling = effective_batch if sequences.length_ceilings is None else sequences.length_ceilings.reference_ceiling
        governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=effective_batch))
    elif not isinstance(governor, Governor):
        raise UsageError(f"governor must be an edgebatch.governor.Governor, got {governor!r}")
    elif adapt is not None and governor.config.effective_batch < effective_batch:
        raise UsageError(
            f"effective_batch {effective_batch!r} is above the governor's config.effective_batch "
            f"{governor.config.effective_batch!r}: with adapt, build the governor for at least the starting batch"
        )
    elif adapt is None and governor.config.effective_batch != effective_batch:
        raise UsageError(
            f"effective_batch {effective_batch!r} differs from the governor's "
            f"config.effective_batch {governor.config.effective_batch!r}: give it once, in the governor "
            "(leave fit's effective_batch out)"
        )
    # Both cut updates by a rule of their own, so the governor may not move the effective batch.
    for option, why in (("batch_unit='tokens'", sequences.batch_unit == "tokens"
                         and "an elastic effective batch counts examples"),
                        ("length_window_examples", sequences.length_window_examples is not None
                         and "a window is cut into updates of one size when it is read")):
        if why and governor.config.mode != "fixed":
            raise UsageError(f"{option} needs a governor in mode 'fixed': {why}")
    problem = None if multi_worker else check_governor_for_replicas(governor.config, replicas)
    if problem is not None:
        raise UsageError(problem)
    return governor


def _adaptive_batch(adapt: Any, effective_batch: int) -> Any:
    from edgebatch.training.adaptive import AdaptiveBatch

    return AdaptiveBatch(adapt, effective_batch)


def _check_arguments(effective_batch: Any, epochs: Any, max_updates: Any, on_update: Any, batch_norm: Any,
                     checkpointing: Checkpointing | None) -> None:
    every, keep = (None, 3) if checkpointing is None else (checkpointing.every_updates, checkpointing.max_to_keep)
    for name, value, optional in (
        ("effective_batch", effective_batch, False),
        ("epochs", epochs, False),
        ("checkpointing.every_updates", every, True),
        ("max_updates", max_updates, True),
        ("checkpointing.max_to_keep", keep, False),
    ):
        if optional and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise UsageError(f"{name} must be an integer >= 1, got {value!r}")
    if on_update is not None and not callable(on_update):
        raise UsageError(f"on_update must be callable, got {on_update!r}")
    if batch_norm not in BATCH_NORM_CHOICES:
        raise UsageError(f"batch_norm must be one of {', '.join(BATCH_NORM_CHOICES)}, got {batch_norm!r}")


def _keras_world(model: Any) -> Any:
    """The Keras module (Keras 3 or tf_keras) the model belongs to."""
    import sys

    import keras

    tf_keras = sys.modules.get("tf_keras")  # a tf_keras model means tf_keras is already imported
    if tf_keras is not None and isinstance(model, tf_keras.Model):
        return tf_keras
    return keras


def _compiled_defaults(model: Any, loss: Any, optimizer: Any) -> tuple[Any, Any]:
    """(loss, optimizer): the given ones, else what `model.compile` set; loss names resolved."""
    if loss is None:
        loss = getattr(model, "loss", None)
        if loss is None or loss == {}:  # Keras 3 keeps {} for a model compiled without a loss
            raise UsageError(
                f"fit needs loss=... or a model compiled with a loss, got neither for model {getattr(model, 'name', model)!r}"
            )
    if isinstance(loss, (list, tuple, dict)):
        raise UsageError(f"fit supports one loss for a single-output model, got {loss!r}")
    if isinstance(loss, str):
        try:
            loss = _keras_world(model).losses.get(loss)
        except ValueError as exc:
            raise UsageError(f"unknown loss name {loss!r}: pass a Keras loss object") from exc
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise UsageError(
                f"fit needs optimizer=... or a compiled model, got neither for model {getattr(model, 'name', model)!r}"
            )
    return loss, optimizer


def _exactness(normalizers: list[str], randomized: list[str]) -> str:
    """What a governed update equals (FitReport.exactness)."""
    if normalizers:
        return "micro_batch_statistics"
    if randomized:
        return "random_draws_per_micro_batch"
    return "exact"


def _check_batch_norm(model: Any, batch_norm: str) -> list[str]:
    """The model's BatchNormalization layer names; refuse or warn (once per model) per `batch_norm`."""
    names = batch_norm_layers(model)
    if not names:
        return names
    shown = _short_list(names)
    if batch_norm == "refuse":
        raise UsageError(
            f"model has layers that use each micro-batch's own statistics {shown} (BatchNormalization, or "
            "TFMOT quantize wrappers' activation ranges; the split changes the result): pass "
            "batch_norm='fixed_micro_batch' or 'allow'"
        )
    if batch_norm == "allow" and model not in _warned_batch_norm:
        _warned_batch_norm.add(model)
        warnings.warn(
            f"edgebatch fit: layers {shown} (BatchNormalization, or TFMOT quantize wrappers) use each "
            "micro-batch's own statistics, "
            "so updates equal whole-batch ones only up to those statistics and change with the governor's "
            "micro-batch; pass batch_norm='fixed_micro_batch' to keep the micro-batch fixed",
            stacklevel=3,
        )
    return names


def _short_list(names: list[str], shown: int = 4) -> str:
    """['a', 'b', 'c', 'd'] and 150 more: a message stays one readable line (a QAT MobileNetV2 has 200)."""
    text = repr(names[:shown])
    return text if len(names) <= shown else f"{text} and {len(names) - shown} more"


def _callback_list(model: Any, callbacks: Any, epochs: int) -> Any:
    """A Keras CallbackList for `callbacks` (None when there are none)."""
    if callbacks is None:
        return None
    world = _keras_world(model)
    if isinstance(callbacks, world.callbacks.CallbackList):
        return callbacks
    if isinstance(callbacks, world.callbacks.Callback):
        callbacks = [callbacks]
    if not isinstance(callbacks, (list, tuple)):
        raise UsageError(f"callbacks must be a list of {world.__name__}.callbacks.Callback objects, got {callbacks!r}")
    callbacks = list(callbacks)
    for callback in callbacks:
        if not isinstance(callback, world.callbacks.Callback):
            raise UsageError(f"callbacks must be {world.__name__}.callbacks.Callback objects, got {callback!r}")
    if not callbacks:
        return None
    return world.callbacks.CallbackList(callbacks, add_history=False, add_progbar=False, model=model,
                                        epochs=epochs, verbose=0)


def _build_optimizer(optimizer: Any, variables: list) -> None:
    """Create the optimizer's slots now: before a checkpoint restores them, outside tf.function."""
    if not callable(getattr(optimizer, "build", None)):
        return  # tf_keras legacy optimizers create slots on first use (apply_step then traces twice)
    # Keras 3 says `built`; tf_keras sets `_built` in build() (and returns early when it is set).
    if not getattr(optimizer, "built", getattr(optimizer, "_built", False)):
        optimizer.build(variables)
