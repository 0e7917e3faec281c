"""Checkpoint and resume: a stopped or killed run, resumed, ends with an uninterrupted run's weights."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import fit, inject_oom
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

REPO = Path(__file__).resolve().parents[1]
EFFECTIVE = 8
# Tests that compare random draws (dropout masks, generator noise) need the same micro-batch split
# in every run: the draws follow the split. On a busy machine a slow step made the governor shrink
# in one run and not in the other (0.011 apart in the full suite, with a benchmark running beside
# it), so these runs never count a step as slow.
STEADY_RANDOM_DRAWS = GovernorConfig(ceiling_batch=4, effective_batch=EFFECTIVE, slow_step_factor=1e9)


def governed_fit(x, y, checkpoint_dir, **kwargs):
    model = make_model()
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"),
                 effective_batch=EFFECTIVE, governor=Governor(GovernorConfig(ceiling_batch=3, effective_batch=EFFECTIVE)),
                 epochs=2, checkpoint_dir=str(checkpoint_dir), **kwargs)
    return model, report


def test_stop_with_max_updates_then_resume(tmp_path):
    x, y = make_data(36)  # 5 updates per epoch, the last of 4 examples
    expected = reference_weights(x, y, EFFECTIVE, "adam", epochs=2)
    _, first = governed_fit(x, y, tmp_path, max_updates=7, checkpoint_every_updates=3)
    assert first.stopped_by_max_updates
    assert first.final_progress.epoch == 1 and first.final_progress.examples_in_epoch == 16
    assert len(first.checkpoints) == 3  # after updates 3 and 6, and at the stop (7)
    model, second = governed_fit(x, y, tmp_path)
    assert second.resumed_from.updates == 7 and second.examples_seen == 72 - 52
    assert [r.update for r in second.updates] == [8, 9, 10]
    assert max_weight_diff(model.get_weights(), expected) < 1e-4
    # The run is complete: calling fit again trains nothing and keeps the weights.
    again, third = governed_fit(x, y, tmp_path)
    assert third.updates == [] and max_weight_diff(again.get_weights(), expected) < 1e-4


def test_resumed_governor_keeps_its_micro_batch(tmp_path):
    x, y = make_data(32)
    with inject_oom([1]):
        _, first = governed_fit(x, y, tmp_path, max_updates=1)
    assert first.updates[0].next_micro_batch == 1  # the OOM shrank 3 -> 1
    _, second = governed_fit(x, y, tmp_path, max_updates=2)
    assert second.updates[0].micro_batches == (1,) * EFFECTIVE


KILLED_RUN = textwrap.dedent(
    """
    import os, sys
    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit
    from test_training_support import make_data, make_dataset, make_loss, make_model, make_optimizer

    checkpoint_dir, log_path, kill_after = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def on_update(record):
        if record.update == kill_after:
            os._exit(17)  # no cleanup, no final checkpoint: as abrupt as a SIGKILL for fit

    x, y = make_data(80)
    fit(make_model(), make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"), effective_batch=8,
        governor=Governor(GovernorConfig(ceiling_batch=3, effective_batch=8)), epochs=2,
        checkpoint_dir=checkpoint_dir, checkpoint_every_updates=4, decision_log=log_path, on_update=on_update)
    """
)


@pytest.mark.slow
def test_killed_process_resumes_to_the_uninterrupted_weights(tmp_path):
    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN)
    checkpoint_dir, log_path = tmp_path / "ckpt", tmp_path / "decisions.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]),
               EDGEBATCH_INJECT_OOM="2")  # an OOM in the killed process too: the governor state must survive
    done = subprocess.run([sys.executable, str(script), str(checkpoint_dir), str(log_path), "15"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 17, done.stderr[-2000:]
    logged = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [line["update"] for line in logged] == list(range(1, 16))
    assert logged[0]["oom_events"] == 1 and logged[0]["micro_batches"] == [3, 1, 1, 1, 1, 1]

    x, y = make_data(80)
    expected = reference_weights(x, y, EFFECTIVE, "adam", epochs=2)
    model = make_model()
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"),
                 effective_batch=EFFECTIVE, governor=Governor(GovernorConfig(ceiling_batch=3, effective_batch=EFFECTIVE)),
                 epochs=2, checkpoint_dir=str(checkpoint_dir), decision_log=str(log_path))
    # The last checkpoint was after update 12 (epoch 1, 16 examples in): updates 13-15 are redone.
    assert report.resumed_from.updates == 12 and report.resumed_from.epoch == 1
    assert report.resumed_from.examples_in_epoch == 16
    assert report.examples_seen == 64
    assert max_weight_diff(model.get_weights(), expected) < 1e-4
    # The governor's OOM shrink (3 -> 1) outlived the process; it is still in its cooldown.
    assert report.updates[0].largest_micro_batch == 1


def dropout_bn_model():
    import keras

    init = keras.initializers.GlorotUniform(seed=1)
    return keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(8, activation="tanh", kernel_initializer=init),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.Dropout(0.5, seed=7, name="drop"),
        keras.layers.Dense(3, kernel_initializer=init),
    ])


def test_resume_restores_dropout_rng_and_batch_norm_statistics(tmp_path):
    x, y = make_data(40)

    def run(checkpoint_dir=None, **kwargs):
        model = dropout_bn_model()
        report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"),
                     effective_batch=EFFECTIVE, governor=Governor(STEADY_RANDOM_DRAWS),
                     epochs=2, checkpoint_dir=checkpoint_dir, batch_norm="fixed_micro_batch", **kwargs)
        return model, report

    uninterrupted, _ = run()
    again, _ = run()
    assert max_weight_diff(again.get_weights(), uninterrupted.get_weights()) == 0.0  # seeded: deterministic
    run(str(tmp_path), max_updates=3)
    resumed, report = run(str(tmp_path))
    assert report.resumed_from.updates == 3
    assert report.random_layers == ["drop"] and report.exactness == "micro_batch_statistics"
    # get_weights() holds the moving mean/variance and the dropout SeedGenerator state too: the
    # resumed model drew the same masks (state [7, 2 per micro-step]) and kept the statistics.
    assert max_weight_diff(resumed.get_weights(), uninterrupted.get_weights()) < 1e-5
    state = resumed.get_layer("drop").seed_generator.state.numpy().tolist()
    assert state == [7, 2 * 10]  # 10 updates of 2 micro-batches, each drew one seed


def test_resume_restores_the_global_tf_random_generator(tmp_path):
    import keras
    import tensorflow as tf

    class GlobalNoise(keras.layers.Layer):
        """Adds noise from TensorFlow's global generator in training (as hand-written layers do)."""

        def call(self, inputs, training=False):
            if training:
                return inputs + tf.random.get_global_generator().normal(tf.shape(inputs), stddev=0.5)
            return inputs

    def build():
        init = keras.initializers.GlorotUniform(seed=1)
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh", kernel_initializer=init),
                                 GlobalNoise(), keras.layers.Dense(3, kernel_initializer=init)])

    x, y = make_data(32)

    def run(generator_seed, checkpoint_dir=None, **kwargs):
        tf.random.set_global_generator(tf.random.Generator.from_seed(generator_seed))
        model = build()
        fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"), effective_batch=EFFECTIVE,
            governor=Governor(STEADY_RANDOM_DRAWS), epochs=2,
            checkpoint_dir=checkpoint_dir, **kwargs)
        return model

    try:
        uninterrupted = run(1)
        assert max_weight_diff(run(1).get_weights(), uninterrupted.get_weights()) == 0.0
        assert max_weight_diff(run(2).get_weights(), uninterrupted.get_weights()) > 1e-4  # the noise matters
        run(1, str(tmp_path), max_updates=3)
        # A new process starts with another generator state; the checkpoint's state replaces it.
        resumed = run(99, str(tmp_path))
        assert max_weight_diff(resumed.get_weights(), uninterrupted.get_weights()) < 1e-5
    finally:
        tf.random.set_global_generator(tf.random.Generator.from_non_deterministic_state())
