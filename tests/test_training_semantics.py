"""What fit promises about training semantics: strategies, BatchNormalization, step timing,
resumable data order, batched input, compile defaults and Keras callbacks (tiny real models)."""

import time
import warnings

import numpy as np
import pytest

from edgebatch.errors import UsageError
from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import fit
from test_training_support import (
    FEATURES,
    FixedPressure,
    make_data,
    make_dataset,
    make_loss,
    make_model,
    make_optimizer,
    max_weight_diff,
    reference_weights,
)

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

EFFECTIVE = 8


def governor(ceiling=4, **config):
    return Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=EFFECTIVE, **config))


def test_an_active_strategy_is_refused_inside_and_outside_its_scope():
    x, y = make_data(16)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = make_model()
        with pytest.raises(UsageError, match="OneDeviceStrategy"):
            fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=EFFECTIVE)
    # Built under the strategy, fit outside its scope: still the strategy's variables.
    with pytest.raises(UsageError, match="outside any strategy.scope"):
        fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=EFFECTIVE)


class RecordingGovernor(Governor):
    """A real Governor that keeps every update observation it was given."""

    def __init__(self, config):
        super().__init__(config)
        self.observations = []

    def observe(self, observation):
        self.observations.append(observation)
        return super().observe(observation)


def slow_dataset(x, y, seconds_per_example):
    def slow(xi, yi):
        def wait(value):
            time.sleep(seconds_per_example)
            return value

        return tf.py_function(wait, [xi], tf.float32), yi

    return make_dataset(x, y).map(slow).map(lambda xi, yi: (tf.ensure_shape(xi, [FEATURES]), yi))


def test_step_seconds_leave_out_the_wait_for_input():
    x, y = make_data(EFFECTIVE)
    config = GovernorConfig(ceiling_batch=4, effective_batch=EFFECTIVE)
    gov = RecordingGovernor(config)
    # One update per epoch; each epoch starts a new iterator, whose first chunk (8 examples x
    # 0.1 s, slept in the dataset's thread) cannot have been read ahead while the step ran.
    report = fit(make_model(), slow_dataset(x, y, 0.1), loss=make_loss(), optimizer=make_optimizer("sgd"),
                 effective_batch=EFFECTIVE, governor=gov, epochs=3)
    assert len(report.updates) == 3
    for record, observation in zip(report.updates, gov.observations):
        assert observation.step_seconds == record.step_seconds
        assert record.seconds == pytest.approx(record.input_seconds + record.step_seconds)
        assert record.input_seconds >= 0.7
    # Updates 2 and 3 reuse the traced step: a tiny Dense step, far below the 0.8 s of reading.
    assert all(record.step_seconds < 0.4 for record in report.updates[1:])


def bn_model(keras_module=keras, nested=True):
    init = keras_module.initializers.GlorotUniform(seed=1)
    inner = keras_module.Sequential(
        [keras_module.Input((8,)), keras_module.layers.BatchNormalization(name="inner_bn")], name="inner")
    inputs = keras_module.Input((FEATURES,))
    hidden = keras_module.layers.Dense(8, activation="tanh", kernel_initializer=init)(inputs)
    hidden = inner(hidden) if nested else keras_module.layers.BatchNormalization(name="inner_bn")(hidden)
    return keras_module.Model(inputs, keras_module.layers.Dense(3, kernel_initializer=init)(hidden))


def test_batch_norm_in_a_nested_model_is_reported_and_warned_once():
    x, y = make_data(16)
    model = bn_model()
    with pytest.warns(UserWarning, match="inner_bn"):
        report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                     effective_batch=EFFECTIVE, governor=governor())
    assert report.batch_norm_layers == ["inner_bn"] and report.exactness == "micro_batch_statistics"
    assert report.to_dict()["exactness"] == "micro_batch_statistics"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call on the same model does not warn again
        fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
            effective_batch=EFFECTIVE, governor=governor())
    plain = fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                effective_batch=EFFECTIVE, governor=governor())
    assert plain.batch_norm_layers == [] and plain.exactness == "exact"


