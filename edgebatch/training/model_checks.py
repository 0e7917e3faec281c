"""What fit and enable_micro_batching check on a model before they train it: its layers (those whose
output depends on the batch's own statistics, those that draw random numbers), the tf.distribute
strategy it was built under, and its precision (float16 needs loss scaling).

Moved out of steps.py, which still exports these names. TensorFlow is imported inside functions.
"""

from __future__ import annotations

from typing import Any

from edgebatch.errors import UsageError
from edgebatch.models.layers import all_layers  # importable from here, as before

__all__ = [
    "all_layers",
    "batch_norm_layers",
    "is_multi_worker",
    "loss_scale_kind",
    "mirrored_strategy_of",
    "random_layers",
    "refuse_unsupported_precision",
]

# Class names (anywhere in a layer's MRO) of layers whose training output depends on the batch's
# own statistics: BatchNormalization (Keras 3, tf_keras's BatchNormalizationBase and
# SyncBatchNormalization, subclasses of either) and TFMOT's quantization-aware wrappers, whose
# activation quantizers update moving min/max ranges from each batch and quantize with them.
_BATCH_NORM_CLASS_NAMES = frozenset({
    "BatchNormalization", "BatchNormalizationBase", "SyncBatchNormalization",
    "QuantizeWrapper", "QuantizeWrapperV2", "QuantizeLayer",
})


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
    `model.compile` does it by itself under that policy). steps.AccumulatingSteps._loss_scale says
    how fit keeps accumulation exact with it. mixed_bfloat16 needs no loss scaling.
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
