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

TensorFlow is imported inside functions so that importing edgebatch.training stays cheap.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from edgebatch.errors import UsageError

__all__ = [
    "AccumulatingSteps",
    "all_layers",
    "batch_norm_layers",
    "per_example_loss",
    "random_layers",
    "mirrored_strategy_of",
    "refuse_unsupported_precision",
]

# What an injected replica OOM allocates (float32 elements, 4 TiB): more than any device holds, so
# the allocator itself raises ResourceExhaustedError inside that replica's step.
_INJECTED_OOM_ELEMENTS = 1 << 40

# Class names (anywhere in a layer's MRO) of layers whose training output depends on the batch's
# own statistics: BatchNormalization (Keras 3, tf_keras's BatchNormalizationBase and
# SyncBatchNormalization, subclasses of either) and TFMOT's quantization-aware wrappers, whose
# activation quantizers update moving min/max ranges from each batch and quantize with them.
_BATCH_NORM_CLASS_NAMES = frozenset({
    "BatchNormalization", "BatchNormalizationBase", "SyncBatchNormalization",
    "QuantizeWrapper", "QuantizeWrapperV2", "QuantizeLayer",
})


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


def all_layers(model: Any) -> list:
    """The model and every layer inside it, nested models included (Keras 3 and tf_keras)."""
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=True, recursive=True))
    return [model]


def batch_norm_layers(model: Any) -> list[str]:
    """Names of the layers (nested models included) whose training output uses the batch's own
    statistics: BatchNormalization, and TFMOT's quantize wrappers (QAT's moving activation ranges)."""
    return [
        getattr(layer, "name", type(layer).__name__)
        for layer in all_layers(model)
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
        for layer in all_layers(model)
        if getattr(layer, "_seed_generators", None) or getattr(layer, "_random_generator", None) is not None
    ]


