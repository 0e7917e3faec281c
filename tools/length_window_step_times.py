"""How long variable-length updates take, and what the governor's slow-step rule would make of it.

`fit` hands the governor no step time for variable-length examples (training/governed_loop.py): an update's
work follows its lengths. This shows why. It trains `transformer_tiny` on the standard library's
docstrings (the corpus of tools/bench/length_ceilings_bench.py) with `length_window_examples`, so
each update holds examples of similar length, in one piece (the governor's ceiling is the effective
batch, and nothing reads memory pressure), and prints every update's step seconds and seconds per
real token. Then it replays those step times through a fresh default governor (pure policy, no
TensorFlow), as fit fed them before, and prints the decisions they would have caused.

    python tools/length_window_step_times.py                       # about a minute on 2 cores
    python tools/length_window_step_times.py --window 512 --epochs 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))


def train(effective: int, window: int, epochs: int) -> list:
    import keras
    import tensorflow as tf
    from length_ceilings_bench import corpus

    import edgebatch
    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.text.models import transformer_tiny
    from edgebatch.training import fit

    edgebatch.set_inter_op_threads(1)
    tokens, labels, _ = corpus()
    keras.utils.set_random_seed(0)
    data = tf.data.Dataset.from_generator(lambda: zip(tokens, labels), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)))
    report = fit(transformer_tiny(keras), data, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 optimizer=keras.optimizers.Adam(1e-3), effective_batch=effective, epochs=epochs,
                 governor=Governor(GovernorConfig(ceiling_batch=effective, effective_batch=effective)),
                 length_window_examples=window)
    return report.updates


def replay(updates: list, effective: int) -> list[str]:
    """The decisions a default governor takes when fed these updates' step times (the first, which
    traces the step, included, as fit fed it)."""
    from edgebatch.governor import Governor, GovernorConfig, Observation

    governor = Governor(GovernorConfig(ceiling_batch=effective, effective_batch=effective))
    lines = []
    for record in updates:
        micro_batch = governor.decision.micro_batch
        decision = governor.observe(Observation(pressure=None, step_seconds=record.step_seconds, micro_batch=micro_batch))
        if decision.changed:
            lines.append(f"update {record.update}: {decision.reason}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effective-batch", type=int, default=256, help="examples per update (default 256)")
    parser.add_argument("--window", type=int, default=1024, help="length_window_examples (default 1024)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs over the docstrings (default 3)")
    args = parser.parse_args()
    updates = train(args.effective_batch, args.window, args.epochs)
    for record in updates:
        print(f"update {record.update:3d}: {record.examples:4d} examples, {record.tokens:6d} real tokens, "
              f"{len(record.micro_batches)} piece(s), {record.step_seconds:6.3f} s, "
              f"{1e6 * record.step_seconds / max(record.tokens, 1):6.1f} us per real token")
    later = [record.step_seconds for record in updates[1:]]
    print(f"step seconds after the first update: {min(later):.3f}-{max(later):.3f}")
    decisions = replay(updates, args.effective_batch)
    print("a default governor fed these step times: " + ("; ".join(decisions) if decisions else "no change"))


if __name__ == "__main__":
    main()
