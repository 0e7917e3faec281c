"""LR coupling: the four rules (pure), ScaledSchedule (a Keras schedule x a mutable factor), and the
training loop's LearningRateScaler scaling a schedule instead of refusing it."""

import math
from itertools import pairwise

import pytest

from edgebatch.adapt.lr_coupling import LR_RULES, change_factor, default_rule, lr_scale

# --- the rules, pure ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule, base, batch, expected",
    [
        ("none", 64, 256, 1.0),
        ("linear", 64, 256, 4.0),
        ("linear", 64, 32, 0.5),
        ("sqrt", 64, 256, 2.0),
        ("sqrt", 64, 16, 0.5),
        ("inverse_sqrt", 64, 256, 0.5),  # the seed: LR x sqrt(B_old / B_new)
        ("inverse_sqrt", 64, 16, 2.0),
        ("sqrt", 64, 64, 1.0),
    ],
)
def test_rules(rule, base, batch, expected):
    assert lr_scale(rule, base, batch) == pytest.approx(expected)


@pytest.mark.parametrize("rule", LR_RULES)
def test_per_change_factors_compose_to_the_scale_from_the_base(rule):
    path = [64, 96, 144, 72, 108]
    product = math.prod(change_factor(rule, old, new) for old, new in pairwise(path))
    assert product == pytest.approx(lr_scale(rule, path[0], path[-1]))


def test_default_rule_is_sqrt_for_adaptive_optimizers():
    assert default_rule(adaptive_optimizer=True) == "sqrt"
    assert default_rule(adaptive_optimizer=False) == "linear"


@pytest.mark.parametrize("rule, base, batch", [("cubic", 1, 2), ("sqrt", 0, 2), ("sqrt", 4, -1),
                                               ("linear", 4, float("inf")), ("linear", True, 2)])
def test_rules_reject_bad_input(rule, base, batch):
    with pytest.raises(ValueError):
        lr_scale(rule, base, batch)


# --- ScaledSchedule -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keras():
    pytest.importorskip("tensorflow")
    import keras

    return keras


def decay(keras):
    return keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)


def test_scaled_schedule_multiplies_the_schedule_by_its_factor(keras):
    from edgebatch.adapt.scaled_schedule import ScaledSchedule

    inner = decay(keras)
    scaled = ScaledSchedule(inner, 2.0)
    assert float(scaled(10)) == pytest.approx(2.0 * float(inner(10)))  # 2 x 0.05
    scaled.set_factor(0.25)
    assert float(scaled(20)) == pytest.approx(0.25 * 0.025)


def test_scaled_schedule_round_trips_through_its_config(keras):
    from edgebatch.adapt.scaled_schedule import ScaledSchedule

    scaled = ScaledSchedule(decay(keras), 3.0)
    again = ScaledSchedule.from_config(scaled.get_config())
    assert float(again(5)) == pytest.approx(float(scaled(5)))
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(scaled))
    assert float(restored(5)) == pytest.approx(float(scaled(5)))


def test_a_traced_function_sees_a_new_factor_without_retracing(keras):
    import tensorflow as tf

    from edgebatch.adapt.scaled_schedule import ScaledSchedule

    scaled = ScaledSchedule(keras.optimizers.schedules.PiecewiseConstantDecay([5], [1.0, 0.1]))
    traces = []

    @tf.function
    def rate(step):
        traces.append(1)
        return scaled(step)

    assert float(rate(tf.constant(0))) == pytest.approx(1.0)
    scaled.set_factor(4.0)
    assert float(rate(tf.constant(6))) == pytest.approx(0.4)
    assert len(traces) == 1


def test_wrap_schedule_keeps_the_keras_flavour(keras):
    tf_keras = pytest.importorskip("tf_keras")
    from edgebatch.adapt.scaled_schedule import is_schedule, wrap_schedule

    legacy = tf_keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    wrapped = wrap_schedule(legacy, 2.0)
    assert isinstance(wrapped, tf_keras.optimizers.schedules.LearningRateSchedule)
    assert float(wrapped(10)) == pytest.approx(0.1)
    assert isinstance(wrap_schedule(decay(keras)), keras.optimizers.schedules.LearningRateSchedule)
    assert not is_schedule(0.1)
    with pytest.raises(TypeError, match="not a LearningRateSchedule"):
        wrap_schedule(0.1)


# --- LearningRateScaler with a schedule (training/learning_rate.py) ------------------------------------


def test_scaler_scales_a_schedule_and_restores_it(keras):
    from edgebatch.training.learning_rate import LearningRateScaler

    inner = decay(keras)
    optimizer = keras.optimizers.SGD(learning_rate=inner)
    scaler = LearningRateScaler(optimizer, enabled=True)
    assert scaler.base_learning_rate is None  # a schedule has no single base rate
    scaler.apply(0.5)
    assert float(optimizer.learning_rate) == pytest.approx(0.05)  # step 0: 0.1 x 0.5
    optimizer.iterations.assign(10)
    assert float(optimizer.learning_rate) == pytest.approx(0.025)  # the decay keeps its shape
    scaler.restore()
    assert optimizer._learning_rate is inner
    assert float(optimizer.learning_rate) == pytest.approx(0.05)


def test_scaler_still_refuses_what_it_cannot_scale(keras):
    from edgebatch.errors import UsageError
    from edgebatch.training.learning_rate import LearningRateScaler

    optimizer = keras.optimizers.SGD(learning_rate=lambda: 0.1)  # a plain callable: no schedule
    with pytest.raises(UsageError, match="float or a Keras LearningRateSchedule"):
        LearningRateScaler(optimizer, enabled=True)
    LearningRateScaler(optimizer, enabled=False)  # inactive: touches nothing


def test_elastic_fit_scales_a_schedule_and_puts_it_back(keras):
    # As tests/test_training_fit.py's elastic test, with a constant schedule in place of 0.1.
    from test_training_support import (
        FixedPressure,
        make_data,
        make_dataset,
        make_loss,
        make_model,
    )

    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit

    x, y = make_data(30)
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1000], [0.1, 0.1])
    optimizer = keras.optimizers.SGD(learning_rate=schedule)
    config = GovernorConfig(ceiling_batch=8, effective_batch=8, mode="elastic", elastic_floor_batch=4,
                            lr_scaling="linear", cooldown_updates=0)
    rates = []
    report = fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=8,
                 governor=Governor(config), pressure_reader=FixedPressure(0.95),
                 on_update=lambda record: rates.append(float(optimizer.learning_rate)))
    assert [record.examples for record in report.updates][:3] == [8, 4, 4]
    assert rates[:3] == pytest.approx([0.1, 0.05, 0.05])
    assert optimizer._learning_rate is schedule
