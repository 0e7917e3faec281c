"""fit under tf.distribute.MirroredStrategy on two logical CPU devices, in a fresh process.

The logical devices must be configured before TensorFlow initialises its devices, so
tests/test_training_mirrored.py runs this script in a subprocess. Prints one JSON line with what
the scenario found.

usage: python mirrored_run.py SCENARIO   (exact | changes | refusals | give_up | keras | resume DIR)
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for the helpers

import tensorflow as tf

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

import numpy as np
from test_training_support import (
    make_data,
    make_dataset,
    make_loss,
    make_model,
    make_optimizer,
    max_weight_diff,
    reference_weights,
)

from edgebatch.errors import TrainingError, UsageError
from edgebatch.governor import Governor, GovernorConfig, Observation
from edgebatch.training import fit, inject_oom
from edgebatch.training.replicas import mirrored_governor_config

EFFECTIVE = 16


_STRATEGY = []


def strategy():
    """The process's one MirroredStrategy: a second instance allocates the same collective instance
    keys as the first, and TensorFlow then aborts its collectives with a shape mismatch."""
    if not _STRATEGY:
        _STRATEGY.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    return _STRATEGY[0]


def summary(report, model, expected):
    return {
        "diff": max_weight_diff(model.get_weights(), expected),
        "examples": [r.examples for r in report.updates],
        "micro_batches": [list(r.micro_batches) for r in report.updates],
        "examples_seen": report.examples_seen,
        "oom": [{"micro_batch": e.micro_batch, "offset": e.example_offset, "next": e.next_micro_batch,
                 "injected": e.injected, "gave_up": e.gave_up, "message": e.message} for e in report.oom_events],
        "traces": report.traces,
        "replicas": report.replicas,
        "variable_type": type(model.trainable_variables[0].value).__name__,
        "seconds": [round(r.seconds, 3) for r in report.updates],
    }


def exact():
    """Adam and SGD, a split that is not the replicas' (ceiling 6 of 16), OOMs on one replica, fit
    inside and outside the scope: weights vs the plain loop."""
    x, y = make_data(50)  # 3 x 16 + 2: the epoch's last update is short
    results = {}
    for name, inside, failures in (("adam", True, [2]), ("sgd", False, [3])):
        expected = reference_weights(x, y, EFFECTIVE, name)
        mirrored = strategy()
        with mirrored.scope():
            model = make_model()
            optimizer = make_optimizer(name)
        governor = Governor(mirrored_governor_config(EFFECTIVE, 2, ceiling_batch=8, slow_step_factor=1e9))
        with inject_oom(failures):
            if inside:
                with mirrored.scope():
                    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer,
                                 effective_batch=EFFECTIVE, governor=governor)
            else:
                report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer,
                             effective_batch=EFFECTIVE, governor=governor)
        results[name] = summary(report, model, expected)
    return results


class Schedule:
    """A PressureReader stand-in: the given pressures, one per update, then the last one."""

    def __init__(self, pressures):
        self.pressures = list(pressures)
        self.reads = 0

    def read(self, force=False):
        value = self.pressures[min(self.reads, len(self.pressures) - 1)]
        self.reads += 1
        return Observation(pressure=value)


def changes():
    """Odd effective batch (15), pressure shrinks then grows the micro-batch, an OOM on one replica
    mid-run, two epochs: weights vs the plain loop."""
    effective = 15
    x, y = make_data(75)  # 5 updates of 15 per epoch
    expected = reference_weights(x, y, effective, "adam", epochs=2)
    mirrored = strategy()
    with mirrored.scope():
        model = make_model()
        optimizer = make_optimizer("adam")
    config = mirrored_governor_config(effective, 2, ceiling_batch=13, cooldown_updates=0, grow_patience=1,
                                      slow_step_factor=1e9)
    reader = Schedule([0.95, 0.95, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3])
    with inject_oom([14]), mirrored.scope():
        report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=effective,
                     governor=Governor(config), pressure_reader=reader, epochs=2)
    result = summary(report, model, expected)
    result["upper_batch"] = config.upper_batch
    result["reasons"] = [r.reason for r in report.updates]
    return result


def refusals():
    """What fit refuses under MirroredStrategy, with its message."""
    x, y = make_data(16)
    found = {}

    def attempt(name, call):
        try:
            call()
            found[name] = None
        except UsageError as exc:
            found[name] = str(exc)

    mirrored = strategy()
    with mirrored.scope():
        model = make_model()
        optimizer = make_optimizer("sgd")
    plain_model, plain_optimizer = make_model(), make_optimizer("sgd")

    def run(m, opt, governor=None, effective=EFFECTIVE):
        with mirrored.scope():
            fit(m, make_dataset(x, y), loss=make_loss(), optimizer=opt, effective_batch=effective, governor=governor,
                max_updates=1)

    attempt("model_outside_scope", lambda: run(plain_model, optimizer))
    attempt("optimizer_outside_scope", lambda: run(model, plain_optimizer))
    attempt("governor_multiple", lambda: run(model, optimizer, Governor(GovernorConfig(ceiling_batch=4, effective_batch=16))))
    attempt("governor_min_batch", lambda: run(
        model, optimizer, Governor(GovernorConfig(ceiling_batch=4, effective_batch=16, multiple=2))))
    attempt("ceiling_below_replicas", lambda: mirrored_governor_config(16, 2, ceiling_batch=1))
    attempt("effective_below_replicas", lambda: run(model, optimizer, effective=1))
    attempt("accepted", lambda: run(model, optimizer))
    return found


def give_up():
    """OOMs on one replica down to the smallest global micro-batch (2): TrainingError, weights untouched."""
    x, y = make_data(16)
    mirrored = strategy()
    with mirrored.scope():
        model = make_model()
        optimizer = make_optimizer("sgd")
    before = [np.array(w) for w in model.get_weights()]
    governor = Governor(mirrored_governor_config(EFFECTIVE, 2, ceiling_batch=4))
    message = None
    with inject_oom([1, 2]), mirrored.scope():
        try:
            fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=EFFECTIVE,
                governor=governor)
        except TrainingError as exc:
            message = str(exc)
    unchanged = max_weight_diff(model.get_weights(), before)
    # The accumulators were zeroed: a fresh fit now trains exactly like the plain loop.
    expected = reference_weights(x, y, EFFECTIVE, "sgd", model=make_model())
    with mirrored.scope():
        report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                     effective_batch=EFFECTIVE, governor=Governor(mirrored_governor_config(EFFECTIVE, 2, ceiling_batch=4)))
    return {"message": message, "unchanged": unchanged, "after": summary(report, model, expected)}


def resume(checkpoint_dir):
    """Checkpoint after 3 updates under the strategy, resume in a second fit call: the plain loop's weights."""
    x, y = make_data(50)
    expected = reference_weights(x, y, EFFECTIVE, "adam", epochs=2)
    mirrored = strategy()
    with mirrored.scope():
        model = make_model()
        optimizer = make_optimizer("adam")
        first = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=EFFECTIVE,
                    governor=Governor(mirrored_governor_config(EFFECTIVE, 2, ceiling_batch=6)), epochs=2,
                    checkpoint_dir=checkpoint_dir, max_updates=3)
        model = make_model(seed=7)  # other weights: the checkpoint must restore them
        optimizer = make_optimizer("adam")
        report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=EFFECTIVE,
                     governor=Governor(mirrored_governor_config(EFFECTIVE, 2, ceiling_batch=6)), epochs=2,
                     checkpoint_dir=checkpoint_dir)
    result = summary(report, model, expected)
    result["first_updates"] = len(first.updates)
    result["resumed_from"] = None if report.resumed_from is None else report.resumed_from.updates
    return result


