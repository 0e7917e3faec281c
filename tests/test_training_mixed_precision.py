"""edgebatch.fit under mixed precision: mixed_bfloat16, and mixed_float16 with a loss-scale optimizer.

Under mixed_bfloat16 the layers compute in bfloat16 (8 bits of mantissa) and keep float32
variables, so no loss scaling is needed and fit's accumulators stay float32. Exactness to 1e-4, as
in float32, is not on offer: the plain loop itself lands 2.4e-4 away from its float32 run after
these 4 updates (weights up to 0.74). Measured by hand on this model, fit against the plain
bfloat16 loop: 1.8e-4 to 2.5e-4 for every split and injected OOM tried. The tolerance below, 1e-3, is four times
that; leaving one example out of one update moves the plain loop 0.025 (checked in the test, so
the tolerance tells a lost example from rounding).
"""

import numpy as np
import pytest

from edgebatch.errors import UsageError
from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import fit, inject_oom
from test_training_support import (
    make_data,
    make_dataset,
    make_loss,
    make_model,
    make_optimizer,
    max_weight_diff,
    reference_weights,
)

keras = pytest.importorskip("keras")

EFFECTIVE = 16
BFLOAT16_TOLERANCE = 1e-3


@pytest.fixture
def mixed_bfloat16():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("ceiling,failures", [(16, []), (5, [2]), (1, [])])
def test_mixed_bfloat16_fit_matches_the_plain_mixed_loop(mixed_bfloat16, optimizer, ceiling, failures):
    x, y = make_data(50)
    expected = reference_weights(x, y, EFFECTIVE, optimizer)
    model = make_model()
    assert model.layers[0].dtype_policy.name == "mixed_bfloat16" and model.weights[0].dtype == "float32"
    governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=EFFECTIVE))
    with inject_oom(failures):
        report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer(optimizer),
                     effective_batch=EFFECTIVE, governor=governor)
    assert max_weight_diff(model.get_weights(), expected) < BFLOAT16_TOLERANCE
    assert report.examples_seen == 50 and len(report.oom_events) == len(failures)
    assert [record.examples for record in report.updates] == [16, 16, 16, 2]


def test_the_tolerance_tells_a_lost_example_from_rounding(mixed_bfloat16):
    import tensorflow as tf

    x, y = make_data(50)
    expected = reference_weights(x, y, EFFECTIVE, "adam")
    # The plain loop with example 3 left out of the first update and every other update as it was
    # (measured: 0.025 from the full run, 25 times the tolerance).
    model, optimizer, loss = make_model(), make_optimizer("adam"), make_loss()
    updates = [np.r_[0:3, 4:16]] + [np.arange(start, min(start + EFFECTIVE, 50)) for start in range(16, 50, 16)]
    for rows in updates:
        with tf.GradientTape() as tape:
            value = loss(y[rows], model(x[rows], training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
    assert max_weight_diff(model.get_weights(), expected) > 3 * BFLOAT16_TOLERANCE


# --- mixed_float16: loss scaling ---------------------------------------------------------------------
# float16 keeps 11 bits of mantissa. Measured by hand, fit against the plain loss-scaled loop on this
# model: 2.1e-5 to 3.4e-5 for the splits and OOMs below (0 when the split is the whole batch). The
# tolerance, 2e-4, is six times that; leaving one example out of the first update moves the plain
# SGD loop 0.0037 and the Adam loop 0.025 (checked below).
FLOAT16_TOLERANCE = 2e-4


def float16_model(keras_module=keras):
    keras_module.mixed_precision.set_global_policy("mixed_float16")
    try:
        return make_model(keras_module)
    finally:
        keras_module.mixed_precision.set_global_policy("float32")


def scaled_optimizer(name, keras_module=keras, **kwargs):
    inner = make_optimizer(name, keras_module)
    if keras_module is keras:
        return keras.optimizers.LossScaleOptimizer(inner, **kwargs)
    return keras_module.mixed_precision.LossScaleOptimizer(inner, **kwargs)


def plain_scaled_loop(x, y, optimizer_name, epochs=1, keras_module=keras, leave_out=None, **kwargs):
    """One loss-scaled step per consecutive chunk of EFFECTIVE (example `leave_out` dropped from the first)."""
    import tensorflow as tf

    model, optimizer, loss = float16_model(keras_module), scaled_optimizer(optimizer_name, keras_module, **kwargs), \
        make_loss(keras_module)
    for _ in range(epochs):
        for start in range(0, len(x), EFFECTIVE):
            rows = np.arange(start, min(start + EFFECTIVE, len(x)))
            if leave_out is not None and start == 0:
                rows = rows[rows != leave_out]
            with tf.GradientTape() as tape:
                value = loss(y[rows], model(x[rows], training=True))
                scaled = optimizer.scale_loss(value) if keras_module is keras else optimizer.get_scaled_loss(value)
            gradients = tape.gradient(scaled, model.trainable_variables)
            if keras_module is not keras:
                gradients = optimizer.get_unscaled_gradients(gradients)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return model.get_weights(), optimizer


def governed_float16(x, y, optimizer_name, ceiling, failures=(), epochs=1, keras_module=keras, **kwargs):
    model, optimizer = float16_model(keras_module), scaled_optimizer(optimizer_name, keras_module, **kwargs)
    assert model.layers[0].compute_dtype == "float16" and model.weights[0].dtype == "float32"
    governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=EFFECTIVE))
    with inject_oom(list(failures)):
        report = fit(model, make_dataset(x, y), loss=make_loss(keras_module), optimizer=optimizer,
                     effective_batch=EFFECTIVE, governor=governor, epochs=epochs)
    return model, optimizer, report


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("ceiling,failures", [(16, []), (5, [2]), (1, [])])
def test_mixed_float16_fit_matches_the_plain_loss_scaled_loop(optimizer, ceiling, failures):
    x, y = make_data(50)
    expected, _ = plain_scaled_loop(x, y, optimizer)
    model, _, report = governed_float16(x, y, optimizer, ceiling, failures)
    assert max_weight_diff(model.get_weights(), expected) < FLOAT16_TOLERANCE
    assert report.examples_seen == 50 and len(report.oom_events) == len(failures)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_float16_tolerance_tells_a_lost_example_from_rounding(optimizer):
    x, y = make_data(50)
    expected, _ = plain_scaled_loop(x, y, optimizer)
    lost, _ = plain_scaled_loop(x, y, optimizer, leave_out=3)
    assert max_weight_diff(lost, expected) > 3 * FLOAT16_TOLERANCE


