"""The two compiled steps of governed training: accumulate one micro-batch, apply one update.

Exactness. Each micro-step adds the gradient of sum(per-example losses) / update_examples (plus the
regularization losses x micro_examples / update_examples) into accumulator variables, so after the
pieces of an update they hold the gradient of the update's mean loss whatever the split; the apply
step hands them to the optimizer and zeroes them. Under loss scaling a split update can stay finite
where the whole batch overflows, so which updates are skipped depends on the split (_loss_scale).

OOM safety. Every accumulator update depends on *all* gradients of the micro-batch (a control
dependency), so a micro-step that runs out of memory anywhere has added nothing: the loop can re-run
the same examples in smaller pieces. State the forward pass itself writes (BatchNormalization's
moving statistics, a stateful random generator) sees the retried examples twice.

One class per strategy, chosen once when the steps are built: `OneDeviceSteps` here,
`MirroredSteps` and `WorkerSteps` in mirrored_steps.py. TensorFlow is imported inside functions.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from edgebatch.errors import UsageError
from edgebatch.models.layers import all_layers  # noqa: F401  (importable from here, as before)
from edgebatch.training.model_checks import (  # noqa: F401  (importable from here, as before)
    batch_norm_layers,
    is_multi_worker,
    loss_scale_kind,
    mirrored_strategy_of,
    random_layers,
    refuse_unsupported_precision,
)

__all__ = [
    "AccumulatingSteps",
    "OneDeviceSteps",
    "all_layers",
    "batch_norm_layers",
    "per_example_loss",
    "random_layers",
    "mirrored_strategy_of",
    "refuse_unsupported_precision",
]


def per_example_loss(loss: Any) -> Callable[[Any, Any], Any]:
    """A function (y_true, y_pred) -> per-example losses [batch] from a Keras loss or a callable.

    A Keras loss object (Keras 3 or tf_keras) is copied with reduction "none": its own conversions
    and masking still apply, and the user's reduction is replaced by fit's exact mean over the
    update. A plain callable must return one loss per example (extra trailing axes are averaged,
    like Keras's "sum_over_batch_size"); a scalar is refused at trace time.
    """
    if isinstance(loss, str) or not callable(loss):
        raise UsageError(
            f"loss must be a Keras loss object (e.g. keras.losses.MeanSquaredError()) or a callable "
            f"(y_true, y_pred) -> per-example losses, got {loss!r}"
        )
    if hasattr(loss, "reduction") and hasattr(loss, "get_config"):
        unreduced = copy.copy(loss)
        unreduced.reduction = "none"
        return unreduced
    return loss


def _batched_spec(spec: Any) -> Any:
    import tensorflow as tf

    if not isinstance(spec, tf.TensorSpec):
        raise UsageError(f"dataset components must be dense tensors, got {spec!r}")
    return tf.TensorSpec([None, *spec.shape], spec.dtype, name=spec.name)


def steps_class(strategy: Any) -> type:
    """The AccumulatingSteps class for `strategy`: OneDeviceSteps (None), WorkerSteps
    (MultiWorkerMirroredStrategy) or MirroredSteps (MirroredStrategy)."""
    if strategy is None:
        return OneDeviceSteps
    from edgebatch.training.mirrored_steps import MirroredSteps, WorkerSteps

    return WorkerSteps if is_multi_worker(strategy) else MirroredSteps


class AccumulatingSteps:
    """The micro-step and apply-step tf.functions for one model, loss, optimizer and element spec.

    `AccumulatingSteps(model, loss, optimizer, element_spec, strategy=None, statistics=False)`
    builds the class for the strategy (`steps_class`); this base holds what they share: the
    accumulators, the per-example loss, one piece's gradient (`_accumulate_piece`) and the loss scale.

    `run_piece(x, y, update_examples, injected)` runs one micro-step; `micro_step(x, y,
    update_examples) -> loss_sum` (sum of the micro-batch's per-example losses) and `apply_step()`
    are the compiled functions. `traces` counts traces of each; both should stay at 1 (apply_step
    traces twice with optimizers that create their slots on first use, e.g. tf_keras legacy ones).
    Each instance (each fit call) traces its own functions, so a process that calls fit five
    times or more sees TensorFlow's "frequent retracing" warning, which counts traces per Python
    function across instances; `traces` is the per-call truth.

    One trace. `update_examples` is a float32 tensor and the batch dimension of the input signature is
    None, so micro-batches of any size and any split reuse one concrete function
    (docs/tensorflow-memory.md, "tf.function retracing": without an input signature every new batch size
    retraces). The Python loops over variables below run at trace time only; the hot path is one call
    per micro-batch and one per update.
    """

    local_steps = False  # True where each worker accumulates its own share (WorkerSteps)
    injects_in_replica = False  # True where an injected OOM happens inside a replica's step (MirroredSteps)
    statistics_supported = True  # gradient statistics (fit's adapt=...) on this strategy

    def __new__(cls, model: Any, loss: Any, optimizer: Any, element_spec: Any, strategy: Any = None,
                statistics: bool = False) -> "AccumulatingSteps":
        return super().__new__(steps_class(strategy) if cls is AccumulatingSteps else cls)

    def __init__(self, model: Any, loss: Any, optimizer: Any, element_spec: Any, strategy: Any = None,
                 statistics: bool = False) -> None:
        import tensorflow as tf

        self.model = model
        self.optimizer = optimizer
        self.strategy = strategy
        self.replicas = 1 if strategy is None else int(strategy.num_replicas_in_sync)
        self.variables = list(model.trainable_variables)
        if not self.variables:
            raise UsageError(
                f"model {getattr(model, 'name', model)!r} has no trainable variables: build it first "
                "(give it a keras.Input or call it on one batch)"
            )
        with self._scope():
            self.accumulators = [
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"edgebatch_accumulator_{i}",
                            **self._accumulator_options())
                for i, v in enumerate(self.variables)
            ]
        self.traces = {"micro_step": 0, "apply_step": 0}
        self.loss_scaling = loss_scale_kind(optimizer)
        self.statistics = statistics
        if statistics and not self.statistics_supported:
            raise UsageError("gradient statistics (fit's adapt=...) are not supported under a tf.distribute strategy yet")
        # The previous update's accumulated gradient (statistics only): cosine between updates.
        self.previous = [
            tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"edgebatch_previous_gradient_{i}")
            for i, v in enumerate(self.variables)
        ] if statistics else []
        self._loss = per_example_loss(loss)
        x_spec, y_spec = element_spec
        self._compile([
            tf.nest.map_structure(_batched_spec, x_spec),
            tf.nest.map_structure(_batched_spec, y_spec),
            tf.TensorSpec([], tf.float32, name="update_examples"),
        ])

    def _scope(self) -> Any:
        """The context the accumulators are created in (the strategy's scope under one)."""
        import contextlib

        return contextlib.nullcontext()

    def _accumulator_options(self) -> dict:
        """tf.Variable options of the accumulators (synchronization under a strategy)."""
        return {}

    def _compile(self, signature: list) -> None:
        """Set micro_step and apply_step (tf.functions) for this strategy; `signature`: (x, y, update_examples)."""
        raise NotImplementedError

    def run_piece(self, x: Any, y: Any, update_examples: Any, injected: str | None) -> tuple:
        """Run one micro-step: (loss sum, and with statistics on its squared gradient norm and
        per-example losses, else None, None). `injected`: an injected OOM's message for this piece
        (injection.py) or None; it raises ResourceExhaustedError as a real OOM would."""
        import tensorflow as tf

        if injected is not None:
            raise tf.errors.ResourceExhaustedError(None, None, injected)
        if self.statistics:
            return self.micro_step(x, y, update_examples)
        return self.micro_step(x, y, update_examples), None, None

    def _per_example(self, y: Any, y_pred: Any) -> Any:
        import tensorflow as tf

        values = tf.cast(self._loss(y, y_pred), tf.float32)
        rank = values.shape.rank
        if rank == 0:
            raise UsageError(
                f"loss {self._loss!r} returned a scalar: fit needs one loss per example (a Keras loss "
                "object, or a callable without reduction) to weight micro-batches exactly"
            )
        if rank is not None and rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, rank)))
        return values

    def _accumulate_piece(self, x: Any, y: Any, update_examples: Any, barrier: Callable | None = None) -> Any:
        """Add this piece's share of the update's gradient into the accumulators; its loss sum.

        `barrier(gradients) -> tensor`: what every accumulator update must also wait for (under a
        strategy: all replicas' gradients, so that no replica adds anything when one fails).
        """
        import tensorflow as tf

        with tf.GradientTape() as tape:
            y_pred = self.model(x, training=True)
            per_example = self._per_example(y, y_pred)
            loss_sum = tf.reduce_sum(per_example)
            objective = loss_sum / update_examples
            if self.model.losses:
                share = tf.cast(tf.shape(per_example)[0], tf.float32) / update_examples
                regularization = tf.add_n([tf.cast(tf.reduce_sum(l), tf.float32) for l in self.model.losses])
                objective += regularization * share
            if self.loss_scaling == "keras":
                objective = self.optimizer.scale_loss(objective)
            elif self.loss_scaling == "tf_keras":
                objective = self.optimizer.get_scaled_loss(objective)
        gradients = tape.gradient(objective, self.variables)
        gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, self.variables)]
        # All gradients exist before any accumulator moves: "OOM safety" in the module docstring.
        ready = [_tensor_of(g) for g in gradients]
        if barrier is not None:
            ready = [barrier(ready)]
        with tf.control_dependencies(ready):
            updates = [_accumulate(acc, g) for acc, g in zip(self.accumulators, gradients)]
        with tf.control_dependencies(updates):
            if not self.statistics:
                return tf.identity(loss_sum)
            # Statistics: the piece's own squared gradient norm (of its share of the update's
            # objective; the loop rescales it to the piece's mean gradient) and its losses.
            scale = self._loss_scale()
            return tf.identity(loss_sum), _squared_norm(gradients) / (scale * scale), tf.identity(per_example)

    def _loss_scale(self) -> Any:
        """The current loss scale S as a float32 tensor (1 without loss scaling).

    Loss scaling (mixed_float16 with a LossScaleOptimizer, Keras 3 or tf_keras). The loss scale
        changes only when an update is applied, so every micro-step of one update uses the same scale S:
        each adds the gradient of S x its objective, the accumulators hold S x the update's gradient, and
        the apply step hands that to the loss-scale optimizer as a plain loop hands it one scaled batch
        gradient (Keras 3 unscales inside apply; tf_keras through get_unscaled_gradients first). A
        non-finite gradient in any piece makes the sum non-finite, so the whole update is skipped and the
        scale lowered, as the plain loop skips that batch. Near the overflow edge the split matters: a
        piece's float16 weight gradient sums fewer examples than the whole batch's, so at the same scale
        a split update can stay finite where the whole batch overflows (measured: pieces of 1 applied an
        update that one 16-example step skipped; tests/test_training_mixed_precision.py), and which
        updates are skipped then differs from the plain loop. Accumulators are float32 (the variables'
        dtype). Statistics divide by S (and S^2) so they describe the unscaled gradient.
        """
        import tensorflow as tf

        if self.loss_scaling == "keras":
            return tf.cast(self.optimizer.dynamic_scale, tf.float32)
        if self.loss_scaling == "tf_keras":
            return tf.cast(self.optimizer.loss_scale, tf.float32)
        return tf.constant(1.0, tf.float32)

    def _zero_accumulators(self) -> None:
        import tensorflow as tf

        for acc in self.accumulators:
            acc.assign(tf.zeros_like(acc))

    def reset_accumulators(self) -> None:
        """Zero the accumulators (after an update that could not finish)."""
        self._reset_accumulators()

    def _reset_accumulators(self) -> None:
        self._zero_accumulators()


