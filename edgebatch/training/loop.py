"""`fit`: a custom training loop whose micro-batch a Governor sets, update by update.

Recipe of one optimizer update (see `_GovernedLoop._run_update`):
1. take the next `decision.effective_batch` examples of the epoch (fewer at its end);
2. split them into micro-batches of the governor's size (`split_micro_batches`) and run the
   accumulating micro-step on each (steps.py: exact mean-loss gradients whatever the split);
3. on ResourceExhaustedError (real, or injected by injection.py) tell the governor
   (`on_oom(size)`), and re-split what is left of the update, starting with the failed examples,
   at the governor's new size; gradients already accumulated stay (a failed micro-step adds
   nothing), so no example is lost or counted twice; if the governor cannot shrink any more, save
   a checkpoint (when a directory is given) and raise TrainingError;
4. apply the accumulated gradients once, read memory pressure, let the governor observe the
   update, log it, and checkpoint when due.

Resume: with `checkpoint_dir` holding a checkpoint, fit restores model (every variable: weights,
BatchNormalization statistics, Keras 3 SeedGenerator states), the global tf.random.Generator's
state, optimizer, governor and the data position and continues at the next unprocessed example
(`dataset.skip`, which re-reads the epoch up to there), ending with the weights of an uninterrupted
run, provided the dataset yields the same order in every epoch and every process: a shuffle that
reshuffles each iteration or has no seed, and an unseeded random op, are refused (data.py; a random
order made where the graph does not show it, e.g. in a Python generator, is the caller's to keep
fixed). `epochs` and `max_updates` count the whole run, including what the checkpoint already did.

Exactness: each update's gradient is the mean over the whole effective batch whatever the split
(steps.py), except with BatchNormalization, which normalizes each micro-batch by its own
statistics (fit's `batch_norm` option and FitReport.exactness), and random layers (Dropout), which
draw masks per micro-step: a split update draws other, equally distributed masks than one step
over the whole batch (exactness "random_draws_per_micro_batch"). With seeded layers a run is
reproducible for a given sequence of splits.

MirroredStrategy (replicas.py, steps.py): with the model (and optimizer) built under
`tf.distribute.MirroredStrategy().scope()`, fit trains on all replicas; call it inside or outside
the scope. The governor's micro-batch is the GLOBAL micro-batch: it decides once per update in
Python, so every replica applies the same decision, and its sizes are multiples of the replica
count (GovernorConfig multiple and min_batch; the default governor is `mirrored_governor_config`,
whose ceiling is the effective batch rounded down to a multiple; a given governor that allows other
sizes is refused). Each micro-step runs every replica on an even share of the piece (only an
update's last piece can be uneven: shares differ by one); each replica adds sum(its losses) /
update_examples to its own accumulators and the optimizer sums them across replicas once per
update, so the update equals the plain loop's mean over the update as above. Per-replica shares are
at most ceiling / replicas: pass the smallest device's ceiling times the replica count
(`replicas.global_ceiling`); unequal shares for unequal devices are not supported. An OOM in any
replica fails the whole micro-step (no replica adds anything: the accumulator updates wait for a
scalar all-reduce of every replica's readiness) and the retry shrinks all replicas together;
injected OOMs (injection.py) fail the last replica's step with a real allocation failure inside
its graph (which takes ~10 s on CPU: TensorFlow's allocator waits for memory before it gives up).
Checkpoints hold the mirrored variables and resume as above. BatchNormalization under a strategy
normalizes each replica's share by its own statistics (the per-replica batch is the global piece /
replicas), so it is further from the plain loop than without one; fit's batch_norm options apply
unchanged. Layers that synchronise statistics across replicas (BatchNormalization(synchronized=True),
tf_keras SyncBatchNormalization) use the global piece's statistics; fit treats them like any
BatchNormalization (untested). Tested on two logical CPU devices; multi-GPU runs (NCCL all-reduce)
are not tested here.

MultiWorkerMirroredStrategy (workers.py, worker_loop.py): one device per worker process; each
worker trains its share of every update (even, or `worker_shares`) with local accumulation and
local OOM retries, and the workers exchange one small status per update before the optimizer's
all-reduce; decisions are lockstep (worst pressure wins) without `worker_shares`, each worker's
own with them. Updates equal the plain loop's (tests/test_training_multi_worker.py).

Adaptive batch (`adapt=AdaptConfig(...)`, adaptive.py, edgebatch/adapt/): the statistical policy
sets each update's effective batch (starting at `effective_batch`) from the gradient noise scale,
direction agreement between updates, loss plateaus, the LR schedule's phase and drift, and the
LR multiplier for it (config.lr_rule); the governor (mode "fixed") still sets the micro-batch, and
each update is split into at least config.min_pieces_per_update pieces (so every update measures
the noise scale) of at most the governor's size. Growth above the governor's ceiling is reached
by accumulation, and the governor's micro-batch never exceeds min(its ceiling, its
config.effective_batch): build it with config.effective_batch >= the largest batch you allow the
policy (adapt's max_effective_batch_samples) to let micro-batches grow with it. Each update is
still exactly the plain loop's step over its examples (the split does not matter, as above), so
an adaptive run equals a plain loop fed the same sequence of batch sizes and rates
(tests/test_training_adapt.py). Costs: one more copy of the trainable variables (the previous
update's gradient), a few reductions per piece and one small host read per update. A checkpoint
holds the controller and that copy, so a resumed run decides as an uninterrupted one. Not under
MirroredStrategy. With variable-length examples every update is sorted by length before it is
split (sequences.py), so its pieces are not independent draws: each piece's mean gradient is
that of its own lengths, and the noise scale's small-batch norm counts the difference between
lengths as noise too (not measured; the controller's other signals do not use the pieces). With
`length_ceilings` the pieces are cut by length and capped by adapt's piece bound in examples, and
the decision's micro-batch and accumulation in the logs are in the governor's units (examples at
the shortest probed length), not the pieces' sizes, which UpdateRecord.micro_batches gives.

TFMOT models (tf_keras): a pruned model (prune_low_magnitude) advances its pruning schedule once
per optimizer update, as the plain loop with UpdatePruningStep does, whatever the split (pruning.py;
no callback needed), and its updates are exact. A quantization-aware model (quantize_model) tracks
activation ranges from each micro-batch in its forward pass, so, like BatchNormalization, it is
listed in FitReport.batch_norm_layers and its exactness is "micro_batch_statistics".

Only OOMs that TensorFlow raises can be recovered. On CPU with TensorFlow's default oneDNN kernels,
running out of address space can crash the process instead (docs/tensorflow-memory.md, "oneDNN
convolutions can crash"; the RLIMIT_AS test runs with TF_ENABLE_ONEDNN_OPTS=0 for that reason), and
a cgroup memory limit SIGKILLs it; for those, checkpoints are the recovery. Layers that write state
in the forward pass (BatchNormalization's moving statistics, a SeedGenerator) see a
failed-and-retried micro-batch twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import numbers
import time
import warnings
import weakref
from typing import Any, Callable

from edgebatch.errors import TrainingError, UsageError
from edgebatch.governor import Governor, GovernorConfig, Observation, PressureReader, split_micro_batches
from edgebatch.training.checkpoints import TrainingCheckpoint
from edgebatch.training.data import ExampleBuffer, prepare_dataset, refuse_unreplayable_order, slice_examples
from edgebatch.training.hard_failure import RunningMarker, take_hard_failure_micro_batch
from edgebatch.training.injection import injected_oom_plan, next_injected_oom
from edgebatch.training.learning_rate import LearningRateScaler
from edgebatch.training.observability import RunLog
from edgebatch.training.pruning import PruningSteps
from edgebatch.training.records import FitReport, OomEvent, Progress, UpdateRecord
from edgebatch.training.replicas import check_governor_for_replicas, mirrored_governor_config
from edgebatch.training.steps import (
    AccumulatingSteps,
    batch_norm_layers,
    is_multi_worker,
    mirrored_strategy_of,
    random_layers,
    refuse_unsupported_precision,
)

__all__ = ["BATCH_NORM_CHOICES", "fit"]

# What fit does with a model that has BatchNormalization layers (see fit's docstring).
BATCH_NORM_CHOICES = ("allow", "fixed_micro_batch", "refuse")

# Models already warned about BatchNormalization (once per model, not per fit call).
_warned_batch_norm: "weakref.WeakSet[Any]" = weakref.WeakSet()

# Examples read from the dataset per chunk: big enough that tf.data's per-element overhead is
# amortised, small enough that the buffer stays near one update's worth of examples.
MAX_READ_CHUNK_EXAMPLES = 1024


def fit(
    model: Any,
    dataset: Any,
    *,
    loss: Any = None,
    optimizer: Any = None,
    effective_batch: int,
    governor: Governor | None = None,
    epochs: int = 1,
    log_dir: str | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every_updates: int | None = None,
    decision_log: str | None = None,
    pressure_reader: PressureReader | None = None,
    max_updates: int | None = None,
    max_checkpoints_to_keep: int = 3,
    on_update: Callable[[UpdateRecord], None] | None = None,
    callbacks: Any = None,
    batch_norm: str = "allow",
    adapt: Any = None,
    worker_shares: Any = None,
    length_ceilings: Any = None,
    batch_unit: str = "examples",
    length_window_examples: int | None = None,
) -> FitReport:
    """Train `model` on `dataset` with governor-sized micro-batches and gradient accumulation.

    `dataset`: tf.data.Dataset of (x, y) examples, consumed in order; a batched one (elements of
    the model's input rank) is unbatched first. Each update takes `effective_batch` consecutive
    examples (the governor's decision.effective_batch in elastic mode; the last update of an epoch
    may take fewer). `loss`: a Keras loss object (its reduction is replaced by the exact mean over
    the update), a loss name, or a callable returning per-example losses; `optimizer`: a Keras
    optimizer. Both default to what `model.compile` set.
    `governor`: defaults to Governor(GovernorConfig(ceiling_batch=effective_batch,
    effective_batch=effective_batch)); it is used as given (not reset) unless a checkpoint restores
    it. `pressure_reader`: read once per update (it rate-limits itself); without one the governor
    only reacts to OOMs and slow steps (slow steps only for fixed-length examples: an update of
    variable-length ones takes as long as its lengths make it, so its time is not handed over). `checkpoint_dir`: resume from / save to it, every
    `checkpoint_every_updates` updates and at the end; the dataset must then yield the same order
    every epoch and in every process (a reshuffling or unseeded shuffle, or an unseeded random op in
    the pipeline, is refused).
    `max_updates`: stop after this many updates in total. `on_update(record)` is called after
    every update (progress printing, test hooks). `callbacks`: Keras callbacks (or a CallbackList)
    of the model's Keras, driven like model.fit drives them, one "batch" per optimizer update with
    logs {"loss": ...}; one that sets `model.stop_training` stops fit after that update.
    `batch_norm`: BatchNormalization normalizes each micro-batch by its own statistics, so with
    it the split changes the result. "allow" (default) trains anyway and warns once per model;
    "fixed_micro_batch" keeps the governor's starting micro-batch (it shrinks only on an OOM; no
    pressure or slow-step change), so the statistics are those of a fixed, known batch size (the
    last piece of an update is smaller unless effective_batch is a multiple of the micro-batch);
    "refuse" raises UsageError. The FitReport says which layers and what exactness held.
    Under tf.distribute.MirroredStrategy (model and optimizer built in its scope) micro-batches are
    global, a multiple of the replica count, split evenly over the replicas (module docstring);
    FitReport.replicas says how many. Other strategies are refused.
    Under tf.distribute.MultiWorkerMirroredStrategy (one device per worker process, every worker
    calling fit on the same dataset in the same order) each worker trains on its share of every
    update and accumulates it locally (workers.py): `worker_shares` (one weight per worker, e.g. a
    fleet plan's shares) splits updates in proportion and lets each worker's own governor decide
    its micro-batch; without it shares are even and the workers' governors decide in lockstep
    (worst pressure wins). No checkpoint_dir there yet.
    `adapt`: an edgebatch.adapt.AdaptConfig turns on the statistical batch policy (module
    docstring, "Adaptive batch"): `effective_batch` is then where it starts, and the policy moves
    it from the gradient statistics; the governor (mode "fixed") still bounds every micro-batch.
    The optimizer's base learning rate is put back when fit returns (elastic mode scales it).
    `length_ceilings`: for examples of variable length (a token axis of unknown size), the ceiling at
    each sequence length: an edgebatch.training.LengthCeilings, a probe per length's DeviceProfile
    (each length's safe_batch), or {tokens: ceiling}. Pieces are then cut by length
    (length_ceilings.py): the probed lengths are the buckets, and each piece holds the governor's
    share (its micro-batch over the largest it may decide) of its bucket's ceiling: every length's
    whole ceiling without pressure, less under it. With adapt, each piece also holds at most
    adapt's bound (examples that leave config.min_pieces_per_update pieces in the update). Not with
    a strategy or fixed-length data.
    `batch_unit`: "examples" (default) or "tokens": with "tokens" (variable-length data only) each
    update takes consecutive examples until their real tokens (unpadded lengths) reach
    `effective_batch`, so updates of short examples hold more of them; the governor must be in
    mode "fixed", and adapt and strategies are refused. The loss is the mean over the update's
    examples either way, so accumulation stays exact.
    `length_window_examples`: for variable-length examples, read the epoch in windows of this many
    consecutive examples, sort each window by length and cut it into updates, which then run in a
    seeded shuffled order (length_window.py): updates hold examples of similar length, so their
    pieces pad less. Which examples share an update changes (every example is still used once per
    epoch); resume stays exact. In examples it must be a multiple of `effective_batch`; the governor
    must be in mode "fixed"; not with adapt or a strategy.
    TensorBoard scalars go to `log_dir`, one JSON line per update to `decision_log`
    (observability.py). Returns a FitReport of this call.
    """
    _check_arguments(effective_batch, epochs, checkpoint_dir, checkpoint_every_updates, max_updates,
                     max_checkpoints_to_keep, on_update, batch_norm)
    loss, optimizer = _compiled_defaults(model, loss, optimizer)
    strategy = mirrored_strategy_of(model, optimizer)
    replicas = 1 if strategy is None else int(strategy.num_replicas_in_sync)
    multi_worker = strategy is not None and is_multi_worker(strategy)
    if worker_shares is not None and not multi_worker:
        raise UsageError("worker_shares applies only under tf.distribute.MultiWorkerMirroredStrategy")
    if multi_worker and checkpoint_dir is not None:
        raise UsageError("checkpoint_dir is not supported under MultiWorkerMirroredStrategy yet: drop it")
    dataset, element_spec, unbatched = prepare_dataset(dataset, model)
    length_ceilings = _check_length_ceilings(length_ceilings, element_spec, strategy)
    _check_batch_unit(batch_unit, element_spec, adapt, strategy)
    _check_length_window(length_window_examples, effective_batch, batch_unit, element_spec, adapt, strategy)
    if checkpoint_dir is not None:
        refuse_unreplayable_order(dataset)
    normalizers = _check_batch_norm(model, batch_norm)
    if governor is None and replicas > 1 and not multi_worker:
        governor = Governor(mirrored_governor_config(effective_batch, replicas))
    elif governor is None:
        ceiling = effective_batch if length_ceilings is None else length_ceilings.reference_ceiling
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
            f"config.effective_batch {governor.config.effective_batch!r}: build the governor for the same batch"
        )
    # Both cut updates by a rule of their own, so the governor may not move the effective batch.
    for option, why in (("batch_unit='tokens'", batch_unit == "tokens" and "an elastic effective batch counts examples"),
                        ("length_window_examples", length_window_examples is not None
                         and "a window is cut into updates of one size when it is read")):
        if why and governor.config.mode != "fixed":
            raise UsageError(f"{option} needs a governor in mode 'fixed': {why}")
    problem = None if multi_worker else check_governor_for_replicas(governor.config, replicas)
    if problem is not None:
        raise UsageError(problem)
    if adapt is not None:
        from edgebatch.training.adaptive import check_adapt  # numpy: imported only when asked

        check_adapt(adapt, governor.config, replicas, batch_norm)
    refuse_unsupported_precision(model, optimizer, strategy)
    injected_oom_plan()  # a malformed EDGEBATCH_INJECT_OOM fails now, before any work
    # Under a strategy everything from here runs in its scope: optimizer slots, accumulators and
    # restored variables are then the strategy's (mirrored) ones.
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        _build_optimizer(optimizer, model.trainable_variables)
        loop_class, extra = _GovernedLoop, {}
        if multi_worker:
            from edgebatch.training.worker_loop import WorkerLoop
            from edgebatch.training.workers import WorkerGroup

            loop_class, extra = WorkerLoop, {"workers": WorkerGroup(strategy, worker_shares)}
        loop = loop_class(
            **extra,
            model=model, dataset=dataset, element_spec=element_spec, loss=loss, optimizer=optimizer,
            governor=governor, epochs=epochs, checkpoint_dir=checkpoint_dir,
            checkpoint_every_updates=checkpoint_every_updates, max_checkpoints_to_keep=max_checkpoints_to_keep,
            pressure_reader=pressure_reader, max_updates=max_updates, on_update=on_update,
            run_log=RunLog(log_dir, decision_log), callbacks=_callback_list(model, callbacks, epochs),
            fixed_micro_batch=batch_norm == "fixed_micro_batch", strategy=strategy,
            adaptive=None if adapt is None else _adaptive_batch(adapt, effective_batch),
            length_ceilings=length_ceilings, count_tokens=batch_unit == "tokens",
            length_window_examples=length_window_examples,
        )
        loop.report.batch_norm_layers = normalizers
        loop.report.batch_norm = batch_norm
        loop.report.random_layers = random_layers(model)
        loop.report.exactness = _exactness(normalizers, loop.report.random_layers)
        loop.report.unbatched_input = unbatched
        loop.report.replicas = replicas
        return loop.run()


def _by_length(flat_examples: list) -> list:
    """Variable-length examples of one update in order of length (sequences.py); others as they are."""
    from edgebatch.training.sequences import length_order

    order = length_order(flat_examples)
    return flat_examples if order is None else [array[order] for array in flat_examples]


def _refuse_unless_variable_length(option: str, element_spec: Any, strategy: Any, instead: str, *,
                                   adapt: Any = None) -> None:
    """UsageError when `option` meets fixed-length examples, a strategy, or `adapt` where the caller
    passes it (the options not supported with it yet)."""
    import tensorflow as tf

    from edgebatch.training.sequences import is_variable

    if not any(is_variable(leaf) for leaf in tf.nest.flatten(element_spec[0])):
        raise UsageError(f"{option} applies to examples of variable length (an input of shape (None,)); "
                         f"these examples have fixed shapes: {instead}")
    if adapt is not None or strategy is not None:
        which = "adapt" if adapt is not None else "a tf.distribute strategy"
        raise UsageError(f"{option} cannot be combined with {which} yet: {instead}")


def _check_length_ceilings(length_ceilings: Any, element_spec: Any, strategy: Any) -> Any:
    """fit's `length_ceilings` as a LengthCeilings (None stays None); UsageError where it cannot apply
    (fixed-length examples, a strategy; adapt is fine)."""
    if length_ceilings is None:
        return None
    from edgebatch.training.length_ceilings import LengthCeilings

    if isinstance(length_ceilings, dict):
        length_ceilings = LengthCeilings.from_mapping(length_ceilings)
    elif not isinstance(length_ceilings, LengthCeilings):
        if not hasattr(length_ceilings, "per_length"):
            raise UsageError(
                f"length_ceilings must be a LengthCeilings, a DeviceProfile of a probe per length, or "
                f"{{tokens: ceiling}}, got {type(length_ceilings).__name__}"
            )
        length_ceilings = LengthCeilings.from_profile(length_ceilings)
    _refuse_unless_variable_length("length_ceilings", element_spec, strategy, "leave length_ceilings out")
    return length_ceilings


BATCH_UNITS = ("examples", "tokens")


def _check_batch_unit(batch_unit: Any, element_spec: Any, adapt: Any, strategy: Any) -> None:
    """UsageError for a batch_unit fit cannot count in (module docstring of sequences.py)."""
    if batch_unit not in BATCH_UNITS:
        raise UsageError(f"batch_unit must be one of {', '.join(BATCH_UNITS)}, got {batch_unit!r}")
    if batch_unit == "tokens":
        _refuse_unless_variable_length("batch_unit='tokens'", element_spec, strategy, "count in examples", adapt=adapt)


def _check_length_window(window: Any, effective_batch: int, batch_unit: str, element_spec: Any, adapt: Any,
                         strategy: Any) -> None:
    """UsageError for a length_window_examples fit cannot use (length_window.py)."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise UsageError(f"length_window_examples must be an integer >= 1 (examples per window), got {window!r}")
    _refuse_unless_variable_length("length_window_examples", element_spec, strategy,
                                   "leave length_window_examples out", adapt=adapt)
    if batch_unit == "examples" and window % effective_batch:
        raise UsageError(
            f"length_window_examples {window} is not a multiple of effective_batch {effective_batch}: a window is cut "
            f"into whole updates, e.g. length_window_examples={effective_batch * max(2, window // effective_batch)}"
        )


def _adaptive_batch(adapt: Any, effective_batch: int) -> Any:
    from edgebatch.training.adaptive import AdaptiveBatch

    return AdaptiveBatch(adapt, effective_batch)


def _check_arguments(effective_batch, epochs, checkpoint_dir, checkpoint_every_updates, max_updates,
                     max_checkpoints_to_keep, on_update, batch_norm) -> None:
    for name, value, optional in (
        ("effective_batch", effective_batch, False),
        ("epochs", epochs, False),
        ("checkpoint_every_updates", checkpoint_every_updates, True),
        ("max_updates", max_updates, True),
        ("max_checkpoints_to_keep", max_checkpoints_to_keep, False),
    ):
        if optional and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise UsageError(f"{name} must be an integer >= 1, got {value!r}")
    if checkpoint_every_updates is not None and checkpoint_dir is None:
        raise UsageError(f"checkpoint_every_updates={checkpoint_every_updates!r} needs a checkpoint_dir")
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


class _GovernedLoop:
    """The state of one fit call; `run()` is the whole loop."""

    def __init__(self, *, model, dataset, element_spec, loss, optimizer, governor, epochs, checkpoint_dir,
                 checkpoint_every_updates, max_checkpoints_to_keep, pressure_reader, max_updates, on_update,
                 run_log, callbacks, fixed_micro_batch, strategy=None, adaptive=None, length_ceilings=None,
                 count_tokens=False, length_window_examples=None) -> None:
        self.model = model
        self.dataset = dataset
        self.element_spec = element_spec
        self.governor = governor
        self.epochs = int(epochs)
        self.every = checkpoint_every_updates
        self.reader = pressure_reader
        self.max_updates = max_updates
        self.on_update = on_update
        self.log = run_log
        self.callbacks = callbacks
        self.fixed_micro_batch = fixed_micro_batch
        self.epoch_loss_sum = 0.0  # this call's loss x examples in the current epoch (callback logs)
        self.epoch_examples = 0
        self.batch_in_epoch = 0
        self.adaptive = adaptive
        self.length_ceilings = length_ceilings
        self.count_tokens = count_tokens
        self.length_window_examples = length_window_examples
        self.lengths: list[int] | None = None  # the current update's example lengths, in its order
        self.running_micro_batch = 0  # the governor's micro-batch the update's last split used
        self.optimizer = optimizer
        self.pruning = PruningSteps(model)
        self.chunk_examples = max(1, min(MAX_READ_CHUNK_EXAMPLES, governor.config.effective_batch))
        self.steps = AccumulatingSteps(model, loss, optimizer, element_spec, strategy, statistics=adaptive is not None)
        self.checkpoint = (
            TrainingCheckpoint(checkpoint_dir, model, optimizer, max_checkpoints_to_keep,
                               adapt_variables=None if adaptive is None else self.steps.previous)
            if checkpoint_dir else None
        )
        self.progress = Progress()
        self.saved_progress: Progress | None = None
        restored = self.checkpoint.restore_latest() if self.checkpoint is not None else None
        base_learning_rate = None
        if restored is not None:
            self.progress, base_learning_rate = restored.progress, restored.base_learning_rate
            self.saved_progress = self.progress
            if restored.governor_state is not None:
                governor.load_state_dict(restored.governor_state)
            if adaptive is not None and restored.adapt_state is not None:
                adaptive.controller.load_state_dict(restored.adapt_state)
        scaling = governor.config.lr_scaling != "none" or (adaptive is not None and adaptive.controller.config.lr_rule != "none")
        self.scaler = LearningRateScaler(optimizer, scaling, base_learning_rate)
        self.report = FitReport(resumed_from=self.progress if restored is not None else None)
        self.history_start = len(governor.history)
        # A supervisor restarted this process after a kill (supervisor.py): that size failed.
        hard_failure_micro_batch = take_hard_failure_micro_batch()
        if hard_failure_micro_batch is not None:
            # Said to be the running size: the restored state may be larger (checkpointed before a
            # shrink), and a smaller failed piece would otherwise count as its remainder.
            governor.on_oom(hard_failure_micro_batch, running_micro_batch=hard_failure_micro_batch)
        self.marker = RunningMarker(checkpoint_dir) if checkpoint_dir else None

    def run(self) -> FitReport:
        started = time.perf_counter()
        try:
            if self.pruning:
                self.pruning.begin_training()
            if self.callbacks is not None:
                self.model.stop_training = False
                self.callbacks.on_train_begin()
            while self.progress.epoch < self.epochs:
                buffer = self._epoch_buffer()
                self._begin_epoch()
                stopped = self._train_epoch(buffer)
                if stopped == "max_updates":
                    self.report.stopped_by_max_updates = True
                    break
                if stopped == "callback" or self._stop_requested():  # e.g. EarlyStopping at on_epoch_end
                    self.report.stopped_by_callback = True
                    break
            if self.checkpoint is not None and self.saved_progress != self.progress:
                self._save()
            if self.callbacks is not None:
                last = self.report.updates[-1].loss if self.report.updates else None
                self.callbacks.on_train_end(None if last is None else {"loss": last})
        finally:
            if self.pruning:
                self.pruning.remask()
                self.report.pruning_step = self.pruning.step
            self.scaler.restore()
            self.log.close()
            self.report.seconds = time.perf_counter() - started
            self.report.decisions = [dict(entry) for entry in self.governor.history[self.history_start :]]
            self.report.traces = dict(self.steps.traces)
            self.report.final_progress = self.progress
            if self.adaptive is not None:
                self.report.adapt_changes = list(self.adaptive.changes)
        return self.report

    def _train_epoch(self, buffer: ExampleBuffer) -> str | None:
        """Run the rest of the current epoch; "max_updates" or "callback" when that stopped it first."""
        while True:
            if buffer.at_end():  # only when nothing was left at the epoch's start (resumed at its end)
                self._finish_epoch()
                return None
            if self.max_updates is not None and self.progress.updates >= self.max_updates:
                return "max_updates"
            self._run_update(buffer)
            ended = buffer.at_end()
            stop = self._stop_requested()
            if ended:
                self._finish_epoch()
            elif stop:
                self._end_epoch_callbacks(self.progress.epoch)  # as model.fit does when stopped mid-epoch
            if self.every is not None and self.progress.updates % self.every == 0:
                self._save()
            if stop:
                return "callback"
            if ended:
                return None

    def _epoch_buffer(self) -> Any:
        """The rest of the current epoch's examples, as ExampleBuffer or, with a length window, WindowedExamples."""
        consumed = self.progress.examples_in_epoch
        if self.length_window_examples is None:
            return ExampleBuffer(self.dataset, consumed, self.chunk_examples)
        from edgebatch.training.length_window import WindowedExamples  # numpy: not at import time

        start = WindowedExamples.window_start(consumed, self.length_window_examples)
        return WindowedExamples(
            ExampleBuffer(self.dataset, start, self.chunk_examples), self.length_window_examples,
            self.governor.config.effective_batch, self.count_tokens, self.progress.epoch, consumed,
        )

    def _stop_requested(self) -> bool:
        """A callback set model.stop_training (checked after each update and each epoch, as model.fit does)."""
        return self.callbacks is not None and bool(getattr(self.model, "stop_training", False))

    def _begin_epoch(self) -> None:
        self.epoch_loss_sum, self.epoch_examples, self.batch_in_epoch = 0.0, 0, 0
        if self.callbacks is not None:
            self.callbacks.on_epoch_begin(self.progress.epoch)

    def _end_epoch_callbacks(self, epoch: int) -> None:
        if self.callbacks is not None:
            logs = {"loss": self.epoch_loss_sum / self.epoch_examples} if self.epoch_examples else {}
            self.callbacks.on_epoch_end(epoch, logs)

    def _finish_epoch(self) -> None:
        if self.pruning:
            self.pruning.remask()
        self._end_epoch_callbacks(self.progress.epoch)
        self.progress = dataclasses.replace(self.progress, epoch=self.progress.epoch + 1, examples_in_epoch=0)
        self.report.epochs_completed += 1

    def _save(self) -> str:
        adapt_state = None if self.adaptive is None else self.adaptive.controller.state_dict()
        path = self.checkpoint.save(self.progress, self.governor.state_dict(), self.scaler.base_learning_rate, adapt_state)
        self.saved_progress = self.progress
        self.report.checkpoints.append(path)
        return path

    def _run_update(self, buffer: ExampleBuffer) -> None:
        decision = self.governor.decision
        if self.callbacks is not None:
            self.callbacks.on_train_batch_begin(self.batch_in_epoch)
        adaptive = self.adaptive
        wanted = decision.effective_batch if adaptive is None else adaptive.effective_batch_samples
        lr_scale = decision.lr_scale if adaptive is None else adaptive.lr_scale()
        flat_examples, examples = buffer.take_tokens(wanted) if self.count_tokens else buffer.take(wanted)
        flat_examples = _by_length(flat_examples)
        from edgebatch.training.sequences import example_lengths  # numpy: not at import time

        self.lengths = example_lengths(flat_examples)  # None for fixed-length examples
        tokens = None if self.lengths is None else sum(self.lengths)
        # The wait for examples (this take, and the read-ahead since the last update) is not step
        # time: a slow input pipeline must not look like memory pressure to the governor.
        input_seconds = buffer.pop_read_seconds()
        started = time.perf_counter()
        self.scaler.apply(lr_scale)
        sizes, loss_sums, ooms, measured = self._accumulate(flat_examples, examples)
        shared = self._before_apply(sizes, loss_sums, ooms, examples)
        import tensorflow as tf

        try:
            update_statistics = self.steps.update_statistics() if adaptive is not None else None
            self.steps.apply_step()
        except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
            # apply_gradients may have moved some variables already: a checkpoint now would be torn,
            # so the last periodic one stays the one to resume from.
            message = f"the optimizer update {self.progress.updates + 1} ran out of memory: {_first_line(exc)}"
            self.log.write_error(message, update=self.progress.updates + 1)
            raise TrainingError(message) from exc
        loss_mean = self._loss_mean(loss_sums, examples, shared)
        step_seconds = time.perf_counter() - started
        seconds = input_seconds + step_seconds
        observation = self._read_observation(shared)
        # An update that hit an OOM spent 11-14 s failing (docs/tensorflow-memory.md, "Address-space
        # caps"): its time says nothing about speed.
        # With an adaptive batch an update's piece count changes with its effective batch: the
        # governor compares step times at one micro-batch size, so it gets the time per piece.
        governed_seconds = step_seconds if adaptive is None else step_seconds * max(sizes) / examples
        largest = max(sizes, default=None)  # None: a worker with no share of this update
        if self.length_ceilings is not None and sizes:
            largest = self.running_micro_batch  # pieces by length: the governor's units
        # Updates of variable-length examples differ in work by their lengths (256 docstrings an
        # update, by length window, took 0.04-5.2 s in one piece), so their times are no memory
        # signal: the governor's slow-step rule gets none (it halved the micro-batch there;
        # tools/length_window_step_times.py).
        comparable = not ooms and self.lengths is None
        observation = dataclasses.replace(
            observation, oom=False, step_seconds=governed_seconds if comparable else None, micro_batch=largest
        )
        if self.fixed_micro_batch:
            # batch_norm="fixed_micro_batch": no reading may move the micro-batch (only on_oom does).
            after = self._governor_observe(Observation(pressure=None, oom=False, micro_batch=largest), shared)
        else:
            after = self._governor_observe(observation, shared)
        adapt_record = None
        if adaptive is not None:
            adapt_decision, reading = adaptive.observe(
                update=self.progress.updates + 1, examples=examples, sizes=sizes,
                piece_sq_norms=measured[0], per_example=measured[1], update_statistics=update_statistics,
                loss_mean=loss_mean, schedule_rate=adaptive.scheduled_rate(self.optimizer, self.scaler.schedule),
                memory_micro_batch_samples=after.micro_batch,
            )
            adapt_record = adaptive.record(adapt_decision, reading)
        self.progress = Progress(
            epoch=self.progress.epoch,
            examples_in_epoch=self.progress.examples_in_epoch + examples,
            updates=self.progress.updates + 1,
            examples_seen=self.progress.examples_seen + examples,
        )
        record = UpdateRecord(
            update=self.progress.updates, epoch=self.progress.epoch, examples=examples,
            micro_batches=tuple(sizes), piece_lengths=self._piece_lengths(sizes), tokens=tokens,
            effective_batch=wanted, loss=loss_mean,
            pressure=observation.pressure, seconds=seconds,
            samples_per_second=examples / seconds if seconds > 0 else float("inf"),
            oom_events=len(ooms), changed=after.changed, reason=after.reason,
            next_micro_batch=self._split_size(after.micro_batch),
            next_effective_batch=after.effective_batch if adaptive is None else adaptive.effective_batch_samples,
            lr_scale=lr_scale, step_seconds=step_seconds, input_seconds=input_seconds, adapt=adapt_record,
        )
        self.report.updates.append(record)
        self.report.examples_seen += examples
        self.log.write_update(record, ooms)
        self.epoch_loss_sum += loss_mean * examples
        self.epoch_examples += examples
        if self.callbacks is not None:
            self.callbacks.on_train_batch_end(self.batch_in_epoch, {"loss": loss_mean})
        self.batch_in_epoch += 1
        if self.on_update is not None:
            self.on_update(record)

    def _split_size(self, memory_micro_batch: int) -> int:
        """The size an update is split with: the governor's micro-batch, or adapt's smaller one. With
        length ceilings it stays the governor's (its units); adapt's bound then caps each piece in
        examples instead (_pieces)."""
        if self.adaptive is None or self.length_ceilings is not None:
            return memory_micro_batch
        return self.adaptive.split_micro_batch(memory_micro_batch)

    def _accumulate(self, flat_examples: list, examples: int) -> tuple[list[int], list, list[OomEvent], tuple]:
        """Run the update's micro-batches; (sizes that ran, their loss sums, OOM events, and with
        statistics on (adapt) their squared gradient norms and per-example losses)."""
        import tensorflow as tf

        update_examples = tf.constant(float(examples))
        if self.pruning:
            self.pruning.begin_update()
        start, count = self._piece_range(examples)
        governor = self._oom_governor()
        running = self._split_size(governor.decision.micro_batch)
        pending = self._pieces(start, count, running) if count else []
        if pending:
            self._note_running(pending, running)
        offset, sizes, loss_sums, ooms = start, [], [], []
        piece_sq_norms, per_example = [], []
        while pending:
            size = pending[0]
            x, y = slice_examples(self.element_spec, flat_examples, offset, size)
            if self.pruning:
                self.pruning.before_micro_step()  # one pruning step per update (pruning.py)
            injected = next_injected_oom()
            try:
                if self.steps.strategy is not None and not self.steps.local_steps:
                    # An injected OOM happens inside the last replica's step (a real allocation
                    # failure there), so it tests that the other replicas add nothing either.
                    oom_replica = tf.constant(-1 if injected is None else self.steps.replicas - 1, tf.int32)
                    loss_sums.append(self.steps.micro_step(x, y, update_examples, oom_replica))
                elif injected is not None:
                    raise tf.errors.ResourceExhaustedError(None, None, injected)
                elif self.steps.statistics:
                    loss_sum, piece_sq_norm, losses = self.steps.micro_step(x, y, update_examples)
                    loss_sums.append(loss_sum)
                    piece_sq_norms.append(piece_sq_norm)
                    per_example.append(losses)
                else:
                    loss_sums.append(self.steps.micro_step(x, y, update_examples))
            except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
                # MemoryError: Python's own allocation failed (seen under an address-space cap
                # while tracing, tools/bench); an out-of-memory all the same.
                decision = self._tell_oom(governor, offset, size, running)
                event = OomEvent(
                    update=self.progress.updates + 1, epoch=self.progress.epoch, micro_batch=size,
                    example_offset=offset, next_micro_batch=decision.micro_batch,
                    injected=injected is not None, gave_up=decision.exhausted,
                    message=_oom_message(exc, injected, self.steps),
                )
                ooms.append(event)
                self.report.oom_events.append(event)
                if decision.exhausted:
                    self._give_up(event, exc)  # raises, unless a worker group decides together
                    break
                # Re-split from the failed piece on: its examples run again, in smaller pieces.
                running = self._split_size(decision.micro_batch)
                pending = self._pieces(offset, start + count - offset, running)
                self._note_running(pending, running)
                continue
            sizes.append(size)
            offset += size
            pending.pop(0)
        self.running_micro_batch = running
        return sizes, loss_sums, ooms, (piece_sq_norms, per_example)

    def _pieces(self, offset: int, count: int, micro_batch: int) -> list[int]:
        """Sizes of the pieces for examples [offset, offset + count) of the update: the governor's
        micro-batch each, or with length ceilings as each piece's lengths allow (length_ceilings.py),
        and no more than adapt's bound in examples."""
        if self.length_ceilings is None or self.lengths is None:
            return split_micro_batches(count, micro_batch)
        cap = None if self.adaptive is None else self.adaptive.pieces_bound_samples()
        return self.length_ceilings.split(self.lengths[offset : offset + count], micro_batch, self._upper(), cap)

    def _piece_lengths(self, sizes: list[int]) -> tuple[int, ...] | None:
        """The longest example (tokens) of each piece that ran, with length ceilings; else None."""
        if self.length_ceilings is None or self.lengths is None:
            return None
        offsets = itertools.accumulate(sizes, initial=0)
        return tuple(self._piece_length(offset, size) for offset, size in zip(offsets, sizes))

    def _piece_length(self, offset: int, size: int) -> int | None:
        """The longest example (tokens) of the piece at `offset`; None without length ceilings."""
        if self.length_ceilings is None or self.lengths is None:
            return None
        return max(self.lengths[offset : offset + size])

    def _tell_oom(self, governor: Governor, offset: int, size: int, running: int) -> Any:
        """The governor's decision after the piece at `offset` ran out of memory, in its own units."""
        length = self._piece_length(offset, size)
        if length is None:
            return governor.on_oom(size)
        units = self.length_ceilings.governor_size(size, length, running, self._upper())
        return governor.on_oom(units, running_micro_batch=running)

    def _upper(self) -> int:
        """The largest micro-batch the governor may decide: its decisions over this are its share."""
        config = self.governor.config
        return max(1, min(config.ceiling_batch, config.effective_batch))

    def _piece_range(self, examples: int) -> tuple[int, int]:
        """(first example, count) of the update that this process trains on: all of it here."""
        return 0, examples

    def _oom_governor(self) -> Governor:
        """The governor that decides OOM retries during an update."""
        return self.governor

    def _before_apply(self, sizes: list[int], loss_sums: list, ooms: list[OomEvent], examples: int) -> Any:
        """What must happen between the pieces and the optimizer update (nothing here; workers exchange)."""
        return None

    def _loss_mean(self, loss_sums: list, examples: int, shared: Any) -> float:
        import tensorflow as tf

        return float(tf.add_n(loss_sums)) / examples  # one host sync per update: the step is done

    def _read_observation(self, shared: Any) -> Observation:
        return self.reader.read() if self.reader is not None else Observation(pressure=None)

    def _governor_observe(self, observation: Observation, shared: Any) -> Any:
        return self.governor.observe(observation)

    def _note_running(self, pending: list[int], running: int) -> None:
        """Record the split's largest piece before it runs, for a supervisor to read after a kill
        (with length ceilings the governor's micro-batch: pieces are counted in its units there)."""
        if self.marker is not None:
            self.marker.note(running if self.length_ceilings is not None else max(pending))

    def _give_up(self, event: OomEvent, exc: Exception) -> None:
        """The smallest micro-batch ran out of memory: save what is done and stop with TrainingError."""
        import tensorflow as tf

        try:
            self.steps.reset_accumulators()
        except (tf.errors.ResourceExhaustedError, MemoryError):  # the accumulators die with this fit
            # Under a real cap zeros_like itself can run out (seen: ResourceExhaustedError from
            # ZerosLike in tests/test_training_real_oom.py's child); that error must not replace
            # the one that says what happened and where the checkpoint is.
            pass
        where = ""
        if self.checkpoint is not None:
            # Progress is still at the start of this update and the weights are untouched by it,
            # so this checkpoint resumes by redoing the whole update.
            where = f"; checkpoint saved to {self._save()!r}, call fit again with the same checkpoint_dir to resume"
        message = (
            f"a micro-batch of {event.micro_batch} example(s) still ran out of memory at update {event.update} "
            f"(epoch {event.epoch}, examples {self.progress.examples_in_epoch + event.example_offset}.. of the epoch) "
            f"and the governor cannot go lower (min_batch={self.governor.config.min_batch}){where}. "
            f"Free memory or use a smaller model. Last error: {event.message}"
        )
        self.log.write_error(message, update=event.update, micro_batch=event.micro_batch)
        raise TrainingError(message) from exc


def _oom_message(exc: Exception, injected: str | None, steps: AccumulatingSteps) -> str:
    """OomEvent.message: the error's telling line; for an injected replica OOM, also why it happened."""
    if injected is not None and steps.strategy is not None and not steps.local_steps:
        return f"{injected} (in replica {steps.replicas - 1} of {steps.replicas}): {_first_line(exc)}"
    return _first_line(exc)


def _first_line(exc: Exception) -> str:
    """The telling line of a TensorFlow error: its first line is often just "Graph execution error:"."""
    text = getattr(exc, "message", None) or str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    telling = next((line for line in lines if "OOM" in line or "out of memory" in line.lower()), lines[0])
    return telling[:300]
