"""The governor for `model.fit` users: micro-batches with gradient accumulation inside train_step.

    controller = enable_micro_batching(model, governor)       # after model.compile(...)
    model.fit(x, y, batch_size=64, callbacks=[controller.callback()])

`enable_micro_batching` replaces the model's `train_step` (on that instance only) with one that
splits each fit batch into micro-batches of `controller.micro_batch` (a tf.Variable read inside the
compiled step, so a new size never retraces), accumulates exact mean-loss gradients and applies
them once; metrics and the loss shown by fit equal a whole-batch step's. The callback
(`GovernorCallback` for Keras 3, `TfKerasGovernorCallback` for tf_keras; `controller.callback()`
picks) feeds the governor after every batch and writes its decision into the variable. An OOM
inside fit cannot be retried in place (`MicroBatchController.on_oom` says what can be done). Works
with Keras 3 and tf_keras; what is supported (mixed precision, BatchNormalization, MirroredStrategy,
TFMOT, XLA): enable_micro_batching.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import types
import warnings
from typing import Any

import keras

from edgebatch.errors import UsageError
from edgebatch.governor import Decision, Governor, Observation, PressureReader
from edgebatch.training.pruning import pruning_layers
from edgebatch.training.replicas import check_governor_for_replicas
from edgebatch.training.model_checks import batch_norm_layers, is_multi_worker, mirrored_strategy_of

__all__ = ["GovernorCallback", "MicroBatchController", "TfKerasGovernorCallback", "enable_micro_batching"]


class _Keras3:
    """Keras 3 calls used by the governed train_step."""

    name = "keras"

    @staticmethod
    def unpack(data: Any) -> tuple:
        return keras.utils.unpack_x_y_sample_weight(data)

    @staticmethod
    def piece_loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any, examples: Any) -> Any:
        compute = getattr(model, "_compute_loss", None) or model.compute_loss  # handles old overrides
        loss = compute(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        # Keras 3's train_step feeds its (private) loss tracker itself; weighting each piece by its
        # size gives the same mean as one update over the whole batch. Under a strategy Keras
        # scales the loss by 1 / replicas (the optimizer sums the replicas' gradients); its own
        # train_step unscales what the tracker sees, and so does this one.
        tracker = getattr(model, "_loss_tracker", None)
        if tracker is not None:
            replicas = tf_replicas()
            tracker.update_state(loss * replicas if replicas > 1 else loss, sample_weight=examples)
        return loss

    @staticmethod
    def scale_loss(optimizer: Any, loss: Any) -> Any:
        return optimizer.scale_loss(loss)

    @staticmethod
    def apply(optimizer: Any, gradients: list, variables: list) -> None:
        optimizer.apply_gradients(zip(gradients, variables))  # a LossScaleOptimizer unscales here


class _TfKeras:
    """tf_keras calls used by the governed train_step."""

    name = "tf_keras"

    @staticmethod
    def unpack(data: Any) -> tuple:
        import tf_keras

        return tf_keras.utils.unpack_x_y_sample_weight(data)

    @staticmethod
    def piece_loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any, examples: Any) -> Any:
        return model.compute_loss(x, y, y_pred, sample_weight)  # its loss metric weights by piece size

    @staticmethod
    def scale_loss(optimizer: Any, loss: Any) -> Any:
        scale = getattr(optimizer, "get_scaled_loss", None)
        return scale(loss) if scale is not None else loss

    @staticmethod
    def apply(optimizer: Any, gradients: list, variables: list) -> None:
        unscale = getattr(optimizer, "get_unscaled_gradients", None)
        if unscale is not None:
            gradients = unscale(gradients)
        optimizer.apply_gradients(zip(gradients, variables))


def tf_replicas() -> int:
    """Replicas in sync of the strategy in scope (1 without one); a Python int at trace time."""
    import tensorflow as tf

    return int(tf.distribute.get_strategy().num_replicas_in_sync)


def _world_of(model: Any) -> type:
    if isinstance(model, keras.Model):
        return _Keras3
    try:
        import tf_keras
    except ImportError:
        tf_keras = None
    if tf_keras is not None and isinstance(model, tf_keras.Model):
        return _TfKeras
    raise UsageError(f"enable_micro_batching needs a Keras 3 or tf_keras Model, got {type(model).__name__}")


class MicroBatchController:
    """The link between a Governor (Python) and the compiled train_step (graph): one tf.Variable.

    `micro_batch` (tf.Variable int32) is what train_step reads; `traces` counts train_step traces;
    `decisions` lists the governor's changes (with the batch number) made during fit;
    `batch_norm_layers` names the model's BatchNormalization layers (then a batch equals plain fit's
    only up to micro-batch statistics).
    """

    def __init__(self, model: Any, governor: Governor, pressure_reader: PressureReader | None = None) -> None:
        import tensorflow as tf

        self.model = model
        self.governor = governor
        self.pressure_reader = pressure_reader
        self.world = _world_of(model)
        self.batch_times_comparable = not has_open_input_axis(model)
        self.micro_batch = tf.Variable(governor.decision.micro_batch, dtype=tf.int32, trainable=False,
                                       name="edgebatch_micro_batch")
        self.traces = 0
        self.batches = 0
        self.decisions: list[dict[str, Any]] = []
        self.batch_norm_layers: list[str] = []
        self.replicas = 1  # MirroredStrategy replicas: micro_batch is global, each replica runs micro_batch / replicas

    def observe_batch(self, step_seconds: float | None) -> Decision:
        """One fit batch finished: read pressure, let the governor observe it, apply its decision."""
        self.batches += 1
        observation = self.pressure_reader.read() if self.pressure_reader is not None else Observation(pressure=None)
        observation = dataclasses.replace(
            observation, oom=False, step_seconds=step_seconds if self.batch_times_comparable else None,
            micro_batch=self.governor.decision.micro_batch,
        )
        return self._apply(self.governor.observe(observation), observation.pressure)

    def on_oom(self, micro_batch: int | None = None) -> Decision:
        """A fit batch ran out of memory (caught around model.fit): shrink the micro-batch now.

        A micro-batch change takes effect at the next train_step (the callback runs between
        batches). An OOM inside fit's compiled train_step cannot be retried in place: a graph has no
        try/except, and Keras ends fit with the ResourceExhaustedError. The batch that failed has not
        changed the weights (gradients are applied after the last piece), but metrics may hold part
        of it, and the epoch's position is lost. So catch the error around fit, call this, and call
        fit again, e.g. from the failed epoch (`initial_epoch`); that epoch's earlier batches are
        then trained on twice. For exact in-place recovery, use `edgebatch.training.fit`.
        """
        size = self.governor.decision.micro_batch if micro_batch is None else micro_batch
        return self._apply(self.governor.on_oom(size), None)

    def _apply(self, decision: Decision, pressure: float | None) -> Decision:
        if decision.changed or decision.exhausted:
            self.decisions.append({"batch": self.batches, "reason": decision.reason,
                                   "micro_batch": decision.micro_batch, "pressure": pressure,
                                   "exhausted": decision.exhausted})
        self.micro_batch.assign(decision.micro_batch)
        return decision

    def callback(self) -> Any:
        """A fit callback of the model's world (Keras 3 or tf_keras) driving this controller."""
        return GovernorCallback(self) if self.world is _Keras3 else _tf_keras_callback_class()(self)