def test_dropout_is_reported_as_random_draws_per_micro_batch():
    x, y = make_data(16)
    init = keras.initializers.GlorotUniform(seed=1)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, kernel_initializer=init),
                              keras.layers.Dropout(0.3, seed=2, name="drop"), keras.layers.Dense(3)])
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                 effective_batch=EFFECTIVE, governor=governor())
    assert report.random_layers == ["drop"] and report.exactness == "random_draws_per_micro_batch"


def test_batch_norm_changes_the_result_with_the_split_so_it_is_reported_not_hidden():
    x, y = make_data(16)
    whole, split = bn_model(), bn_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(whole, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=EFFECTIVE,
            governor=governor(ceiling=EFFECTIVE))
        fit(split, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=EFFECTIVE,
            governor=governor(ceiling=2))
    assert max_weight_diff(whole.get_weights(), split.get_weights()) > 1e-4


def test_batch_norm_refuse_and_tf_keras_detection():
    tf_keras = pytest.importorskip("tf_keras")
    x, y = make_data(16)
    for model in (bn_model(), bn_model(tf_keras, nested=False)):
        with pytest.raises(UsageError, match="inner_bn.*batch_norm='fixed_micro_batch'"):
            fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                effective_batch=EFFECTIVE, batch_norm="refuse")
    with pytest.raises(UsageError, match="batch_norm must be one of"):
        fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
            effective_batch=EFFECTIVE, batch_norm="sometimes")


