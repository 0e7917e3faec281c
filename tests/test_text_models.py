"""The zoo's sequence models (edgebatch/models/text.py): variable length, padding ignored, both Keras worlds."""

import numpy as np
import pytest

from edgebatch.models import zoo
from edgebatch.models import text as models
from edgebatch.text.docstrings import LABEL_PACKAGES, PAD_ID

SEQUENCE_MODELS = ("transformer_tiny", "lstm_small")


def test_the_zoo_knows_them_and_their_lengths_without_tensorflow():
    for name in SEQUENCE_MODELS:
        assert name in zoo.BUILTIN_MODELS and zoo.parse_model_spec(name).kind == "builtin"
        assert zoo.SEQUENCE_MODEL_MAX_LENGTHS[name] == models.MAX_SEQUENCE_LENGTH
    assert models.CLASSES == len(LABEL_PACKAGES) and PAD_ID == 0


def padded(sequences, length):
    out = np.full((len(sequences), length), PAD_ID, dtype="int32")
    for row, sequence in enumerate(sequences):
        out[row, : len(sequence)] = sequence
    return out


@pytest.mark.parametrize("flavor", ["keras3", "tf_keras"])
@pytest.mark.parametrize("name", SEQUENCE_MODELS)
def test_any_length_and_padding_does_not_change_the_logits(name, flavor):
    if flavor == "tf_keras":
        model = zoo.build_base_model(zoo.parse_model_spec(name), optimize="qat")  # tf_keras, not yet wrapped
    else:
        model = zoo.build_model(zoo.parse_model_spec(name))
    assert zoo.keras_flavor(model) == flavor
    assert [tuple(t.shape) for t in model.inputs] == [(None, None)]
    assert tuple(model.outputs[0].shape) == (None, models.CLASSES)
    rng = np.random.default_rng(0)
    sequences = [rng.integers(1, models.VOCABULARY_SIZE, size=n) for n in (3, 10, 7)]
    logits = {length: np.asarray(model(padded(sequences, length), training=False)) for length in (10, 16, 40)}
    assert np.abs(logits[16] - logits[10]).max() < 1e-5
    assert np.abs(logits[40] - logits[10]).max() < 1e-5
    # The mask hides padding only: a real token changed moves that row's logits.
    changed = [s.copy() for s in sequences]
    changed[1][4] = 1 + changed[1][4] % (models.VOCABULARY_SIZE - 1)
    moved = np.asarray(model(padded(changed, 16), training=False))
    assert np.abs(moved[1] - logits[16][1]).max() > 1e-4
    assert np.abs(moved[0] - logits[16][0]).max() < 1e-5


def test_a_training_step_at_two_lengths_uses_one_trace():
    import keras
    import tensorflow as tf

    model = zoo.build_model(zoo.parse_model_spec("transformer_tiny"))
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)  # as the probe's trial and fit do: no variables made in the trace
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    traces = []

    @tf.function(input_signature=[tf.TensorSpec((None, None), tf.int32), tf.TensorSpec((None,), tf.int32)])
    def step(x, y):
        traces.append(1)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    for length in (8, 32):
        x = tf.random.uniform((4, length), 1, models.VOCABULARY_SIZE, tf.int32)
        assert np.isfinite(step(x, tf.zeros((4,), tf.int32)).numpy())
    assert len(traces) == 1
