"""fit on variable-length token sequences (training/sequences.py): examples kept unpadded, sorted by
length within each update, padded per micro-batch; the result equals the plain loop that pads each
whole update, with OOMs injected, for a model that masks its padding."""

import numpy as np
import pytest

from edgebatch.errors import UsageError
from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import fit, inject_oom
from edgebatch.training.sequences import length_order, pad_rows, ragged_rows

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

VOCABULARY = 50
CLASSES = 3
EFFECTIVE = 8


def sequences(count=40, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 30, size=count)
    tokens = [rng.integers(1, VOCABULARY, size=n).astype("int32") for n in lengths]
    labels = rng.integers(0, CLASSES, size=count).astype("int64")
    return tokens, labels


def dataset(tokens, labels):
    return tf.data.Dataset.from_generator(lambda: zip(tokens, labels), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)))


def masked_model():
    """Embedding with mask_zero, masked average, dense: padding (id 0) cannot reach the logits."""
    init = keras.initializers.GlorotUniform(seed=3)
    inputs = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(VOCABULARY, 8, mask_zero=True, embeddings_initializer=init)(inputs)
    pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, kernel_initializer=init)(pooled))


def plain_loop(tokens, labels):
    """One Adam step per consecutive update, the update padded to its own longest sequence."""
    model, optimizer = masked_model(), keras.optimizers.Adam(0.01)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for start in range(0, len(tokens), EFFECTIVE):
        x = pad_rows(np.array(tokens[start : start + EFFECTIVE] + [None], dtype=object)[:-1])
        with tf.GradientTape() as tape:
            value = loss(labels[start : start + EFFECTIVE], model(x, training=True))
        # Dense gradients, as fit's accumulators hold them: Keras 3's Adam treats an Embedding's
        # IndexedSlices with repeated ids differently from their dense sum (measured: 0.0097 apart
        # after one update of this model).
        gradients = [tf.convert_to_tensor(g) for g in tape.gradient(value, model.trainable_variables)]
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return model.get_weights()


def test_rows_pad_and_order_by_length():
    rows = ragged_rows(np.arange(6), np.array([0, 3, 3, 4, 6]))
    assert [list(r) for r in rows] == [[0, 1, 2], [], [3], [4, 5]]
    assert pad_rows(rows[[0, 3]]).tolist() == [[0, 1, 2], [4, 5, 0]]
    assert list(length_order([np.zeros(4), rows])) == [1, 2, 3, 0]
    assert length_order([np.zeros((4, 2))]) is None


@pytest.mark.parametrize("ceiling, failures", [(8, []), (3, [2]), (1, [])])
def test_variable_length_fit_equals_the_plain_padded_loop(ceiling, failures):
    tokens, labels = sequences()
    model = masked_model()
    governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=EFFECTIVE))
    with inject_oom(failures):
        report = fit(model, dataset(tokens, labels), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     optimizer=keras.optimizers.Adam(0.01), effective_batch=EFFECTIVE, governor=governor)
    assert report.examples_seen == 40 and len(report.oom_events) == len(failures)
    assert report.traces["micro_step"] == 1  # one trace serves every length
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), plain_loop(tokens, labels)))
    assert diff < 1e-5


def test_the_tolerance_tells_a_lost_example_from_rounding():
    tokens, labels = sequences()
    expected = plain_loop(tokens, labels)
    changed = plain_loop(tokens[:3] + [tokens[3][:1]] + tokens[4:], labels)  # one example cut short
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(changed, expected)) > 1e-3


def test_two_ragged_axes_are_a_one_line_usage_error():
    x = tf.ragged.constant([[[1, 2], [3]], [[4]]], dtype=tf.int32)
    data = tf.data.Dataset.from_tensor_slices((x, tf.constant([0, 1], tf.int64)))
    spec_model = masked_model()
    with pytest.raises(UsageError) as error:
        fit(spec_model, data, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=keras.optimizers.SGD(0.1), effective_batch=2)
    assert "\n" not in str(error.value)