def keras():
    """model.fit under the strategy with enable_micro_batching, the micro-batch moved by pressure,
    against plain model.fit without a strategy (every batch splits evenly over the replicas)."""
    from edgebatch.training.keras_integration import enable_micro_batching

    x, y = make_data(56)  # batches 16, 16, 16, 8: 8, 8, 8, 4 per replica
    plain = make_model()
    plain.compile(optimizer=make_optimizer("sgd"), loss=make_loss(), metrics=["accuracy"])
    plain_history = plain.fit(x, y, batch_size=EFFECTIVE, epochs=2, shuffle=False, verbose=0)
    mirrored = strategy()
    with mirrored.scope():
        model = make_model()
        model.compile(optimizer=make_optimizer("sgd"), loss=make_loss(), metrics=["accuracy"])
    config = mirrored_governor_config(EFFECTIVE, 2, ceiling_batch=8, cooldown_updates=0, grow_patience=1,
                                      slow_step_factor=1e9)
    refused = None
    try:
        enable_micro_batching(model, Governor(GovernorConfig(ceiling_batch=8, effective_batch=EFFECTIVE)))
    except UsageError as exc:
        refused = str(exc)
    controller = enable_micro_batching(model, Governor(config), pressure_reader=Schedule([0.95, 0.95, 0.3, 0.3, 0.3]))
    history = model.fit(x, y, batch_size=EFFECTIVE, epochs=2, shuffle=False, verbose=0, callbacks=[controller.callback()])
    return {
        "diff": max_weight_diff(model.get_weights(), plain.get_weights()),
        "trained": max_weight_diff(model.get_weights(), make_model().get_weights()),
        "loss": history.history["loss"], "plain_loss": plain_history.history["loss"],
        "accuracy": history.history["accuracy"], "plain_accuracy": plain_history.history["accuracy"],
        "decisions": controller.decisions, "batches": controller.batches, "traces": controller.traces,
        "replicas": controller.replicas, "refused": refused,
    }


if __name__ == "__main__":
    scenario = sys.argv[1]
    result = {"exact": exact, "changes": changes, "refusals": refusals, "give_up": give_up, "keras": keras,
              "resume": lambda: resume(sys.argv[2])}[scenario]()
    print("RESULT " + json.dumps(result))
