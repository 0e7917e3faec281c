"""edgebatch.training.fit: exact accumulation whatever the split, OOM recovery, no retrace, errors."""

import json
import os

import numpy as np
import pytest

from edgebatch.errors import TrainingError, UsageError
from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import ENV_INJECT_OOM, fit, inject_oom
from edgebatch.training import injection
from test_training_support import (
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

EFFECTIVE = 16


def governed_fit(x, y, optimizer, ceiling, epochs=1, **kwargs):
    model = make_model()
    governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=EFFECTIVE))
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer(optimizer),
                 effective_batch=EFFECTIVE, governor=governor, epochs=epochs, **kwargs)
    return model, report


# (ceiling micro-batch, micro-batch executions that fail): each OOM halves the micro-batch and the
# failed examples run again; none of these reaches a failure at micro-batch 1.
SCHEDULES = [
    (16, []),
    (5, []),
    (1, []),
    (16, [1, 4]),
    (7, [2, 5]),
    (3, [3]),
]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("ceiling,failures", SCHEDULES)
def test_weights_match_plain_loop_for_any_split_and_ooms(optimizer, ceiling, failures):
    x, y = make_data(50)  # 50 = 3 x 16 + 2: the last update of the epoch is short
    expected = reference_weights(x, y, EFFECTIVE, optimizer)
    with inject_oom(failures):
        model, report = governed_fit(x, y, optimizer, ceiling)
    assert max_weight_diff(model.get_weights(), expected) < 1e-4
    assert report.examples_seen == 50
    assert [record.examples for record in report.updates] == [16, 16, 16, 2]
    for record in report.updates:
        assert sum(record.micro_batches) == record.examples
        assert max(record.micro_batches) <= ceiling
    assert len(report.oom_events) == len(failures)
    assert all(event.injected and not event.gave_up for event in report.oom_events)
    assert report.traces == {"micro_step": 1, "apply_step": 1}


def test_two_epochs_and_failed_piece_is_rerun_smaller():
    x, y = make_data(40)
    expected = reference_weights(x, y, EFFECTIVE, "adam", epochs=2)
    with inject_oom([2]):
        model, report = governed_fit(x, y, "adam", ceiling=8, epochs=2)
    assert max_weight_diff(model.get_weights(), expected) < 1e-4
    assert report.examples_seen == 80 and report.epochs_completed == 2
    first = report.updates[0]
    # Execution 1 ran 8 examples, execution 2 (examples 8..15) failed: they ran again as 4 + 4.
    assert first.micro_batches == (8, 4, 4)
    event = report.oom_events[0]
    assert (event.micro_batch, event.example_offset, event.next_micro_batch) == (8, 8, 4)
    assert report.decisions and report.decisions[0]["oom"] is True


def test_changing_micro_batch_does_not_retrace():
    x, y = make_data(64)
    expected = reference_weights(x, y, EFFECTIVE, "sgd")
    model = make_model()
    # Pressure above the shrink threshold and no cooldown: the micro-batch halves every update.
    governor = Governor(GovernorConfig(ceiling_batch=16, effective_batch=EFFECTIVE, cooldown_updates=0))
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                 effective_batch=EFFECTIVE, governor=governor, pressure_reader=FixedPressure(0.95))
    assert [record.largest_micro_batch for record in report.updates] == [16, 8, 4, 2]
    assert all(record.changed for record in report.updates)
    assert report.traces == {"micro_step": 1, "apply_step": 1}
    assert max_weight_diff(model.get_weights(), expected) < 1e-4