def has_open_input_axis(model: Any) -> bool:
    """True when one of the model's inputs has an axis of unknown size besides the batch (e.g. a token
    axis, `Input((None,))`); False for fixed shapes and for a model without known inputs."""
    try:
        inputs = list(model.inputs or [])
    except (AttributeError, ValueError):  # a subclassed or unbuilt model has no symbolic inputs
        return False
    return any(dim is None for tensor in inputs for dim in tuple(tensor.shape)[1:])


def enable_micro_batching(
    model: Any, governor: Governor, pressure_reader: PressureReader | None = None
) -> MicroBatchController:
    """Make `model.fit` run each batch as governor-sized micro-batches. Call after `model.compile`.

    The governor's `effective_batch` should be fit's `batch_size`; its mode must be "fixed".
    Returns the controller; pass `controller.callback()` to fit.

    Each piece's loss, as `compute_loss` returns it, is weighted by piece size / batch size;
    regularization losses come out once; sparse Embedding gradients stay sparse. Metrics and fit's
    loss are updated piece by piece. The callback's batch time includes reading the batch
    (model.fit's compiled train function takes it from the dataset iterator itself;
    edgebatch.training.fit times the step without the input wait). A model with an input axis of
    unknown size besides the batch (token sequences, `Input((None,))`) trains batches whose time
    follows their shape, so the governor gets no batch time from it (its slow-step rule would read
    a long batch as pressure).

    Works with Keras 3 (`import keras`) and tf_keras (`import tf_keras`) models; `_KERAS3`/`_TF_KERAS`
    hold the few calls that differ.
    - Mixed precision works (the loss-scale optimizer sees one accumulated gradient per batch).
    - BatchNormalization normalizes each micro-batch by its own statistics: this warns and names the
      layers (`controller.batch_norm_layers`).
    - MirroredStrategy (model compiled in its scope): model.fit runs this train_step on every
      replica with its share of the batch; the governor's micro-batch is global (GovernorConfig
      multiple and min_batch multiples of the replica count, else refused) and each replica splits
      its share into pieces of micro_batch / replicas, so every replica applies the same decision.
      Keras scales each replica's loss by 1 / replicas and the optimizer sums the replicas'
      gradients once per batch, as in Keras's own train_step, so a batch equals plain model.fit's
      under the same strategy (and the plain loop's when fit's batches split evenly over the
      replicas). An OOM in one replica ends model.fit; `controller.on_oom()` then shrinks all
      replicas together. Other strategies are refused.
    - TFMOT: a pruned model (with UpdatePruningStep among fit's callbacks, as TFMOT requires)
      advances its pruning step once per batch, not once per piece: each piece's forward pass
      starts from the batch's step.
    - Not supported: XLA (`jit_compile=True`: dynamic micro-batch slices in a loop do not compile;
      this turns it off), the governor's elastic mode (fit's batch size is fixed; use
      edgebatch.training.fit).
    """
    if not isinstance(governor, Governor):
        raise UsageError(f"governor must be an edgebatch.governor.Governor, got {governor!r}")
    if governor.config.mode != "fixed":
        raise UsageError(
            f"model.fit keeps its batch size, so the governor's mode must be 'fixed', got {governor.config.mode!r}; "
            "use edgebatch.training.fit for elastic mode"
        )
    world = _world_of(model)
    strategy = mirrored_strategy_of(model, getattr(model, "optimizer", None))
    if strategy is not None and is_multi_worker(strategy):
        raise UsageError(
            "enable_micro_batching does not support MultiWorkerMirroredStrategy (untested there): use "
            "edgebatch.training.fit, which does"
        )
    replicas = 1 if strategy is None else int(strategy.num_replicas_in_sync)
    problem = check_governor_for_replicas(governor.config, replicas)
    if problem is not None:
        raise UsageError(problem)
    compiled = getattr(model, "compiled", getattr(model, "_is_compiled", False))
    if not compiled or getattr(model, "optimizer", None) is None:
        raise UsageError(f"compile model {model.name!r} before enable_micro_batching (compile resets train_step settings)")
    controller = MicroBatchController(model, governor, pressure_reader)
    controller.replicas = replicas
    controller.batch_norm_layers = batch_norm_layers(model)
    if controller.batch_norm_layers:
        warnings.warn(
            f"edgebatch micro-batching: BatchNormalization layers {controller.batch_norm_layers!r} normalize each "
            "micro-batch by its own statistics, so a batch equals plain fit's only up to those statistics "
            "(edgebatch.training.fit offers batch_norm='fixed_micro_batch')",
            stacklevel=2,
        )
    # Slicing by a runtime size inside a loop does not compile under XLA, and Keras 3 picks
    # jit_compile=True on GPUs by default ("auto").
    if getattr(model, "jit_compile", False):
        model.jit_compile = False
    step = functools.partial(_governed_train_step, controller=controller, world=world)
    # Instance attribute (not a subclass) so any model class works; Keras's attribute tracking is
    # bypassed because a bound method is nothing to track.
    object.__setattr__(model, "train_step", types.MethodType(step, model))
    model.train_function = None  # rebuilt on the next fit, around the new train_step
    return controller