def test_fixed_micro_batch_ignores_pressure_and_still_shrinks_on_oom():
    from edgebatch.training import inject_oom

    x, y = make_data(32)
    config = dict(cooldown_updates=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the chosen mode does not warn
        fixed = fit(bn_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                    effective_batch=EFFECTIVE, governor=governor(**config), pressure_reader=FixedPressure(0.95),
                    batch_norm="fixed_micro_batch")
    assert [record.largest_micro_batch for record in fixed.updates] == [4, 4, 4, 4]
    assert fixed.batch_norm == "fixed_micro_batch" and fixed.updates[0].pressure == 0.95
    with inject_oom([3]):
        shrunk = fit(bn_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                     effective_batch=EFFECTIVE, governor=governor(**config), pressure_reader=FixedPressure(0.95),
                     batch_norm="fixed_micro_batch")
    assert [record.micro_batches for record in shrunk.updates] == [(4, 4), (2, 2, 2, 2), (2,) * 4, (2,) * 4]


@pytest.mark.parametrize(
    "shuffle,message",
    [
        (dict(seed=3), "reshuffles each iteration"),
        (dict(seed=3, reshuffle_each_iteration=True), "reshuffles each iteration"),
        (dict(reshuffle_each_iteration=False), "without a seed"),
    ],
)
def test_checkpointing_refuses_an_order_that_resume_cannot_replay(tmp_path, shuffle, message):
    x, y = make_data(16)
    dataset = make_dataset(x, y).shuffle(8, **shuffle)
    with pytest.raises(UsageError, match=message):
        fit(make_model(), dataset, loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=EFFECTIVE,
            checkpoint_dir=str(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt").exists()  # refused before anything was written
    # Nested inside an interleave's function, too.
    nested = tf.data.Dataset.range(2).interleave(lambda _: make_dataset(x, y).shuffle(4))
    with pytest.raises(UsageError, match="reshuffles each iteration"):
        fit(make_model(), nested, loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=EFFECTIVE,
            checkpoint_dir=str(tmp_path / "ckpt"))
    # Without checkpoint_dir a reshuffling dataset is ordinary training.
    report = fit(make_model(), dataset, loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=EFFECTIVE)
    assert report.examples_seen == 16


def test_a_seeded_fixed_shuffle_resumes_to_the_uninterrupted_weights(tmp_path):
    x, y = make_data(40)
    order = list(make_dataset(np.arange(40), np.arange(40)).shuffle(40, seed=5, reshuffle_each_iteration=False)
                 .map(lambda i, _: i).as_numpy_iterator())
    expected = reference_weights(x[order], y[order], EFFECTIVE, "adam", epochs=2)

    def run(**kwargs):
        model = make_model()
        dataset = make_dataset(x, y).shuffle(40, seed=5, reshuffle_each_iteration=False)
        report = fit(model, dataset, loss=make_loss(), optimizer=make_optimizer("adam"), effective_batch=EFFECTIVE,
                     governor=governor(), epochs=2, checkpoint_dir=str(tmp_path), **kwargs)
        return model, report

    _, first = run(max_updates=7)
    model, second = run()
    assert second.resumed_from.updates == 7 and second.examples_seen == 80 - 56
    assert max_weight_diff(model.get_weights(), expected) < 1e-4


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_a_batched_dataset_and_the_compiled_loss_and_optimizer(drop_remainder):
    x, y = make_data(48)
    expected = reference_weights(x, y, EFFECTIVE, "adam")
    model = make_model()
    optimizer = make_optimizer("adam")
    model.compile(optimizer=optimizer, loss=make_loss())
    # Batches of 6 (known size with drop_remainder) do not line up with updates of 8: fit unbatches.
    batched = make_dataset(x, y).batch(6, drop_remainder=drop_remainder)
    report = fit(model, batched, effective_batch=EFFECTIVE, governor=governor(ceiling=3))
    assert report.unbatched_input and report.examples_seen == 48
    assert [record.examples for record in report.updates] == [EFFECTIVE] * 6
    assert max_weight_diff(model.get_weights(), expected) < 1e-4
    assert int(optimizer.iterations.numpy()) == 6  # the compiled optimizer did the updates


def test_a_loss_name_from_compile_and_missing_defaults():
    x, y = make_data(16)
    model = make_model()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    report = fit(model, make_dataset(x, y), effective_batch=EFFECTIVE)
    assert np.isfinite(report.updates[-1].loss) and not report.unbatched_input
    with pytest.raises(UsageError, match="loss=... or a model compiled with a loss"):
        fit(make_model(), make_dataset(x, y), optimizer=make_optimizer("sgd"), effective_batch=EFFECTIVE)
    with pytest.raises(UsageError, match="optimizer=... or a compiled model"):
        fit(make_model(), make_dataset(x, y), loss=make_loss(), effective_batch=EFFECTIVE)


class EventLog(keras.callbacks.Callback):
    def __init__(self, stop_at_batch=None):
        super().__init__()
        self.events = []
        self.stop_at_batch = stop_at_batch

    def on_train_begin(self, logs=None):
        self.events.append(("train_begin",))

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(("epoch_begin", epoch))

    def on_train_batch_begin(self, batch, logs=None):
        self.events.append(("batch_begin", batch))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("batch_end", batch, logs["loss"]))
        if batch == self.stop_at_batch:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch_end", epoch, logs["loss"]))

    def on_train_end(self, logs=None):
        self.events.append(("train_end",))


def test_keras_callbacks_see_each_update_and_can_stop_training():
    x, y = make_data(20)  # updates of 8, 8, 4 per epoch
    log = EventLog()
    model = make_model()
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                 effective_batch=EFFECTIVE, governor=governor(), epochs=2, callbacks=[log])
    assert log.model is model
    names = [event[:2] if event[0] != "train_begin" and event[0] != "train_end" else event for event in log.events]
    per_epoch = lambda e: [("epoch_begin", e), ("batch_begin", 0), ("batch_end", 0), ("batch_begin", 1),  # noqa: E731
                           ("batch_end", 1), ("batch_begin", 2), ("batch_end", 2), ("epoch_end", e)]
    assert names == [("train_begin",)] + per_epoch(0) + per_epoch(1) + [("train_end",)]
    batch_losses = [event[2] for event in log.events if event[0] == "batch_end"]
    assert batch_losses == pytest.approx([record.loss for record in report.updates])
    epoch_losses = [event[2] for event in log.events if event[0] == "epoch_end"]
    first = report.updates[:3]
    assert epoch_losses[0] == pytest.approx(sum(r.loss * r.examples for r in first) / 20)

    stopper = EventLog(stop_at_batch=1)
    stopped = fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                  effective_batch=EFFECTIVE, governor=governor(), epochs=2, callbacks=[stopper])
    assert stopped.stopped_by_callback and len(stopped.updates) == 2
    assert [event[0] for event in stopper.events][-2:] == ["epoch_end", "train_end"]


