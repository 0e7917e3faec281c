"""Independent truth for probe tests: one fresh process trains STEPS steps at BATCH and reports its peak.

Written apart from edgebatch.probing.trial on purpose (its own step, loss and data), so a bug in the
probe's measurement cannot also hide in the truth; it builds its training state the way real
training does (see the optimizer below). Prints one JSON line:
{"batch", "ok", "peak_bytes" (VmHWM), "error"}.

usage: python fresh_step.py MODEL_SPEC BATCH STEPS [ADDRESS_SPACE_HEADROOM_BYTES] [--seq-len=TOKENS]

--seq-len: a model with a variable sequence axis (input (None,)) trains on TOKENS tokens per example,
every one a real token (ids from 1; 0 is padding), with the step traced for any length, as training
with padded batches traces it.
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
    seq_len = next((int(arg.split("=", 1)[1]) for arg in sys.argv if arg.startswith("--seq-len=")), None)
    args = [arg for arg in sys.argv if not arg.startswith("--seq-len=")]
    spec, batch, steps = args[1], int(args[2]), int(args[3])
    headroom = int(args[4]) if len(args) > 4 else None
    import keras
    import tensorflow as tf

    from edgebatch.zoo import build_model, parse_model_spec

    model = build_model(parse_model_spec(spec))
    optimizer = keras.optimizers.Adam(1e-3)
    classes = model.outputs[0].shape[-1]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x_shape = tuple(model.inputs[0].shape[1:])
    x_dtype = "float32"
    if seq_len is not None:
        x_dtype = model.inputs[0].dtype if isinstance(model.inputs[0].dtype, str) else model.inputs[0].dtype.name
        vocabulary = next(layer.input_dim for layer in model.layers if type(layer).__name__ == "Embedding")
    data_shape = tuple(seq_len if dim is None else dim for dim in x_shape)
    # The optimizer's slots are made before the step is traced, as Keras 3's fit and edgebatch.fit
    # make them. Left to the first traced call, they cost mobilenet_v2 at batch 42 about 150 MiB
    # more resident peak (1591-1665 MiB against 1450 MiB, 16 steps, fresh processes); dense_wide at
    # 300 and small_cnn at 320 moved by under 1% (8 and 7 MiB).
    optimizer.build(model.trainable_variables)

    @tf.function(input_signature=[tf.TensorSpec((None, *x_shape), x_dtype), tf.TensorSpec((None,), tf.int32)])
    def train(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    first = tf.zeros((1, *data_shape), x_dtype) if seq_len is None else tf.ones((1, *data_shape), x_dtype)
    train(first, tf.zeros((1,), tf.int32)).numpy()  # trace, as real training would
    if headroom is not None:
        resource.setrlimit(resource.RLIMIT_AS, (status_bytes("VmSize") + headroom, resource.RLIM_INFINITY))
    try:
        if seq_len is None:
            x = tf.random.uniform((batch, *data_shape))
        else:
            x = tf.random.uniform((batch, *data_shape), 1, vocabulary, x_dtype)
        y = tf.random.uniform((batch,), 0, classes, tf.int32)
        for _ in range(steps):
            train(x, y).numpy()
    except tf.errors.ResourceExhaustedError as error:
        print(json.dumps({"batch": batch, "ok": False, "peak_bytes": None, "error": str(error)[:200]}))
        return
    print(json.dumps({"batch": batch, "ok": True, "peak_bytes": status_bytes("VmHWM"), "error": None}))


if __name__ == "__main__":
    main()
