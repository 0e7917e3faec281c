"""Keras integration: model.fit with governed micro-batches equals plain model.fit (Keras 3 and tf_keras)."""

import numpy as np
import pytest

from edgebatch.errors import UsageError
from edgebatch.governor import Governor, GovernorConfig
from test_training_support import FixedPressure, make_data, make_loss, make_model, make_optimizer, max_weight_diff

tf = pytest.importorskip("tensorflow")
keras_integration = pytest.importorskip("edgebatch.training.keras_integration")

BATCH = 16


def keras_world(name):
    if name == "keras":
        import keras

        return keras
    return pytest.importorskip("tf_keras")


def compiled_model(world, metrics=("accuracy",)):
    model = make_model(world)
    model.compile(optimizer=make_optimizer("sgd", world), loss=make_loss(world), metrics=list(metrics))
    return model


@pytest.mark.parametrize("world_name", ["keras", "tf_keras"])
@pytest.mark.parametrize("ceiling", [5, 3])
def test_micro_batched_fit_equals_plain_fit(world_name, ceiling):
    world = keras_world(world_name)
    x, y = make_data(56)  # 3 full batches of 16 and one of 8
    plain = compiled_model(world)
    plain_history = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = compiled_model(world)
    controller = keras_integration.enable_micro_batching(
        model, Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=BATCH)))
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[controller.callback()])
    assert max_weight_diff(model.get_weights(), plain.get_weights()) < 1e-4
    np.testing.assert_allclose(history.history["loss"], plain_history.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["accuracy"], plain_history.history["accuracy"])
    assert controller.batches == 8
    assert max_weight_diff(model.get_weights(), make_model(world).get_weights()) > 1e-3  # it trained


def count_plain_traces(model):
    """Wrap the model's own train_step with a trace counter (a baseline: Keras itself may trace a
    step twice on its first call when compiled losses or metrics create variables in that trace)."""
    import types

    traces = [0]
    original = model.train_step

    def counted(self, data):
        traces[0] += 1
        return original(data)

    object.__setattr__(model, "train_step", types.MethodType(counted, model))
    return traces


@pytest.mark.parametrize("world_name", ["keras", "tf_keras"])
def test_micro_batch_changes_take_effect_without_retracing(world_name):
    world = keras_world(world_name)
    x, y = make_data(64)  # whole batches only: one input shape
    plain = compiled_model(world)
    plain_traces = count_plain_traces(plain)
    plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = compiled_model(world)
    governor = Governor(GovernorConfig(ceiling_batch=BATCH, effective_batch=BATCH, cooldown_updates=0))
    controller = keras_integration.enable_micro_batching(model, governor, pressure_reader=FixedPressure(0.95))
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[controller.callback()])
    assert [d["micro_batch"] for d in controller.decisions] == [8, 4, 2, 1]
    assert int(controller.micro_batch.numpy()) == 1
    # Four micro-batch sizes ran, yet the step was traced no more often than plain fit's.
    assert controller.traces == plain_traces[0] <= 2
    assert max_weight_diff(model.get_weights(), plain.get_weights()) < 1e-4


def test_on_oom_shrinks_for_the_next_fit():
    import keras

    model = compiled_model(keras)
    controller = keras_integration.enable_micro_batching(model, Governor(GovernorConfig(ceiling_batch=16, effective_batch=16)))
    decision = controller.on_oom()
    assert decision.micro_batch == 8 and int(controller.micro_batch.numpy()) == 8
    assert isinstance(controller.callback(), keras_integration.GovernorCallback)


def test_refuses_elastic_mode_and_uncompiled_models():
    import keras

    elastic = Governor(GovernorConfig(ceiling_batch=8, effective_batch=8, mode="elastic"))
    with pytest.raises(UsageError, match="'fixed'"):
        keras_integration.enable_micro_batching(compiled_model(keras), elastic)
    with pytest.raises(UsageError, match="compile"):
        keras_integration.enable_micro_batching(make_model(), Governor(GovernorConfig(ceiling_batch=8, effective_batch=8)))
    with pytest.raises(UsageError, match="Keras 3 or tf_keras"):
        keras_integration.enable_micro_batching(object(), Governor(GovernorConfig(ceiling_batch=8, effective_batch=8)))


