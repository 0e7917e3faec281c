"""A real ResourceExhaustedError inside the compiled micro-step, after part of the update was
accumulated: fit re-runs the update's remaining examples in smaller pieces and ends with the plain
loop's weights.

Every other OOM test injects the failure before the step runs (injection.py). Here a weightless
identity layer asks TensorFlow's CPU allocator for 1 PiB on its Nth execution, in the forward pass
or in its gradient: the allocator refuses it with a genuine `ResourceExhaustedError` ("OOM when
allocating tensor") from inside the traced function, without touching the machine's memory (the
request is above the allocator's limit, so nothing is reserved).
"""

import numpy as np
import pytest

from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import fit
from test_training_support import (
    make_data,
    make_dataset,
    make_loss,
    make_model,
    make_optimizer,
    max_weight_diff,
    reference_weights,
)

pytest.importorskip("tensorflow")

EFFECTIVE, CEILING = 8, 3
SPLIT = (3, 3, 2)  # the pieces of an update until an OOM: executions 1-3 are update 1, 4-6 update 2
IMPOSSIBLE_ELEMENTS = 2**48  # float32: 1 PiB, far above any CPU allocator's limit


def failing_layer(fail_at: int, where: str):
    """(layer, executions counter): an identity layer whose `fail_at`-th execution of `where`
    ("forward" or "backward") allocates an impossible tensor after its input (or incoming
    gradient) exists. The counter is a plain tf.Variable the layer does not own, so the model's
    weights stay those of `make_model()`."""
    import keras
    import tensorflow as tf

    executions = tf.Variable(0, dtype=tf.int64, trainable=False)

    def zero_unless_failing(after):
        with tf.control_dependencies([after]):
            count = executions.assign_add(1)
        elements = tf.where(tf.equal(count, fail_at), tf.constant(IMPOSSIBLE_ELEMENTS, tf.int64), tf.constant(1, tf.int64))
        return tf.reduce_sum(tf.fill(tf.reshape(elements, [1]), 0.0))

    @tf.custom_gradient
    def fails_backward(x):
        def gradient(upstream):
            return upstream + zero_unless_failing(upstream)

        return tf.identity(x), gradient

    class FailOnExecution(keras.layers.Layer):
        def call(self, x):
            if where == "forward":
                return x + zero_unless_failing(x)
            return fails_backward(x)

    return FailOnExecution(name=f"fails_{where}_{fail_at}"), executions


@pytest.mark.parametrize(
    "where, fail_at, accumulated_pieces",
    [
        pytest.param("forward", 5, 1, id="forward-after-one-piece"),
        pytest.param("backward", 6, 2, id="backward-in-the-remainder-after-two-pieces"),
    ],
)
def test_oom_inside_the_compiled_step_keeps_the_plain_weights(where, fail_at, accumulated_pieces):
    import keras

    x, y = make_data(40)  # 5 updates per epoch
    plain = make_model()
    layer, executions = failing_layer(fail_at, where)
    hidden, logits = plain.layers
    model = keras.Sequential([keras.Input(plain.input_shape[1:]), hidden, layer, logits])
    start = make_model()
    assert max_weight_diff(model.get_weights(), start.get_weights()) == 0  # same start as the reference
    expected = reference_weights(x, y, EFFECTIVE, "adam", epochs=2, model=start)

    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"),
                 effective_batch=EFFECTIVE, governor=Governor(GovernorConfig(ceiling_batch=CEILING, effective_batch=EFFECTIVE)),
                 epochs=2)

    [event] = report.oom_events
    assert not event.injected and "OOM when allocating tensor" in event.message
    assert event.update == 2 and event.micro_batch == SPLIT[accumulated_pieces]
    assert event.example_offset == accumulated_pieces * CEILING  # those gradients were already accumulated
    assert event.next_micro_batch < event.micro_batch
    retried = report.updates[1]
    assert sum(retried.micro_batches) == EFFECTIVE and retried.micro_batches[:accumulated_pieces] == (CEILING,) * accumulated_pieces
    assert int(executions.numpy()) == sum(len(u.micro_batches) for u in report.updates) + 1  # + the failed one
    assert max_weight_diff(model.get_weights(), expected) < 1e-4
    assert np.isfinite(report.updates[-1].loss)