def is_multi_worker(strategy: Any) -> bool:
    """True for a tf.distribute.MultiWorkerMirroredStrategy."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def mirrored_strategy_of(model: Any, optimizer: Any) -> Any:
    """The tf.distribute.MirroredStrategy fit runs `model` under, or None for plain one-device training.

    The strategy is the active one (fit called inside `strategy.scope()`) or the one the model was
    built under (fit called outside it). UsageError for any other strategy (fit has no support for
    them), for a model built outside the active MirroredStrategy's scope (its variables are not
    mirrored) and for an optimizer created outside it (its slots would not be mirrored).
    """
    import tensorflow as tf

    active = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    built = getattr(model, "_distribute_strategy", None) or getattr(model, "_distribution_strategy", None)
    strategy = active or built
    if strategy is None:
        return None
    if not isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
        raise UsageError(
            f"edgebatch.training.fit supports only tf.distribute.MirroredStrategy and MultiWorkerMirroredStrategy, "
            f"got {type(strategy).__name__}: use one of them, or build the model and call fit outside any "
            "strategy.scope() (one device)"
        )
    if built is not strategy or not all(_is_distributed(v) for v in model.trainable_variables):
        raise UsageError(
            f"fit runs under {type(strategy).__name__}, but model {getattr(model, 'name', model)!r} was not built "
            "under its scope (its variables are not mirrored): build the model inside strategy.scope()"
        )
    if getattr(optimizer, "_distribution_strategy", strategy) is not strategy:
        raise UsageError(
            f"fit runs under {type(strategy).__name__}, but the optimizer {type(optimizer).__name__} was created "
            "outside its scope: create (or compile) it inside strategy.scope()"
        )
    return strategy


def _is_distributed(variable: Any) -> bool:
    import tensorflow as tf

    inner = variable if isinstance(variable, tf.Variable) else getattr(variable, "value", variable)  # Keras 3
    return isinstance(inner, tf.distribute.DistributedValues)


def loss_scale_kind(optimizer: Any) -> str | None:
    """"keras" for a Keras 3 LossScaleOptimizer, "tf_keras" for a tf_keras one, else None."""
    # tf_keras names its classes LossScaleOptimizerV3 / BaseLossScaleOptimizer.
    if not any("LossScaleOptimizer" in cls.__name__ for cls in type(optimizer).__mro__):
        return None
    return "tf_keras" if callable(getattr(optimizer, "get_scaled_loss", None)) else "keras"


def refuse_unsupported_precision(model: Any, optimizer: Any, strategy: Any = None) -> None:
    """UsageError for float16 mixed precision without a loss-scale optimizer, and for loss scaling
    under a strategy (untested there).

    mixed_float16 needs dynamic loss scaling (float16 gradients underflow): wrap the optimizer in
    keras.optimizers.LossScaleOptimizer (tf_keras: tf_keras.mixed_precision.LossScaleOptimizer;
    `model.compile` does it by itself under that policy). See "Loss scaling" in the module
    docstring for how fit keeps accumulation exact with it. mixed_bfloat16 needs no loss scaling.
    """
    scaled = loss_scale_kind(optimizer) is not None
    if scaled and strategy is not None:
        raise UsageError(
            f"edgebatch.training.fit does not support {type(optimizer).__name__} under a tf.distribute "
            "strategy yet: train on one device, or use mixed_bfloat16 (no loss scaling)"
        )
    if scaled:
        return
    for layer in all_layers(model):
        policy = getattr(layer, "dtype_policy", None)
        if getattr(policy, "name", None) == "mixed_float16":
            raise UsageError(
                f"layer {getattr(layer, 'name', layer)!r} computes in float16 (mixed_float16), which needs loss "
                f"scaling: pass optimizer=keras.optimizers.LossScaleOptimizer({type(optimizer).__name__}(...)) "
                "(tf_keras: tf_keras.mixed_precision.LossScaleOptimizer), or compile the model with the "
                "policy set, which wraps it"
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

    One trace. `update_examples` is a float32 tensor and the batch dimension of the input signature is
    None, so micro-batches of any size and any split reuse one concrete function
    (docs/tensorflow-memory.md, "tf.function retracing": without an input signature every new batch size
    retraces). The Python loops over variables below run at trace time only; the hot path is one call
    per micro-batch and one per update.

    MirroredStrategy. With a strategy, the accumulators are ON_READ/SUM variables (each replica sums
    its own gradients: no all-reduce per micro-step), the micro-step runs `strategy.run` with the
    global piece and each replica slices its even share (replicas.replica_shares) by its replica id,
    and the apply step runs the optimizer in replica context, where Keras sums the replicas' gradients
    once. OOM safety across replicas: each replica's accumulator updates also wait for a scalar
    all-reduce that completes only once every replica has all its gradients, so a replica that runs
    out of memory leaves every replica's accumulators untouched. Every replica receives the whole
    global piece's input tensor and slices it on its device (input copies are the global piece's
    size, not the share's).
    """

    def __init__(self, model: Any, loss: Any, optimizer: Any, element_spec: Any, strategy: Any = None,
                 statistics: bool = False) -> None:
        import contextlib

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
        # Under a strategy each replica sums its own gradients (ON_READ: no all-reduce per
        # micro-step); reading them in the apply step's replica context gives the local sums, which
        # the optimizer all-reduces once per update.
        local = {} if strategy is None else {"synchronization": tf.VariableSynchronization.ON_READ,
                                              "aggregation": tf.VariableAggregation.SUM}
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            self.accumulators = [
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"edgebatch_accumulator_{i}", **local)
                for i, v in enumerate(self.variables)
            ]
        self.traces = {"micro_step": 0, "apply_step": 0}
        self.loss_scaling = loss_scale_kind(optimizer)
        self.statistics = statistics
        if statistics and strategy is not None:
            raise UsageError("gradient statistics (fit's adapt=...) are not supported under a tf.distribute strategy yet")
        # The previous update's accumulated gradient (statistics only): cosine between updates.
        self.previous = [
            tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"edgebatch_previous_gradient_{i}")
            for i, v in enumerate(self.variables)
        ] if statistics else []
        self._loss = per_example_loss(loss)
        x_spec, y_spec = element_spec
        signature = [
            tf.nest.map_structure(_batched_spec, x_spec),
            tf.nest.map_structure(_batched_spec, y_spec),
            tf.TensorSpec([], tf.float32, name="update_examples"),
        ]
        # MultiWorkerMirroredStrategy (workers.py): each worker accumulates its own share locally,
        # with no collective in the micro-step; the optimizer's all-reduce sums the workers' sums.
        self.local_steps = strategy is not None and is_multi_worker(strategy)
        if strategy is None:
            self.micro_step = tf.function(self._micro_step, input_signature=signature)
            self.apply_step = tf.function(self._apply_step)
            self.update_statistics = tf.function(self._update_statistics)
        elif self.local_steps:
            self.micro_step = tf.function(self._worker_micro_step, input_signature=signature)
            self.apply_step = tf.function(self._mirrored_apply_step)
            self._reset = tf.function(lambda: strategy.run(self._zero_accumulators))
            _resolve_replica_group(strategy)
        else:
            # `oom_replica`: the replica that must run out of memory in this call (injection), -1: none.
            signature.append(tf.TensorSpec([], tf.int32, name="oom_replica"))
            self.micro_step = tf.function(self._mirrored_micro_step, input_signature=signature)
            self.apply_step = tf.function(self._mirrored_apply_step)
            self._reset = tf.function(lambda: strategy.run(self._zero_accumulators))
            _resolve_replica_group(strategy)

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

    def _worker_micro_step(self, x: Any, y: Any, update_examples: Any) -> Any:
        """This worker's piece on its one replica; its local loss sum (no collective)."""
        self.traces["micro_step"] += 1
        per_replica = self.strategy.run(self._accumulate_piece, args=(x, y, update_examples))
        return self.strategy.experimental_local_results(per_replica)[0]

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

    def _mirrored_micro_step(self, x: Any, y: Any, update_examples: Any, oom_replica: Any) -> Any:
        import tensorflow as tf

        self.traces["micro_step"] += 1
        per_replica = self.strategy.run(self._replica_micro_step, args=(x, y, update_examples, oom_replica))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _replica_micro_step(self, x: Any, y: Any, update_examples: Any, oom_replica: Any) -> Any:
        """One replica's share of a global piece: examples [start, start + size) as in replicas.replica_shares."""
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
        total = tf.shape(tf.nest.flatten(y)[0])[0]
        base, extra = total // self.replicas, total % self.replicas
        start = replica * base + tf.minimum(replica, extra)
        size = base + tf.cast(replica < extra, tf.int32)
        pick = lambda t: t[start : start + size]  # noqa: E731
        xs, ys = tf.nest.map_structure(pick, x), tf.nest.map_structure(pick, y)

        def barrier(ready: list) -> Any:
            # After this replica's gradients: the injected allocation (1 element unless this replica
            # must fail), then a scalar all-reduce that completes only when every replica got here.
            # The allocation is a stateful op, which Grappler neither folds nor prunes (measured: it
            # drops a reduce_sum over tf.fill(..., 0.0), and the injected OOM with it).
            with tf.control_dependencies(ready):
                elements = tf.where(tf.equal(replica, oom_replica), tf.constant(_INJECTED_OOM_ELEMENTS, tf.int64),
                                    tf.constant(1, tf.int64))
                token = tf.reduce_min(tf.random.uniform(tf.reshape(elements, [1]), dtype=tf.float32))
            return context.all_reduce(tf.distribute.ReduceOp.SUM, token)

        return self._accumulate_piece(xs, ys, update_examples, barrier)

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

    def _mirrored_apply_step(self) -> None:
        self.traces["apply_step"] += 1
        self.strategy.run(self._replica_apply_step)

    def _replica_apply_step(self) -> None:
        # In replica context an ON_READ accumulator reads as this replica's own sum; the optimizer
        # all-reduces (sums) the gradients across replicas before updating the mirrored variables.
        self.optimizer.apply_gradients(zip([acc.read_value() for acc in self.accumulators], self.variables))
        self._zero_accumulators()

    def _zero_accumulators(self) -> None:
        import tensorflow as tf

        for acc in self.accumulators:
            acc.assign(tf.zeros_like(acc))

    def reset_accumulators(self) -> None:
        """Zero the accumulators (after an update that could not finish)."""
        if self.strategy is not None:
            self._reset()  # each replica zeroes its own sums
            return
        self._zero_accumulators()


def _resolve_replica_group(strategy: Any) -> None:
    """Run one scalar all-reduce over the replicas before any step can fail.

    A collective that TensorFlow aborts (one replica ran out of memory while the others waited in
    the all-reduce) cancels every replica group whose members have not met yet, for the life of the
    process: if the very first micro-step ran out of memory, every later step would fail with
    "group is cancelled" (seen with MirroredStrategy on two logical CPUs). Once the group has met,
    an abort cancels only that step, and the retry runs.
    """
    import tensorflow as tf

    def replica_fn() -> Any:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(1.0))

    tf.function(lambda: strategy.run(replica_fn))()


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
