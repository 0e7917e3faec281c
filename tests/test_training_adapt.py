"""fit(..., adapt=AdaptConfig(...)) on real TensorFlow: the adaptive batch changes the effective batch,
stays exact (an adaptive run equals a plain loop fed its batch sizes and rates), keeps micro-batches
under the governor, resumes as an uninterrupted run, and logs the statistics behind each change."""

import json
import os

import numpy as np
import pytest

from edgebatch.adapt import AdaptConfig
from edgebatch.errors import TrainingError, UsageError
from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import fit, inject_oom
from test_training_support import make_data, make_dataset, make_loss, make_model, make_optimizer, max_weight_diff

tf = pytest.importorskip("tensorflow")

BASE_RATES = {"sgd": 0.1, "adam": 0.01}  # test_training_support.make_optimizer's rates


def growing_config(**overrides):
    """Grows at every check (any cosine above -0.5 counts as agreement): a known, busy schedule."""
    settings = {"check_every_updates": 2, "cooldown_updates": 1, "grow_above_cosine": -0.5,
                "shrink_below_cosine": -0.9, "noise_cap_factor": None, "grow_below_noise_fraction": None,
                "cosine_window_updates": 1, "max_effective_batch_samples": 24, "lr_rule": "linear",
                "drift_rise": 0.89}  # drift off: (1 - 0.9) + 0.89 is a share no batch reaches
    settings.update(overrides)
    return AdaptConfig(**settings)


def replay(x, y, report, optimizer_name):
    """The plain loop over the same consecutive chunks at the same rates: one step per update, mean loss."""
    model, optimizer, loss = make_model(), make_optimizer(optimizer_name), make_loss()
    start = 0
    for record in report.updates:
        if start >= len(x):
            start = 0  # the next epoch
        xs, ys = x[start : start + record.examples], y[start : start + record.examples]
        start += record.examples
        optimizer.learning_rate = BASE_RATES[optimizer_name] * record.lr_scale
        with tf.GradientTape() as tape:
            value = loss(ys, model(xs, training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
    return [np.array(w) for w in model.get_weights()]


@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_an_adaptive_run_equals_the_plain_loop_fed_its_batch_sizes_and_rates_with_ooms(optimizer_name):
    x, y = make_data(120)
    model = make_model()
    with inject_oom([2, 9]):
        report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer(optimizer_name),
                     effective_batch=6, epochs=2, adapt=growing_config())
    effective = [record.effective_batch for record in report.updates]
    assert len(report.adapt_changes) >= 3 and max(effective) == 24 and effective[0] == 6
    assert len(report.oom_events) == 2
    assert all(len(record.micro_batches) >= 2 for record in report.updates if record.examples >= 2)
    assert {record.lr_scale for record in report.updates} >= {1.0, 4.0}  # linear: 24 / 6
    assert sum(record.examples for record in report.updates) == 240
    assert max_weight_diff([np.array(w) for w in model.get_weights()], replay(x, y, report, optimizer_name)) < 1e-5


def test_micro_batches_stay_under_the_governor_while_the_effective_batch_grows_past_it():
    x, y = make_data(200)
    governor = Governor(GovernorConfig(ceiling_batch=5, effective_batch=24))
    report = fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                 effective_batch=8, governor=governor, adapt=growing_config())
    assert max(record.effective_batch for record in report.updates) == 24
    assert max(max(record.micro_batches) for record in report.updates) == 5
    assert report.traces["micro_step"] == 1 and report.traces["update_statistics"] == 1


def test_a_resumed_run_decides_and_trains_as_an_uninterrupted_one(tmp_path):
    x, y = make_data(96)
    config = growing_config(check_every_updates=3, grow_above_cosine=0.2, shrink_below_cosine=0.0,
                            cosine_window_updates=2)

    def run(directory, **kwargs):
        model = make_model()
        report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"),
                     effective_batch=4, epochs=2, adapt=config, checkpoint_dir=str(directory), **kwargs)
        return model, report

    whole_model, whole = run(tmp_path / "whole")
    run(tmp_path / "split", max_updates=7)
    resumed_model, resumed = run(tmp_path / "split")
    assert resumed.resumed_from is not None and resumed.resumed_from.updates == 7
    assert [r.adapt for r in resumed.updates] == [r.adapt for r in whole.updates[7:]]
    assert [r.effective_batch for r in resumed.updates] == [r.effective_batch for r in whole.updates[7:]]
    assert whole.adapt_changes  # the run did change its batch
    assert max_weight_diff(resumed_model.get_weights(), whole_model.get_weights()) < 1e-6
    with pytest.raises(TrainingError, match="adaptive batch"):
        fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"),
            effective_batch=4, epochs=3, checkpoint_dir=str(tmp_path / "split"))