def test_elastic_mode_takes_the_governors_effective_batch():
    x, y = make_data(30)
    model = make_model()
    config = GovernorConfig(ceiling_batch=8, effective_batch=8, mode="elastic", elastic_floor_batch=4,
                            lr_scaling="linear", cooldown_updates=0)
    optimizer = make_optimizer("sgd")
    rates = []
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=8,
                 governor=Governor(config), pressure_reader=FixedPressure(0.95),
                 on_update=lambda record: rates.append(float(optimizer.learning_rate)))
    # 8 examples, then pressure shrinks the micro-batch to 4 (= the floor: no accumulation) and 2
    # (below the floor: 2 x 2 over 4 examples), with the learning rate scaled linearly.
    assert [record.examples for record in report.updates][:3] == [8, 4, 4]
    assert report.updates[2].micro_batches == (2, 2)
    assert report.examples_seen == 30
    assert rates[:3] == pytest.approx([0.1, 0.05, 0.05])
    # fit puts the base rate back, so a second call scales the tuned rate again, not 0.05.
    assert float(optimizer.learning_rate) == pytest.approx(0.1)
    again = []
    fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=8,
        governor=Governor(config), pressure_reader=FixedPressure(0.95),
        on_update=lambda record: again.append(float(optimizer.learning_rate)))
    assert again == pytest.approx(rates)
    assert float(optimizer.learning_rate) == pytest.approx(0.1)


def test_oom_at_micro_batch_one_saves_checkpoint_and_resume_finishes_exactly(tmp_path):
    x, y = make_data(32)
    expected = reference_weights(x, y, EFFECTIVE, "adam")
    ckpt = str(tmp_path / "ckpt")
    # Update 1 runs as 2 x 8; in update 2 the first piece fails (8 -> 4), then 4 -> 2 -> 1 -> fail.
    with inject_oom([3, 4, 5, 6, 7]):
        with pytest.raises(TrainingError, match="micro-batch of 1 example") as info:
            governed_fit(x, y, "adam", ceiling=8, checkpoint_dir=ckpt, checkpoint_every_updates=10)
    assert "checkpoint saved" in str(info.value)
    assert os.listdir(ckpt)
    # A fresh model and optimizer resume at update 2 and end where an uninterrupted run ends.
    model, report = governed_fit(x, y, "adam", ceiling=8, checkpoint_dir=ckpt)
    assert report.resumed_from is not None and report.resumed_from.updates == 1
    assert report.examples_seen == 16
    assert max_weight_diff(model.get_weights(), expected) < 1e-4


def test_training_error_without_checkpoint_dir():
    x, y = make_data(8)
    with inject_oom([1]), pytest.raises(TrainingError, match="min_batch=1"):
        model = make_model()
        fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=4,
            governor=Governor(GovernorConfig(ceiling_batch=1, effective_batch=4)))


def test_env_injection_is_honoured(monkeypatch):
    x, y = make_data(16)
    monkeypatch.setenv(ENV_INJECT_OOM, str(injection._executions + 1))
    _, report = governed_fit(x, y, "sgd", ceiling=16)
    assert len(report.oom_events) == 1 and ENV_INJECT_OOM in report.oom_events[0].message
    assert report.updates[0].micro_batches == (8, 8)


def test_bad_env_injection_fails_before_training(monkeypatch):
    x, y = make_data(16)
    monkeypatch.setenv(ENV_INJECT_OOM, "3,x")
    with pytest.raises(UsageError, match="'3,x'"):
        governed_fit(x, y, "sgd", ceiling=16)


def test_max_updates_and_logs(tmp_path):
    x, y = make_data(64)
    log_path = tmp_path / "decisions.jsonl"
    _, report = governed_fit(x, y, "sgd", ceiling=4, max_updates=3, decision_log=str(log_path),
                             log_dir=str(tmp_path / "tb"))
    assert report.stopped_by_max_updates and len(report.updates) == 3 and report.examples_seen == 48
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [line["update"] for line in lines] == [1, 2, 3]
    assert lines[0]["micro_batches"] == [4, 4, 4, 4] and lines[0]["accumulation_steps"] == 4
    json.dumps(report.to_dict())  # the whole report is JSON-able
    events = [f for _, _, files in os.walk(tmp_path / "tb") for f in files if "tfevents" in f]
    assert events
    tags = set()
    for name in events:
        path = next(os.path.join(d, name) for d, _, files in os.walk(tmp_path / "tb") if name in files)
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    assert {"edgebatch/micro_batch", "edgebatch/accumulation_steps", "edgebatch/loss",
            "edgebatch/samples_per_second"} <= tags


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"effective_batch": 0}, "effective_batch"),
        ({"effective_batch": 8}, "differs from the governor"),
        ({"checkpoint_every_updates": 2}, "needs a checkpoint_dir"),
        ({"epochs": 0}, "epochs"),
    ],
)
def test_argument_errors(kwargs, message):
    x, y = make_data(8)
    arguments = {"effective_batch": EFFECTIVE, "governor": Governor(GovernorConfig(ceiling_batch=4, effective_batch=EFFECTIVE))}
    arguments.update(kwargs)
    with pytest.raises(UsageError, match=message):
        fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"), **arguments)


