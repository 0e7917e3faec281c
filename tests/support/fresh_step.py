"""Independent truth for probe tests: one fresh process trains STEPS steps at BATCH and reports its peak.

Written apart from edgebatch.probing.trial on purpose (its own step, loss and data), so a bug in the
probe's measurement cannot also hide in the truth; it builds its training state the way real
training does (see the optimizer below). Prints one JSON line:
{"batch", "ok", "peak_bytes" (VmHWM), "error"}.

usage: python fresh_step.py MODEL_SPEC BATCH STEPS [ADDRESS_SPACE_HEADROOM_BYTES] [--seq-len=TOKENS]
                            [--precision=POLICY] [--optimize=qat|prune] [--inter-op-threads=N] [--report-growth]
                            [--report-steps]

A model with integer inputs (token ids into an Embedding) trains on random real tokens (ids from 1;
0 is padding) fed as integers, fixed-length (text_cnn) or not.
--seq-len: a model with a variable sequence axis (input (None,)) trains on TOKENS tokens per example,
with the step traced for any length, as training with padded batches traces it.
--precision: the Keras mixed-precision policy (float32, the default, mixed_float16, mixed_bfloat16),
set globally before the model is built (tf_keras's too with --optimize); the loss is taken on
float32 logits. Under mixed_float16 the step does no loss scaling: memory, not convergence, is
measured.
--optimize: qat or prune builds the model with tf_keras (edgebatch.models.zoo.build_base_model) and wraps
it with TFMOT (zoo.optimize_model), trained with tf_keras's Adam and loss. For prune every
PruneLowMagnitude wrapper's pruning_step is set from -1 to 0 before the first step, as
UpdatePruningStep.on_train_begin does (TFMOT 0.8's wrapper adds 1 in each training call and
asserts the step is >= 1); no callback runs after that.
--report-growth: also print how far the address space (VmPeak) and the resident size (VmHWM) grew
from the process's size after tracing, where an address-space cap is set ("address_space_growth_bytes",
"resident_growth_bytes"; docs/probe-evidence.md, "An out-of-memory band").
--inter-op-threads: TensorFlow's inter-op threads (tf.config.threading), set before anything runs; the
truth for a probe must run what the probe's workers ran (`edgebatch probe` uses 1 by default). Left out,
TensorFlow keeps its own pool, whose peaks climb over many steps (docs/probe-evidence.md, "Bumps").
--report-steps: also print the resident peak (VmHWM) after each step ("peak_bytes_by_step"), to see
at which step a process's peak jumps (docs/probe-evidence.md, "Peaks that differ between processes").
Without these options the step is the one this file always ran (Keras 3, float32, TensorFlow's pool).
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


def _option(name, default):
    """The value of `name=VALUE` among the arguments, else `default`."""
    return next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith(name + "=")), default)


def main():
    seq_len = _option("--seq-len", None)
    seq_len = None if seq_len is None else int(seq_len)
    precision = _option("--precision", "float32")
    optimize = _option("--optimize", "none")
    inter_op_threads = _option("--inter-op-threads", None)
    report_growth = "--report-growth" in sys.argv
    report_steps = "--report-steps" in sys.argv
    args = [arg for arg in sys.argv if arg not in ("--report-growth", "--report-steps")
            and not arg.startswith(("--seq-len=", "--precision=", "--optimize=", "--inter-op-threads="))]
    spec, batch, steps = args[1], int(args[2]), int(args[3])
    headroom = int(args[4]) if len(args) > 4 else None
    import keras
    import tensorflow as tf

    if inter_op_threads is not None:
        tf.config.threading.set_inter_op_parallelism_threads(int(inter_op_threads))

    from edgebatch.models.zoo import (
        build_base_model,
        build_model,
        optimize_model,
        parse_model_spec,
    )

    keras.mixed_precision.set_global_policy(precision)
    if optimize == "none":
        model = build_model(parse_model_spec(spec), precision)
        optimizer = keras.optimizers.Adam(1e-3)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        import tf_keras

        tf_keras.mixed_precision.set_global_policy(precision)
        model = optimize_model(build_base_model(parse_model_spec(spec), precision, optimize), optimize)
        optimizer = tf_keras.optimizers.Adam(1e-3)
        loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if optimize == "prune":
            wrappers = [layer for layer in model.layers if type(layer).__name__ == "PruneLowMagnitude"]
            if not wrappers:
                raise RuntimeError(f"--optimize=prune: no PruneLowMagnitude layer in {model.name}")
            for layer in wrappers:
                layer.pruning_step.assign(0)
    classes = model.outputs[0].shape[-1]
    x_shape = tuple(model.inputs[0].shape[1:])
    x_dtype = model.inputs[0].dtype if isinstance(model.inputs[0].dtype, str) else model.inputs[0].dtype.name
    integer_input = x_dtype.startswith("int")
    if integer_input:
        vocabulary = next(layer.input_dim for layer in model.layers if type(layer).__name__ == "Embedding")
    else:
        x_dtype = "float32"
    data_shape = tuple(seq_len if dim is None else dim for dim in x_shape)
    # The optimizer's slots are made before the step is traced, as Keras 3's fit and edgebatch.fit
    # make them. Left to the first traced call, they cost mobilenet_v2 at batch 42 about 150 MiB
    # more resident peak (1591-1665 MiB against 1450 MiB, 16 steps, fresh processes); dense_wide at
    # 300 and small_cnn at 320 moved by under 1% (8 and 7 MiB).
    optimizer.build(model.trainable_variables)

    @tf.function(input_signature=[tf.TensorSpec((None, *x_shape), x_dtype), tf.TensorSpec((None,), tf.int32)])
    def train(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    first = tf.ones((1, *data_shape), x_dtype) if integer_input else tf.zeros((1, *data_shape), x_dtype)
    train(first, tf.zeros((1,), tf.int32)).numpy()  # trace, as real training would
    size_after_trace, resident_after_trace = status_bytes("VmSize"), status_bytes("VmRSS")
    if headroom is not None:
        resource.setrlimit(resource.RLIMIT_AS, (size_after_trace + headroom, resource.RLIM_INFINITY))
    try:
        if integer_input:
            x = tf.random.uniform((batch, *data_shape), 1, vocabulary, x_dtype)
        else:
            x = tf.random.uniform((batch, *data_shape))
        y = tf.random.uniform((batch,), 0, classes, tf.int32)
        by_step = []
        for _ in range(steps):
            train(x, y).numpy()
            if report_steps:
                by_step.append(status_bytes("VmHWM"))
    except tf.errors.ResourceExhaustedError as error:
        print(json.dumps({"batch": batch, "ok": False, "peak_bytes": None, "error": str(error)[:200]}))
        return
    reply = {"batch": batch, "ok": True, "peak_bytes": status_bytes("VmHWM"), "error": None}
    if report_growth:
        reply["address_space_growth_bytes"] = status_bytes("VmPeak") - size_after_trace
        reply["resident_growth_bytes"] = status_bytes("VmHWM") - resident_after_trace
    if report_steps:
        reply["peak_bytes_by_step"] = by_step
    print(json.dumps(reply))


if __name__ == "__main__":
    main()