def test_the_logs_carry_the_statistics_behind_each_decision(tmp_path):
    x, y = make_data(64)
    log_path = tmp_path / "decisions.jsonl"
    fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"), effective_batch=8,
        adapt=growing_config(), decision_log=str(log_path), log_dir=str(tmp_path / "tb"))
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert all(line["adapt"] is not None for line in lines)
    changes = [line for line in lines if line["adapt"]["changed"]]
    assert changes and all("cosine" in line["adapt"]["reason"] for line in changes)
    # Every update ran >= 2 pieces; the scale is None only while the |G|^2 EMA is not positive yet.
    assert any(line["adapt"]["noise_scale_samples"] is not None for line in lines)
    assert lines[-1]["adapt"]["mean_cosine"] is not None and lines[-1]["samples_per_second"] > 0
    tags = set()
    for directory, _, files in os.walk(tmp_path / "tb"):
        for name in files:
            for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
                tags.update(value.tag for value in event.summary.value)
    assert {"edgebatch/adapt/noise_scale_samples", "edgebatch/adapt/mean_cosine",
            "edgebatch/adapt/next_effective_batch", "edgebatch/samples_per_second"} <= tags


def test_a_decaying_schedule_grows_the_batch_instead_and_the_schedule_is_scaled_not_replaced():
    x, y = make_data(96)
    import keras

    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([4], [0.1, 0.05])
    optimizer = keras.optimizers.SGD(learning_rate=schedule)
    config = growing_config(grow_above_cosine=0.99, shrink_below_cosine=-0.99, check_every_updates=1,
                            cooldown_updates=0)
    report = fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=8,
                 adapt=config)
    assert report.adapt_changes and "schedule decayed the rate to 0.50x" in report.adapt_changes[0]["reason"]
    assert report.adapt_changes[0]["effective_batch"] == 12 and report.adapt_changes[0]["lr_scale"] == 1.5
    assert optimizer._learning_rate is schedule  # the user's schedule is back when fit returns


def test_bad_adapt_settings_are_usage_errors():
    x, y = make_data(8)
    arguments = {"loss": make_loss(), "optimizer": make_optimizer("sgd"), "effective_batch": 8}
    with pytest.raises(UsageError, match="AdaptConfig"):
        fit(make_model(), make_dataset(x, y), adapt={"lr_rule": "sqrt"}, **arguments)
    elastic = Governor(GovernorConfig(ceiling_batch=8, effective_batch=8, mode="elastic"))
    with pytest.raises(UsageError, match="mode='fixed'"):
        fit(make_model(), make_dataset(x, y), adapt=AdaptConfig(), governor=elastic, **arguments)
    with pytest.raises(UsageError, match="fixed_micro_batch"):
        fit(make_model(), make_dataset(x, y), adapt=AdaptConfig(), batch_norm="fixed_micro_batch", **arguments)
    small = Governor(GovernorConfig(ceiling_batch=4, effective_batch=4))
    with pytest.raises(UsageError, match="at least the starting batch"):
        fit(make_model(), make_dataset(x, y), adapt=AdaptConfig(), governor=small, **arguments)


def test_a_goodput_run_moves_the_batch_for_goodput_and_equals_the_plain_loop():
    from edgebatch.adapt.goodput import StepCurve

    x, y = make_data(120)
    model = make_model()
    # Flat 0.1 s steps up to 64 and a memory ceiling of 24: every example more per step is free up
    # to the ceiling, so goodput grows the batch (x1.5 a check) to the 24 allowed.
    config = AdaptConfig(policy="goodput", throughput=StepCurve((1, 64), (10.0, 640.0)), check_every_updates=1,
                         cooldown_updates=0, max_effective_batch_samples=24, lr_rule="linear", drift_rise=0.89)
    governor = Governor(GovernorConfig(ceiling_batch=24, effective_batch=24))
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                 effective_batch=6, epochs=2, adapt=config, governor=governor)
    assert report.adapt_changes and all(change["reason"].startswith("goodput: ") for change in report.adapt_changes)
    assert max(record.effective_batch for record in report.updates) == 24
    assert max_weight_diff([np.array(w) for w in model.get_weights()], replay(x, y, report, "sgd")) < 1e-5


def test_a_goodput_run_on_its_own_measured_step_times_moves_the_batch_and_equals_the_plain_loop():
    """throughput="measured": no profile; the curve comes from fit's own piece and update times.
    This model's steps cost about the same at 3 examples as at 12 (fixed costs dominate), so goodput
    grows the batch; whatever it chooses, the updates equal the plain loop over the same sizes."""
    x, y = make_data(120)
    model = make_model()
    config = AdaptConfig(policy="goodput", throughput="measured", check_every_updates=1, cooldown_updates=0,
                         max_effective_batch_samples=24, lr_rule="linear", drift_rise=0.89)
    governor = Governor(GovernorConfig(ceiling_batch=24, effective_batch=24))
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                 effective_batch=6, epochs=2, adapt=config, governor=governor)
    assert report.adapt_changes and all(change["reason"].startswith("goodput: ") for change in report.adapt_changes)
    assert max(record.effective_batch for record in report.updates) > 6
    assert max_weight_diff([np.array(w) for w in model.get_weights()], replay(x, y, report, "sgd")) < 1e-5
