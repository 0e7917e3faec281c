"""The two compiled steps of governed training: accumulate one micro-batch, apply one update.

Exactness. Each micro-step adds the gradient of

    sum(per-example losses of the micro-batch) / update_examples
    + regularization losses x micro_examples / update_examples

into accumulator variables, so after the pieces of an update the accumulators hold the gradient of
the update's mean loss (plus the regularization losses once) whatever the split. The apply step
hands them to the optimizer and zeroes them.

One trace. `update_examples` is a float32 tensor and the batch dimension of the input signature is
None, so micro-batches of any size and any split reuse one concrete function
(docs/tensorflow-memory.md, "tf.function retracing": without an input signature every new batch size
retraces). The Python loops over variables below run at trace time only; the hot path is one call
per micro-batch and one per update.

OOM safety. Every accumulator update depends on *all* gradients of the micro-batch (a control
dependency), so a micro-step that runs out of memory anywhere in its forward or backward pass has
added nothing: the loop can re-run the same examples in smaller pieces. What a failed attempt
cannot undo is state the forward pass itself writes (BatchNormalization's moving statistics, a
stateful random generator): those see the retried examples twice.

TensorFlow is imported inside functions so that importing edgebatch.training stays cheap.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from edgebatch.errors import UsageError

__all__ = [
    "AccumulatingSteps",
    "batch_norm_layers",
    "per_example_loss",
    "random_layers",
    "refuse_distribution_strategy",
    "refuse_unsupported_precision",
]

# Class names (anywhere in a layer's MRO) of layers that normalize by batch statistics in training:
# Keras 3, tf_keras (BatchNormalizationBase, SyncBatchNormalization) and subclasses of either.
_BATCH_NORM_CLASS_NAMES = frozenset({"BatchNormalization", "BatchNormalizationBase", "SyncBatchNormalization"})


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


def _all_layers(model: Any) -> list:
    """The model and every layer inside it, nested models included (Keras 3 and tf_keras)."""
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=True, recursive=True))
    return [model]


def batch_norm_layers(model: Any) -> list[str]:
    """Names of the layers (nested models included) that normalize by batch statistics."""
    return [
        getattr(layer, "name", type(layer).__name__)
        for layer in _all_layers(model)
        if any(cls.__name__ in _BATCH_NORM_CLASS_NAMES for cls in type(layer).__mro__)
    ]


def random_layers(model: Any) -> list[str]:
    """Names of the layers that draw random numbers in training (Dropout, random augmentation).

    Keras 3 layers hold SeedGenerators in `_seed_generators`; tf_keras random layers hold a
    `_random_generator`. Each micro-step draws its own masks, so a split run draws other (equally
    distributed) masks than one step over the whole batch.
    """
    return [
        getattr(layer, "name", type(layer).__name__)
        for layer in _all_layers(model)
        if getattr(layer, "_seed_generators", None) or getattr(layer, "_random_generator", None) is not None
    ]


def refuse_distribution_strategy(model: Any) -> None:
    """UsageError when a tf.distribute strategy (other than the default) is active or built the model.

    fit runs every micro-step on one device with plain accumulator variables; under a strategy it
    would silently train one replica (or fail deep inside a replica context).
    """
    import tensorflow as tf

    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    # Keras 3 records the strategy a model was built under in `_distribute_strategy`, tf_keras in
    # `_distribution_strategy`: calling fit outside the scope does not make its variables local.
    strategy = strategy or getattr(model, "_distribute_strategy", None) or getattr(model, "_distribution_strategy", None)
    if strategy is not None:
        raise UsageError(
            f"edgebatch.training.fit does not support tf.distribute strategies yet, got {type(strategy).__name__}: "
            "build the model and call fit outside any strategy.scope() (one device)"
        )


def refuse_unsupported_precision(model: Any, optimizer: Any) -> None:
    """UsageError for float16 mixed precision, which fit does not support yet.

    float16 needs dynamic loss scaling, and a loss scale that changes between the micro-batches of
    one update would mix differently scaled gradients in the accumulators; the Keras integration
    (keras_integration.py) supports it because there the loss-scale optimizer sees whole batches.
    mixed_bfloat16 needs no loss scaling and works.
    """
    for layer in _all_layers(model):
        policy = getattr(layer, "dtype_policy", None)
        if getattr(policy, "name", None) == "mixed_float16":
            raise UsageError(
                f"edgebatch.training.fit does not support the mixed_float16 dtype policy yet (layer "
                f"{getattr(layer, 'name', layer)!r}): use mixed_bfloat16 or float32, or model.fit with "
                "edgebatch.training.keras_integration"
            )
    if "LossScaleOptimizer" in type(optimizer).__name__:
        raise UsageError(
            f"edgebatch.training.fit does not support loss-scale optimizers yet, got {type(optimizer).__name__}; "
            "pass the inner optimizer and use float32 or mixed_bfloat16"
        )


def _batched_spec(spec: Any) -> Any:
    import tensorflow as tf

    if not isinstance(spec, tf.TensorSpec):
        raise UsageError(f"dataset components must be dense tensors, got {spec!r}")
    return tf.TensorSpec([None, *spec.shape], spec.dtype, name=spec.name)


class AccumulatingSteps:
    """The micro-step and apply-step tf.functions for one model, loss, optimizer and element spec.

    `micro_step(x, y, update_examples) -> loss_sum` (sum of the micro-batch's per-example losses)
    and `apply_step()`. `traces` counts traces of each; both should stay at 1 (apply_step traces
    twice with optimizers that create their slots on first use, e.g. tf_keras legacy ones).
    Each instance (each fit call) traces its own functions, so a process that calls fit five
    times or more sees TensorFlow's "frequent retracing" warning, which counts traces per Python
    function across instances; `traces` is the per-call truth.
    """

    def __init__(self, model: Any, loss: Any, optimizer: Any, element_spec: Any) -> None:
        import tensorflow as tf

        self.model = model
        self.optimizer = optimizer
        self.variables = list(model.trainable_variables)
        if not self.variables:
            raise UsageError(
                f"model {getattr(model, 'name', model)!r} has no trainable variables: build it first "
                "(give it a keras.Input or call it on one batch)"
            )
        self.accumulators = [
            tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"edgebatch_accumulator_{i}")
            for i, v in enumerate(self.variables)
        ]
        self.traces = {"micro_step": 0, "apply_step": 0}
        self._loss = per_example_loss(loss)
        x_spec, y_spec = element_spec
        signature = [
            tf.nest.map_structure(_batched_spec, x_spec),
            tf.nest.map_structure(_batched_spec, y_spec),
            tf.TensorSpec([], tf.float32, name="update_examples"),
        ]
        self.micro_step = tf.function(self._micro_step, input_signature=signature)
        self.apply_step = tf.function(self._apply_step)

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

    def _micro_step(self, x: Any, y: Any, update_examples: Any) -> Any:
        import tensorflow as tf

        self.traces["micro_step"] += 1  # runs while tracing only
        with tf.GradientTape() as tape:
            y_pred = self.model(x, training=True)
            per_example = self._per_example(y, y_pred)
            loss_sum = tf.reduce_sum(per_example)
            objective = loss_sum / update_examples
            if self.model.losses:
                share = tf.cast(tf.shape(per_example)[0], tf.float32) / update_examples
                regularization = tf.add_n([tf.cast(tf.reduce_sum(l), tf.float32) for l in self.model.losses])
                objective += regularization * share
        gradients = tape.gradient(objective, self.variables)
        gradients = [tf.zeros_like(v) if g is None else g for g, v in zip(gradients, self.variables)]
        # All gradients exist before any accumulator moves: see "OOM safety" in the module docstring.
        with tf.control_dependencies([_tensor_of(g) for g in gradients]):
            updates = [_accumulate(acc, g) for acc, g in zip(self.accumulators, gradients)]
        with tf.control_dependencies(updates):
            return tf.identity(loss_sum)

    def _apply_step(self) -> None:
        import tensorflow as tf

        self.traces["apply_step"] += 1
        self.optimizer.apply_gradients(zip([acc.read_value() for acc in self.accumulators], self.variables))
        # Automatic control dependencies order these writes after the reads above (same resources).
        for acc in self.accumulators:
            acc.assign(tf.zeros_like(acc))

    def reset_accumulators(self) -> None:
        """Zero the accumulators (after an update that could not finish)."""
        import tensorflow as tf

        for acc in self.accumulators:
            acc.assign(tf.zeros_like(acc))


def _tensor_of(gradient: Any) -> Any:
    import tensorflow as tf

    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _accumulate(accumulator: Any, gradient: Any) -> Any:
    import tensorflow as tf

    if isinstance(gradient, tf.IndexedSlices):  # embeddings: add only the rows that were touched
        return accumulator.scatter_add(gradient)
    return accumulator.assign_add(gradient)