class OneDeviceSteps(AccumulatingSteps):
    """The steps on one device, without a strategy; the only ones with gradient statistics."""

    def _compile(self, signature: list) -> None:
        import tensorflow as tf

        self.micro_step = tf.function(self._micro_step, input_signature=signature)
        self.apply_step = tf.function(self._apply_step)
        self.update_statistics = tf.function(self._update_statistics)

    def _micro_step(self, x: Any, y: Any, update_examples: Any) -> Any:
        self.traces["micro_step"] += 1  # runs while tracing only
        return self._accumulate_piece(x, y, update_examples)

    def _update_statistics(self) -> Any:
        """(|acc|^2, acc . previous, |previous|^2) in float32, then previous := acc.

    Statistics (`statistics=True`, what fit's adaptive batch needs; edgebatch/adapt/controller.py).
        The micro-step then also returns the squared norm of the piece's gradient contribution and the
        piece's per-example losses, and `update_statistics()` (run after the pieces, before
        `apply_step`) returns |accumulated gradient|^2, its dot product with the previous update's
        accumulated gradient and that one's squared norm, and then stores the current one as the
        previous: one more copy of the trainable variables (`previous`), checkpointed with the run. Not
        supported under a strategy.
        """
        import tensorflow as tf

        self.traces["update_statistics"] = self.traces.get("update_statistics", 0) + 1
        scale = self._loss_scale()
        reads = [tf.cast(acc.read_value(), tf.float32) / scale for acc in self.accumulators]
        olds = [tf.cast(prev.read_value(), tf.float32) for prev in self.previous]
        current_sq = tf.add_n([tf.reduce_sum(tf.square(a)) for a in reads])
        dot = tf.add_n([tf.reduce_sum(a * b) for a, b in zip(reads, olds)])
        previous_sq = tf.add_n([tf.reduce_sum(tf.square(b)) for b in olds])
        with tf.control_dependencies([current_sq, dot, previous_sq]):
            stores = [prev.assign(tf.cast(read, prev.dtype)) for prev, read in zip(self.previous, reads)]
        with tf.control_dependencies(stores):
            return tf.identity(current_sq), tf.identity(dot), tf.identity(previous_sq)

    def _apply_step(self) -> None:
        import tensorflow as tf

        self.traces["apply_step"] += 1
        gradients = [acc.read_value() for acc in self.accumulators]
        if self.loss_scaling == "tf_keras":
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.optimizer.apply_gradients(zip(gradients, self.variables))
        # Automatic control dependencies order these writes after the reads above (same resources).
        for acc in self.accumulators:
            acc.assign(tf.zeros_like(acc))


def _squared_norm(gradients: list) -> Any:
    """sum of |g|^2 over the variables' gradients, in float32; an IndexedSlices counts as its dense
    tensor (rows of repeated indices are summed first)."""
    import tensorflow as tf

    total = []
    for gradient in gradients:
        if isinstance(gradient, tf.IndexedSlices):
            unique, position = tf.unique(gradient.indices)
            rows = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(unique)[0])
            total.append(tf.reduce_sum(tf.square(tf.cast(rows, tf.float32))))
        else:
            total.append(tf.reduce_sum(tf.square(tf.cast(gradient, tf.float32))))
    return tf.add_n(total)


def _tensor_of(gradient: Any) -> Any:
    import tensorflow as tf

    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _accumulate(accumulator: Any, gradient: Any) -> Any:
    import tensorflow as tf

    if isinstance(gradient, tf.IndexedSlices):  # embeddings: add only the rows that were touched
        return accumulator.scatter_add(gradient)
    return accumulator.assign_add(gradient)