def test_mixed_float16_with_loss_scaling_matches_plain_fit():
    import keras

    x, y = make_data(32)

    def build():
        init = keras.initializers.GlorotUniform(seed=1)
        model = keras.Sequential([
            keras.Input((5,)),
            keras.layers.Dense(8, activation="tanh", kernel_initializer=init, dtype="mixed_float16"),
            keras.layers.Dense(3, kernel_initializer=init, dtype="float32"),
        ])
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss=make_loss())
        return model

    plain = build()
    plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = build()
    controller = keras_integration.enable_micro_batching(model, Governor(GovernorConfig(ceiling_batch=5, effective_batch=BATCH)))
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[controller.callback()])
    # float16 activations round differently per piece; the loss scale is applied and removed once per batch.
    assert max_weight_diff(model.get_weights(), plain.get_weights()) < 1e-3
    assert max_weight_diff(model.get_weights(), build().get_weights()) > 1e-2


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_embedding_gradients_stay_sparse_and_match_plain_fit(optimizer):
    import keras

    rng = np.random.default_rng(4)
    x = rng.integers(0, 30, size=(40, 4)).astype("int32")
    y = rng.integers(0, 3, size=40).astype("int64")

    def build():
        init = keras.initializers.GlorotUniform(seed=2)
        model = keras.Sequential([
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(30, 6, embeddings_initializer=init, name="embedding"),
            keras.layers.Flatten(),
            keras.layers.Dense(3, kernel_initializer=init),
        ])
        model.compile(optimizer=make_optimizer(optimizer), loss=make_loss())
        return model

    plain = build()
    plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    model = build()
    seen = []
    original = model.optimizer.apply_gradients

    def spy(grads_and_vars):
        pairs = list(grads_and_vars)
        seen.extend(type(g).__name__ for g, _ in pairs)  # at trace time
        return original(pairs)

    object.__setattr__(model.optimizer, "apply_gradients", spy)
    controller = keras_integration.enable_micro_batching(model, Governor(GovernorConfig(ceiling_batch=3, effective_batch=BATCH)))
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[controller.callback()])
    assert seen and seen[0] == "IndexedSlices"  # the embedding's gradient reached the optimizer sparse
    assert all(name != "IndexedSlices" for name in seen[1:3])
    assert max_weight_diff(model.get_weights(), plain.get_weights()) < 1e-4
    assert max_weight_diff(model.get_weights(), build().get_weights()) > 1e-3  # it trained


def test_batch_norm_is_named_and_a_strategy_is_refused():
    import keras

    init = keras.initializers.GlorotUniform(seed=1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, kernel_initializer=init),
                              keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(3)])
    model.compile(optimizer=make_optimizer("sgd"), loss=make_loss())
    with pytest.warns(UserWarning, match="'bn'"):
        controller = keras_integration.enable_micro_batching(model, Governor(GovernorConfig(ceiling_batch=4, effective_batch=8)))
    assert controller.batch_norm_layers == ["bn"]
    assert keras_integration.enable_micro_batching(
        compiled_model(keras), Governor(GovernorConfig(ceiling_batch=4, effective_batch=8))).batch_norm_layers == []
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        distributed = compiled_model(keras)
    with pytest.raises(UsageError, match="OneDeviceStrategy"):
        keras_integration.enable_micro_batching(distributed, Governor(GovernorConfig(ceiling_batch=4, effective_batch=8)))


@pytest.mark.parametrize("world_name", ["keras", "tf_keras"])
def test_a_model_with_an_open_token_axis_hands_the_governor_no_batch_time(world_name):
    """A batch of token sequences takes as long as its length makes it, so the slow-step rule gets
    no batch time from such a model; a model of fixed shapes still hands it over."""
    world = keras_world(world_name)
    inputs = world.Input((None,), dtype="int32")
    pooled = world.layers.GlobalAveragePooling1D()(world.layers.Embedding(20, 4)(inputs))
    tokens_model = world.Model(inputs, world.layers.Dense(2)(pooled))
    fixed_model = compiled_model(world)
    tokens_model.compile(optimizer=make_optimizer("sgd", world), loss=make_loss(world))
    seen = {}
    for name, model in (("tokens", tokens_model), ("fixed", fixed_model)):
        governor = Governor(GovernorConfig(ceiling_batch=8, effective_batch=8))
        observe = governor.observe
        governor.observe = lambda observation, name=name: (seen.setdefault(name, observation.step_seconds),
                                                           observe(observation))[1]
        keras_integration.enable_micro_batching(model, governor).observe_batch(0.25)
    assert keras_integration.has_open_input_axis(tokens_model) and not keras_integration.has_open_input_axis(fixed_model)
    assert seen == {"tokens": None, "fixed": 0.25}
