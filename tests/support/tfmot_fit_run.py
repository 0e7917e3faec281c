"""edgebatch.fit on TFMOT models (tf_keras), in a fresh process.

Importing tensorflow_model_optimization changes what `tf.keras` means for the whole process, so
tests/test_training_tfmot.py runs this script in a subprocess. Prints one line "@@result {json}".

usage: python tfmot_fit_run.py SCENARIO   (pruned_exact | keras_fit | mobilenet)
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for the helpers

import keras  # noqa: E402  the user's Keras: Keras 3
import numpy as np  # noqa: E402
from test_training_support import make_data, make_dataset, make_loss, make_model, max_weight_diff  # noqa: E402

EFFECTIVE = 16


def pruned_dense(tf_keras, tfmot):
    """test_training_support's model in tf_keras, pruned with masks recomputed at every step."""
    model = make_model(tf_keras)
    schedule = tfmot.sparsity.keras.PolynomialDecay(initial_sparsity=0.0, final_sparsity=0.6, begin_step=0,
                                                    end_step=6, frequency=1)
    return tfmot.sparsity.keras.prune_low_magnitude(model, pruning_schedule=schedule)


def plain_pruned_loop(x, y, tf_keras, tfmot, epochs):
    """One step per consecutive chunk, driven by UpdatePruningStep as model.fit drives it."""
    import tensorflow as tf

    model = pruned_dense(tf_keras, tfmot)
    optimizer, loss = tf_keras.optimizers.SGD(learning_rate=0.1), make_loss(tf_keras)
    callback = tfmot.sparsity.keras.UpdatePruningStep()
    callback.set_model(model)
    callback.on_train_begin()
    for epoch in range(epochs):
        for start in range(0, len(x), EFFECTIVE):
            with tf.GradientTape() as tape:
                value = loss(y[start : start + EFFECTIVE], model(x[start : start + EFFECTIVE], training=True))
            optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
        callback.on_epoch_end(epoch)
    return model


def sparsity(model) -> float:
    kernels = [w for w in model.get_weights() if w.ndim == 2]
    return float(sum((k == 0).sum() for k in kernels) / sum(k.size for k in kernels))


def pruned_exact() -> dict:
    import tensorflow_model_optimization as tfmot
    import tf_keras

    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit, inject_oom

    x, y = make_data(64)
    expected = plain_pruned_loop(x, y, tf_keras, tfmot, epochs=2)
    model = pruned_dense(tf_keras, tfmot)
    governor = Governor(GovernorConfig(ceiling_batch=3, effective_batch=EFFECTIVE))
    with inject_oom([2]):
        report = fit(model, make_dataset(x, y), loss=make_loss(tf_keras),
                     optimizer=tf_keras.optimizers.SGD(learning_rate=0.1), effective_batch=EFFECTIVE,
                     governor=governor, epochs=2)
    return {
        "max_diff": max_weight_diff(model.get_weights(), expected.get_weights()),
        "pruning_step": report.pruning_step,
        "plain_pruning_step": int(expected.layers[0].pruning_step.numpy()),
        "updates": len(report.updates),
        "micro_steps": sum(len(r.micro_batches) for r in report.updates) + len(report.oom_events),
        "oom_events": len(report.oom_events),
        "sparsity": sparsity(model),
        "exactness": report.exactness,
        **keras_3_unaffected(),
    }


def keras_fit() -> dict:
    """model.fit with enable_micro_batching on a pruned model against plain model.fit."""
    import tensorflow_model_optimization as tfmot
    import tf_keras

    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import enable_micro_batching

    x, y = make_data(64)
    models = []
    for split in (False, True):
        model = pruned_dense(tf_keras, tfmot)
        model.compile(optimizer=tf_keras.optimizers.SGD(learning_rate=0.1), loss=make_loss(tf_keras))
        callbacks = [tfmot.sparsity.keras.UpdatePruningStep()]
        if split:
            controller = enable_micro_batching(model, Governor(GovernorConfig(ceiling_batch=3, effective_batch=16)))
            callbacks.append(controller.callback())
        model.fit(x, y, batch_size=EFFECTIVE, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        models.append(model)
    plain, split = models
    return {
        "max_diff": max_weight_diff(split.get_weights(), plain.get_weights()),
        "pruning_step": int(split.layers[0].pruning_step.numpy()),
        "plain_pruning_step": int(plain.layers[0].pruning_step.numpy()),
        "sparsity": sparsity(split),
    }


def mobilenet() -> dict:
    """Pruned and QAT mobilenet_v2 (the zoo's, tf_keras, 96x96x3) fine-tune a few governed updates."""
    import tensorflow as tf

    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit, inject_oom
    from edgebatch.models.zoo import build_base_model, optimize_model, parse_model_spec

    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 96, 96, 3)).astype("float32")
    y = rng.integers(0, 10, size=8).astype("int64")
    out = {}
    for optimize in ("prune", "qat"):
        import tf_keras

        model = optimize_model(build_base_model(parse_model_spec("mobilenet_v2"), optimize=optimize), optimize)
        governor = Governor(GovernorConfig(ceiling_batch=2, effective_batch=4))
        with inject_oom([2]):
            report = fit(model, tf.data.Dataset.from_tensor_slices((x, y)),
                         loss=tf_keras.losses.SparseCategoricalCrossentropy(),  # MobileNetV2 ends in softmax
                         optimizer=tf_keras.optimizers.SGD(learning_rate=0.01), effective_batch=4, governor=governor)
        out[optimize] = {
            "updates": len(report.updates),
            "micro_steps": sum(len(r.micro_batches) for r in report.updates) + len(report.oom_events),
            "pruning_step": report.pruning_step,
            "exactness": report.exactness,
            "losses_finite": all(np.isfinite(r.loss) for r in report.updates),
            "flavor": type(model).__module__.split(".")[0],
        }
    out.update(keras_3_unaffected())
    return out


def keras_3_unaffected() -> dict:
    """After TFMOT ran in this process: `import keras` is still Keras 3 and fit trains a Keras 3 model."""
    from edgebatch.training import fit

    x, y = make_data(32)
    model = make_model()  # `import keras` inside: the user's Keras
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=keras.optimizers.SGD(0.1), effective_batch=8)
    return {"keras_version": keras.__version__, "keras3_model_module": type(model).__module__.split(".")[0],
            "keras3_updates": len(report.updates)}


if __name__ == "__main__":
    scenario = sys.argv[1]
    result = {"pruned_exact": pruned_exact, "keras_fit": keras_fit, "mobilenet": mobilenet}[scenario]()
    print("@@result " + json.dumps(result))