def test_scalar_loss_is_refused():
    x, y = make_data(8)
    with pytest.raises(UsageError, match="scalar"):
        fit(make_model(), make_dataset(x, y), loss=lambda t, p: tf.reduce_mean(p), optimizer=make_optimizer("sgd"),
            effective_batch=4)


def test_mixed_float16_is_refused():
    import keras

    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, dtype="mixed_float16")])
    x, y = make_data(8)
    with pytest.raises(UsageError, match="mixed_float16"):
        fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=4)


def test_plain_callable_loss_and_regularizer_match_reference():
    import keras

    x, y = make_data(24)
    def build():
        init = keras.initializers.GlorotUniform(seed=3)
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(
            3, kernel_initializer=init, kernel_regularizer=keras.regularizers.l2(0.05))])
    reference = build()
    opt = make_optimizer("sgd")
    for start in range(0, 24, 12):
        with tf.GradientTape() as tape:
            out = reference(x[start:start + 12], training=True)
            value = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y[start:start + 12], out, from_logits=True))
            value += tf.add_n(reference.losses)
        opt.apply_gradients(zip(tape.gradient(value, reference.trainable_variables), reference.trainable_variables))
    model = build()
    fit(model, make_dataset(x, y),
        loss=lambda t, p: keras.losses.sparse_categorical_crossentropy(t, p, from_logits=True),
        optimizer=make_optimizer("sgd"), effective_batch=12,
        governor=Governor(GovernorConfig(ceiling_batch=5, effective_batch=12)))
    assert max_weight_diff(model.get_weights(), reference.get_weights()) < 1e-4
    assert not np.allclose(model.get_weights()[0], build().get_weights()[0])  # it did train


def test_tf_keras_model_in_the_custom_loop():
    tf_keras = pytest.importorskip("tf_keras")
    x, y = make_data(40)
    reference, optimizer, loss = make_model(tf_keras), make_optimizer("adam", tf_keras), make_loss(tf_keras)
    for start in range(0, 40, EFFECTIVE):
        with tf.GradientTape() as tape:
            value = loss(y[start:start + EFFECTIVE], reference(x[start:start + EFFECTIVE], training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, reference.trainable_variables), reference.trainable_variables))
    model = make_model(tf_keras)
    with inject_oom([2]):
        report = fit(model, make_dataset(x, y), loss=make_loss(tf_keras), optimizer=make_optimizer("adam", tf_keras),
                     effective_batch=EFFECTIVE, governor=Governor(GovernorConfig(ceiling_batch=6, effective_batch=EFFECTIVE)))
    assert len(report.oom_events) == 1
    assert report.traces == {"micro_step": 1, "apply_step": 1}
    assert max_weight_diff(model.get_weights(), reference.get_weights()) < 1e-4


def test_give_up_reports_the_oom_even_when_zeroing_the_accumulators_runs_out_too(monkeypatch):
    import tensorflow as tf

    from edgebatch.training import steps

    def out_of_memory(self):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (ZerosLike)")

    monkeypatch.setattr(steps.AccumulatingSteps, "reset_accumulators", out_of_memory)
    x, y = make_data(8)
    with inject_oom([1]), pytest.raises(TrainingError, match="min_batch=1"):
        fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=4,
            governor=Governor(GovernorConfig(ceiling_batch=1, effective_batch=4)))
