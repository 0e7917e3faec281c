"""Fine-tune a small conv net on scikit-learn's digits (8x8 images, bundled: no download) under a governor.

    python examples/finetune_digits.py                      # governor from a cached profile, else explicit numbers
    python examples/finetune_digits.py --inject-oom 3,20    # watch OOM recovery: those micro-batches "fail"
    python examples/finetune_digits.py --profile device_profiles/cpu-...json

The device profile: `edgebatch probe --model examples/finetune_digits.py:build_model` probes this
model and caches a profile; this script looks it up with `edgebatch.cached_profile(model)` (the
device fingerprint and model key the probe computes) and builds the governor from its safe batch
and memory model. Without one it uses
explicit numbers: a ceiling of 64 (the effective batch) and a cautious start at micro-batch 16
(4 accumulated micro-batches per update); the governor grows it while memory pressure stays low
and shrinks it on pressure or an OOM, and the updates stay exactly those of batch 64.

Runs in well under a minute on 2 CPU cores. Prints each governor decision and a per-epoch summary.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

EFFECTIVE_BATCH = 64
FALLBACK_START_MICRO_BATCH = 16


def build_model():
    """The conv net. Layers are named so the architecture hash, hence the profile key, is stable."""
    import keras

    return keras.Sequential(
        [
            keras.Input((8, 8, 1), name="pixels"),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(name="pool1"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(10, name="logits"),
        ],
        name="digits_cnn",
    )


def load_digits_data(seed: int = 0):
    """(train x, train y, test x, test y): pixels scaled to [0, 1], a fixed 80/20 split."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int64")
    order = np.random.default_rng(seed).permutation(len(x))
    split = int(0.8 * len(x))
    train, test = order[:split], order[split:]
    return x[train], y[train], x[test], y[test]


def find_cached_profile(model):
    """The cached profile for this model on this device, or None (with the reason printed).

    A missing or unreadable profile only means "no profile", never a failed example.
    """
    try:
        from edgebatch import cached_profile

        profile = cached_profile(model, device="CPU:0")
        if profile is None:
            print(f"no cached profile for {model.name} on this device (run the probe in the docstring)")
        return profile
    except Exception as exc:  # noqa: BLE001 - an example must run even when the profile lookup cannot
        print(f"no cached profile ({type(exc).__name__}: {exc})")
        return None


def make_governor(model, profile_path: str | None):
    from edgebatch.governor import Governor, GovernorConfig

    profile = None
    if profile_path:
        from edgebatch.profiles import load_profile

        profile = load_profile(profile_path)
    else:
        profile = find_cached_profile(model)
    # Short cooldown and patience so a 90-update run shows the governor moving.
    tuning = {"cooldown_updates": 10, "grow_patience": 3}
    if profile is not None:
        print(f"governor from profile: safe batch {profile.safe_batch}")
        return Governor.from_profile(profile, EFFECTIVE_BATCH, **tuning)
    print(f"governor from explicit numbers: ceiling {EFFECTIVE_BATCH}, start at {FALLBACK_START_MICRO_BATCH}")
    config = GovernorConfig(ceiling_batch=EFFECTIVE_BATCH, effective_batch=EFFECTIVE_BATCH, **tuning)
    return Governor(config, start_micro_batch=FALLBACK_START_MICRO_BATCH)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="passes over the training split")
    parser.add_argument("--profile", help="a device profile JSON file to build the governor from")
    parser.add_argument("--inject-oom", default="", help="micro-batch executions that fail, e.g. 3,20")
    parser.add_argument("--memory-budget", default="256MiB",
                        help="memory the pressure reader measures the allocator against")
    args = parser.parse_args(argv)
    from edgebatch.training.injection import parse_oom_indices

    failing_micro_batches = parse_oom_indices(args.inject_oom, "--inject-oom")  # before the slow imports

    started = time.perf_counter()
    import keras
    import numpy as np
    import tensorflow as tf

    from edgebatch.governor import PressureReader
    from edgebatch.training import fit, inject_oom
    from edgebatch.units import parse_size_bytes

    keras.utils.set_random_seed(0)
    x_train, y_train, x_test, y_test = load_digits_data()
    model = build_model()
    governor = make_governor(model, args.profile)
    reader = PressureReader("CPU:0", budget_bytes=parse_size_bytes(args.memory_budget), every_n_updates=2,
                            min_interval_seconds=0.0)
    # Shuffled once with a fixed seed and not per iteration: an interrupted run can resume exactly.
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(
        len(x_train), seed=0, reshuffle_each_iteration=False)

    def show(record):
        if record.oom_events:
            print(f"  update {record.update:3d}: {record.oom_events} OOM(s); the update still ran all "
                  f"{record.examples} examples, as micro-batches {list(record.micro_batches)}")
        if record.changed:
            pressure = "-" if record.pressure is None else f"{record.pressure:.2f}"
            print(f"  update {record.update:3d}: {record.reason} (pressure {pressure}) -> micro-batch "
                  f"{record.next_micro_batch} x {-(-record.next_effective_batch // record.next_micro_batch)}")

    print(f"training on {len(x_train)} digits, effective batch {EFFECTIVE_BATCH}, "
          f"starting micro-batch {governor.decision.micro_batch}")
    with inject_oom(failing_micro_batches):
        report = fit(model, dataset, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     optimizer=keras.optimizers.Adam(3e-3), governor=governor,  # effective batch: the governor's
                     epochs=args.epochs, pressure_reader=reader, on_update=show)

    per_epoch: dict[int, list] = {}
    for record in report.updates:
        per_epoch.setdefault(record.epoch, []).append(record)
    for epoch, records in sorted(per_epoch.items()):
        loss = sum(r.loss * r.examples for r in records) / sum(r.examples for r in records)
        speed = sum(r.examples for r in records) / sum(r.seconds for r in records)
        sizes = sorted({r.largest_micro_batch for r in records})
        print(f"epoch {epoch + 1}: loss {loss:.3f}, {speed:,.0f} examples/s, micro-batches {sizes}")
    accuracy = float(np.mean(np.argmax(model(x_test, training=False), axis=-1) == y_test))
    print(f"test accuracy {accuracy:.3f}; {report.examples_seen} examples in {len(report.updates)} updates, "
          f"{len(report.oom_events)} OOM(s), {len(report.decisions)} governor change(s), "
          f"micro-step traced {report.traces['micro_step']}x; {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    from edgebatch.errors import EdgebatchError

    try:
        sys.exit(main())
    except EdgebatchError as exc:  # a bad flag or an unrecoverable OOM: one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
