"""Independent truth for probe tests: one fresh process trains STEPS steps at BATCH and reports its peak.

Written apart from edgebatch.probing.trial on purpose (its own step, loss and data), so a bug in the
probe's measurement cannot also hide in the truth; it builds its training state the way real
training does (see the optimizer below). Prints one JSON line:
{"batch", "ok", "peak_bytes" (VmHWM), "error"}.

usage: python fresh_step.py MODEL_SPEC BATCH STEPS [ADDRESS_SPACE_HEADROOM_BYTES]
"""

import json
import os
import resource
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"


def status_bytes(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def main():
    spec, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    headroom = int(sys.argv[4]) if len(sys.argv) > 4 else None
    import keras
    import tensorflow as tf

    from edgebatch.zoo import build_model, parse_model_spec

    model = build_model(parse_model_spec(spec))
    optimizer = keras.optimizers.Adam(1e-3)
    classes = model.outputs[0].shape[-1]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x_shape = tuple(model.inputs[0].shape[1:])
    # The optimizer's slots are made before the step is traced, as Keras 3's fit and edgebatch.fit
    # make them. Left to the first traced call, they cost mobilenet_v2 at batch 42 about 150 MiB
    # more resident peak (1591-1665 MiB against 1450 MiB, 16 steps, fresh processes); dense_wide at
    # 300 and small_cnn at 320 moved by under 1% (8 and 7 MiB).
    optimizer.build(model.trainable_variables)

    @tf.function(input_signature=[tf.TensorSpec((None, *x_shape)), tf.TensorSpec((None,), tf.int32)])
    def train(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    train(tf.zeros((1, *x_shape)), tf.zeros((1,), tf.int32)).numpy()  # trace, as real training would
    if headroom is not None:
        resource.setrlimit(resource.RLIMIT_AS, (status_bytes("VmSize") + headroom, resource.RLIM_INFINITY))
    try:
        x = tf.random.uniform((batch, *x_shape))
        y = tf.random.uniform((batch,), 0, classes, tf.int32)
        for _ in range(steps):
            train(x, y).numpy()
    except tf.errors.ResourceExhaustedError as error:
        print(json.dumps({"batch": batch, "ok": False, "peak_bytes": None, "error": str(error)[:200]}))
        return
    print(json.dumps({"batch": batch, "ok": True, "peak_bytes": status_bytes("VmHWM"), "error": None}))


if __name__ == "__main__":
    main()