def test_overflowing_updates_are_skipped_and_the_scale_lowered_as_in_the_plain_loop():
    # At a loss scale of 3 x 2^18 the float16 gradients of a 16-example batch overflow: the plain
    # loop skips updates 1, 2 and 4 and halves the scale each time (to 98,304). Run in one piece,
    # fit skips the same updates and ends with the same weights.
    x, y = make_data(50)
    expected, plain_optimizer = plain_scaled_loop(x, y, "sgd", epochs=3, initial_scale=3 * 2.0**18)
    model, optimizer, _ = governed_float16(x, y, "sgd", ceiling=16, epochs=3, initial_scale=3 * 2.0**18)
    assert float(optimizer.dynamic_scale.numpy()) == float(plain_optimizer.dynamic_scale.numpy()) == 98304.0
    assert max_weight_diff(model.get_weights(), float16_model().get_weights()) > 0.01  # it did train
    assert max_weight_diff(model.get_weights(), expected) < FLOAT16_TOLERANCE


def test_near_the_overflow_edge_pieces_overflow_less_than_the_whole_batch():
    # A piece's float16 weight gradient sums fewer examples than the whole batch's, so at the same
    # scale it overflows later: in pieces of 1, update 1 fits at 3 x 2^18 where the whole batch
    # overflowed (measured). The update is then applied where the plain loop skips it: which
    # updates are skipped depends on the split near the edge (the module docstring of steps.py).
    x, y = make_data(50)
    scales = []
    model, optimizer = float16_model(), scaled_optimizer("sgd", initial_scale=3 * 2.0**18)
    fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=EFFECTIVE, epochs=3,
        governor=Governor(GovernorConfig(ceiling_batch=1, effective_batch=EFFECTIVE)),
        on_update=lambda record: scales.append(float(optimizer.dynamic_scale.numpy())))
    assert scales[0] == 3 * 2.0**18  # applied, not skipped (a skip halves the scale)
    assert scales[-1] < scales[0] and np.all(np.isfinite(np.concatenate([w.ravel() for w in model.get_weights()])))


def test_tf_keras_loss_scale_optimizer_matches_its_plain_loop():
    tf_keras = pytest.importorskip("tf_keras")
    x, y = make_data(50)
    expected, plain_optimizer = plain_scaled_loop(x, y, "sgd", keras_module=tf_keras)
    model, optimizer, _ = governed_float16(x, y, "sgd", ceiling=5, failures=[2], keras_module=tf_keras)
    assert float(optimizer.loss_scale.numpy()) == float(plain_optimizer.loss_scale.numpy())
    assert max_weight_diff(model.get_weights(), expected) < FLOAT16_TOLERANCE


def test_mixed_float16_without_a_loss_scale_optimizer_is_refused_in_one_line():
    x, y = make_data(16)
    with pytest.raises(UsageError, match="LossScaleOptimizer") as error:
        fit(float16_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
            effective_batch=EFFECTIVE)
    assert "\n" not in str(error.value) and "mixed_float16" in str(error.value)