def test_keras_early_stopping_and_a_callback_of_the_wrong_kind():
    x, y = make_data(16)
    early = keras.callbacks.EarlyStopping(monitor="loss", patience=0)
    report = fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=keras.optimizers.SGD(0.0),
                 effective_batch=EFFECTIVE, governor=governor(), epochs=5, callbacks=[early])
    # With a zero learning rate the loss never improves: stopped at the end of the second epoch,
    # before the third one starts.
    assert report.stopped_by_callback and report.epochs_completed == 2 and len(report.updates) == 4
    with pytest.raises(UsageError, match="callbacks must be keras.callbacks.Callback"):
        fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
            effective_batch=EFFECTIVE, callbacks=[lambda: None])
    with pytest.raises(UsageError, match="callbacks must be a list"):
        fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
            effective_batch=EFFECTIVE, callbacks=42)


def test_tf_keras_compile_defaults_callbacks_and_resume(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    x, y = make_data(32)
    reference = make_model(tf_keras)
    optimizer = make_optimizer("adam", tf_keras)
    for _ in range(2):
        for start in range(0, 32, EFFECTIVE):
            with tf.GradientTape() as tape:
                value = make_loss(tf_keras)(y[start:start + EFFECTIVE], reference(x[start:start + EFFECTIVE], training=True))
            optimizer.apply_gradients(zip(tape.gradient(value, reference.trainable_variables),
                                          reference.trainable_variables))

    class Count(tf_keras.callbacks.Callback):
        batches = 0

        def on_train_batch_end(self, batch, logs=None):
            Count.batches += 1

    def run(**kwargs):
        model = make_model(tf_keras)
        model.compile(optimizer=make_optimizer("adam", tf_keras), loss=make_loss(tf_keras))
        report = fit(model, make_dataset(x, y).batch(5), effective_batch=EFFECTIVE, governor=governor(ceiling=3),
                     epochs=2, checkpoint_dir=str(tmp_path), callbacks=[Count()], **kwargs)
        return model, report

    run(max_updates=3)
    model, report = run()
    assert report.resumed_from.updates == 3 and Count.batches == 8
    assert max_weight_diff(model.get_weights(), reference.get_weights()) < 1e-4


def test_checkpointing_refuses_unseeded_random_augmentation_and_resumes_a_seeded_one(tmp_path):
    x, y = make_data(32)

    def augmented(seed):
        return make_dataset(x, y).map(lambda xi, yi: (xi + tf.random.uniform([FEATURES], seed=seed), yi))

    with pytest.raises(UsageError, match="random numbers without a seed.*RandomUniform"):
        fit(make_model(), augmented(None), loss=make_loss(), optimizer=make_optimizer("sgd"),
            effective_batch=EFFECTIVE, checkpoint_dir=str(tmp_path / "refused"))

    def run(checkpoint_dir=None, **kwargs):
        model = make_model()
        fit(model, augmented(11), loss=make_loss(), optimizer=make_optimizer("adam"), effective_batch=EFFECTIVE,
            governor=governor(), epochs=2, checkpoint_dir=checkpoint_dir, **kwargs)
        return model

    uninterrupted = run()
    run(str(tmp_path / "ckpt"), max_updates=3)
    resumed = run(str(tmp_path / "ckpt"))
    # The skipped examples still run through the map, so the seeded op's draws line up again.
    assert max_weight_diff(resumed.get_weights(), uninterrupted.get_weights()) < 1e-4