def _governed_train_step(model: Any, data: Any, *, controller: MicroBatchController, world: type) -> Any:
    """train_step: accumulate the batch's micro-batches (a tf.while_loop), apply once."""
    import tensorflow as tf

    controller.traces += 1  # runs while tracing only
    x, y, sample_weight = world.unpack(data)
    batch = tf.shape(tf.nest.flatten(x)[0])[0]  # this replica's share of fit's batch under a strategy
    # The governor's micro-batch is global (a multiple of the replicas): each replica runs its share.
    micro = tf.maximum(tf.minimum(controller.micro_batch.read_value() // controller.replicas, batch), 1)
    batch_f = tf.cast(batch, tf.float32)
    variables = model.trainable_variables
    # TFMOT pruning wrappers add 1 to their step in every training forward pass: each piece starts
    # from the batch's step, so the schedule advances once per batch (training/pruning.py).
    pruning = pruning_layers(model)
    batch_steps = [tf.identity(layer.pruning_step.read_value()) for layer in pruning]

    def run_piece(start: Any) -> list:
        for layer, step in zip(pruning, batch_steps):
            layer.pruning_step.assign(step)
        size = tf.minimum(micro, batch - start)
        pick = lambda t: None if t is None else t[start : start + size]  # noqa: E731
        xs, ys, ws = (tf.nest.map_structure(pick, part) for part in (x, y, sample_weight))
        with tf.GradientTape() as tape:
            y_pred = model(xs, training=True)
            loss = world.piece_loss(model, xs, ys, y_pred, ws, size)
            scaled = world.scale_loss(model.optimizer, loss * tf.cast(size, loss.dtype) / tf.cast(batch_f, loss.dtype))
        gradients = tape.gradient(scaled, variables)
        model.compute_metrics(xs, ys, y_pred, sample_weight=ws)
        return [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, variables)]

    # The first piece runs outside the loop: anything built lazily on first use (compiled losses
    # and metrics in tf_keras) must not create variables inside a while_loop body.
    first = run_piece(tf.constant(0, tf.int32))
    sums = _GradientSums(first)

    def body(start: Any, state: tuple) -> tuple:
        return start + micro, sums.add(state, run_piece(start))

    _, state = tf.while_loop(lambda start, _: start < batch, body, (micro, sums.initial),
                             shape_invariants=(micro.shape, sums.invariants))
    world.apply(model.optimizer, sums.gradients(state), variables)
    return model.get_metrics_result()


class _GradientSums:
    """Loop state that sums the pieces' gradients: dense ones added up, sparse ones kept sparse.

    An Embedding's gradient is a tf.IndexedSlices (the looked-up rows). Turning it dense would
    cost a full table per piece; instead the pieces' rows are concatenated (values and indices
    grow each iteration, hence the shape invariants) and the optimizer gets one IndexedSlices
    with repeated indices, as it does from an unsplit batch.
    """

    def __init__(self, first: list) -> None:
        import tensorflow as tf

        self.sparse = [isinstance(g, tf.IndexedSlices) for g in first]
        self.dense_shapes = [g.dense_shape if sparse else None for g, sparse in zip(first, self.sparse)]
        self.initial = tuple((g.values, g.indices) if sparse else g for g, sparse in zip(first, self.sparse))
        self.invariants = tuple(
            (tf.TensorShape([None]).concatenate(g.values.shape[1:]), tf.TensorShape([None])) if sparse else g.shape
            for g, sparse in zip(first, self.sparse)
        )

    def add(self, state: tuple, pieces: list) -> tuple:
        import tensorflow as tf

        summed = []
        for total, g, sparse in zip(state, pieces, self.sparse):
            if not sparse:
                summed.append(total + tf.convert_to_tensor(g))
                continue
            if not isinstance(g, tf.IndexedSlices):  # the same variable gave a dense gradient here
                g = tf.IndexedSlices(g, tf.range(tf.shape(g, out_type=total[1].dtype)[0]))
            summed.append((tf.concat([total[0], g.values], 0), tf.concat([total[1], tf.cast(g.indices, total[1].dtype)], 0)))
        return tuple(summed)

    def gradients(self, state: tuple) -> list:
        import tensorflow as tf

        return [tf.IndexedSlices(total[0], total[1], dense_shape) if sparse else total
                for total, sparse, dense_shape in zip(state, self.sparse, self.dense_shapes)]


class _CallbackLogic:
    """What both worlds' callbacks do: time each batch, then `controller.observe_batch`."""

    def __init__(self, controller: MicroBatchController) -> None:
        super().__init__()
        self.controller = controller
        self._batch_started: float | None = None

    def on_train_begin(self, logs: Any = None) -> None:
        if getattr(self.controller.model, "jit_compile", False):
            raise UsageError("micro-batching cannot run under jit_compile=True: call enable_micro_batching after compile")
        self.controller.micro_batch.assign(self.controller.governor.decision.micro_batch)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._batch_started = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        seconds = None if self._batch_started is None else time.perf_counter() - self._batch_started
        self.controller.observe_batch(seconds)


class GovernorCallback(_CallbackLogic, keras.callbacks.Callback):
    """Keras 3 callback: feeds the governor after every training batch (MicroBatchController.observe_batch)."""


@functools.cache
def _tf_keras_callback_class() -> type:
    import tf_keras

    class TfKerasGovernorCallback(_CallbackLogic, tf_keras.callbacks.Callback):
        """tf_keras callback: feeds the governor after every training batch."""

    TfKerasGovernorCallback.__qualname__ = "TfKerasGovernorCallback"
    TfKerasGovernorCallback.__module__ = __name__
    return TfKerasGovernorCallback


def __getattr__(name: str) -> Any:
    # tf_keras is an optional install: build its callback class only when asked for.
    if name == "TfKerasGovernorCallback":
        return _tf_keras_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
