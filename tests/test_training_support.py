"""Shared helpers for the tests of edgebatch.training (holds no tests itself).

Tiny Dense models on seeded random data, and the plain reference loop every governed run must
match: one optimizer step per consecutive `effective_batch` chunk with the mean loss.
"""

from __future__ import annotations

import numpy as np

FEATURES = 5
CLASSES = 3


def make_data(examples: int = 50, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(examples, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=examples).astype("int64")
    return x, y


def make_dataset(x: np.ndarray, y: np.ndarray):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((x, y))


def make_model(keras_module=None, seed: int = 1):
    """Dense -> tanh -> Dense logits, no batch-dependent layer; seeded so every process builds the same."""
    if keras_module is None:
        import keras as keras_module
    init = keras_module.initializers.GlorotUniform(seed=seed)
    return keras_module.Sequential(
        [
            keras_module.Input((FEATURES,)),
            keras_module.layers.Dense(8, activation="tanh", kernel_initializer=init, name="hidden"),
            keras_module.layers.Dense(CLASSES, kernel_initializer=init, name="logits"),
        ]
    )


def make_loss(keras_module=None):
    if keras_module is None:
        import keras as keras_module
    return keras_module.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_optimizer(name: str, keras_module=None):
    if keras_module is None:
        import keras as keras_module
    if name == "sgd":
        return keras_module.optimizers.SGD(learning_rate=0.1)
    if name == "adam":
        return keras_module.optimizers.Adam(learning_rate=0.01)
    raise ValueError(f"unknown optimizer {name!r}")


def reference_weights(x, y, effective_batch: int, optimizer: str, epochs: int = 1, model=None) -> list[np.ndarray]:
    """Weights after plain training: one step per consecutive chunk of `effective_batch`, mean loss."""
    import tensorflow as tf

    model = model if model is not None else make_model()
    opt = make_optimizer(optimizer)
    loss = make_loss()
    for _ in range(epochs):
        for start in range(0, len(x), effective_batch):
            xs, ys = x[start : start + effective_batch], y[start : start + effective_batch]
            with tf.GradientTape() as tape:
                value = loss(ys, model(xs, training=True))
            grads = tape.gradient(value, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    return [np.array(w) for w in model.get_weights()]


def max_weight_diff(a: list, b: list) -> float:
    assert len(a) == len(b)
    return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in zip(a, b))


class FixedPressure:
    """A stand-in PressureReader: every read returns the same pressure (fit only calls .read())."""

    def __init__(self, pressure: float) -> None:
        self.pressure = pressure
        self.reads = 0

    def read(self, force: bool = False):
        from edgebatch.governor import Observation

        self.reads += 1
        return Observation(pressure=self.pressure)
