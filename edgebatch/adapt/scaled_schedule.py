"""A Keras learning-rate schedule multiplied by a mutable factor: scale a schedule, never replace it.

`ScaledSchedule(schedule)` returns schedule(step) x factor, where the factor is a non-trainable
float32 tf.Variable: `set_factor` changes it between steps and a traced tf.function sees the new
value without retracing (it reads the variable). The inner schedule keeps its own shape (warm-up,
decay, ...); the factor is what the batch-size policy's LR rule (lr_coupling.py) says.

This is the only module of edgebatch.adapt that imports TensorFlow/Keras, at import time; the
package's __init__ does not import it. `ScaledSchedule` is for Keras 3 schedules
(keras.optimizers.schedules); `wrap_schedule` also wraps a tf_keras (Keras 2) schedule, picking the
LearningRateSchedule base class the schedule itself derives from.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

__all__ = ["ScaledSchedule", "is_schedule", "wrap_schedule"]


def _make_class(base: type) -> type:
    class _Scaled(base):  # type: ignore[misc, valid-type]
        """schedule(step) x factor (a tf.Variable); see the module docstring."""

        def __init__(self, schedule: Any, factor: float = 1.0) -> None:
            super().__init__()
            if not isinstance(schedule, base):
                raise TypeError(f"ScaledSchedule wraps a {base.__module__}.LearningRateSchedule, got {schedule!r}")
            self.schedule = schedule
            self.factor = tf.Variable(float(factor), dtype=tf.float32, trainable=False, name="lr_schedule_factor")

        def set_factor(self, factor: float) -> None:
            self.factor.assign(float(factor))

        def __call__(self, step: Any) -> Any:
            rate = self.schedule(step)
            return rate * tf.cast(self.factor, tf.convert_to_tensor(rate).dtype)

        def get_config(self) -> dict:
            return {
                "schedule": keras.saving.serialize_keras_object(self.schedule)
                if base is keras.optimizers.schedules.LearningRateSchedule
                else self.schedule,
                "factor": float(self.factor.numpy()),
            }

        @classmethod
        def from_config(cls, config: dict) -> Any:
            schedule = config["schedule"]
            if isinstance(schedule, dict):
                schedule = keras.saving.deserialize_keras_object(schedule)
            return cls(schedule, config.get("factor", 1.0))

    _Scaled.__name__ = _Scaled.__qualname__ = "ScaledSchedule"
    _Scaled.__module__ = __name__
    return _Scaled


ScaledSchedule = keras.saving.register_keras_serializable(package="edgebatch")(
    _make_class(keras.optimizers.schedules.LearningRateSchedule)
)
_CLASSES: dict[type, type] = {keras.optimizers.schedules.LearningRateSchedule: ScaledSchedule}


def _schedule_base(value: Any) -> type | None:
    for klass in type(value).__mro__:
        if klass.__name__ == "LearningRateSchedule" and "schedule" in klass.__module__:
            return klass
    return None


def is_schedule(value: Any) -> bool:
    """True for a Keras 3 or tf_keras LearningRateSchedule instance."""
    return _schedule_base(value) is not None


def wrap_schedule(schedule: Any, factor: float = 1.0) -> Any:
    """`schedule` x a mutable factor, as an instance of the same Keras flavour's LearningRateSchedule."""
    base = _schedule_base(schedule)
    if base is None:
        raise TypeError(f"not a LearningRateSchedule: {schedule!r}")
    if base not in _CLASSES:
        _CLASSES[base] = _make_class(base)
    return _CLASSES[base](schedule, factor)
