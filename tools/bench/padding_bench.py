"""Padding waste and tokens/s: fit's length-sorted micro-batches, with and without a length window,
against fixed batches padded to their longest sequence (issue 14, item 5).

Not part of the test suite. Real text: the standard library's docstrings (edgebatch.text.docstrings,
the training split, token ids from a 4,096-token vocabulary, truncated to 512 tokens), model
`transformer_tiny` from the zoo (Keras 3), Adam, one epoch per run, on this machine's CPU.

- `fixed`: the plain loop. Consecutive batches of `--micro-batch` examples in the dataset's order,
  each padded to its own longest sequence, one optimizer step each. This is what
  `padded_batch(micro_batch)` gives; the effective batch is the micro-batch.
- `fit`: `edgebatch.fit` with `effective_batch = --effective-batch` and a governor whose micro-batch
  is `--micro-batch`. Each update's examples are sorted by length and every micro-batch is padded
  to its own longest (training/sequences.py). The update is exact, so only the padding changes.
- `fit_window`: the same, with `length_window_examples = --window-updates x --effective-batch`:
  each window of consecutive examples is sorted by length and cut into updates, which run in a
  seeded shuffled order (training/length_window.py). Updates then hold examples of similar length.

Reported per method, as the median over `--repeats` runs taking turns: the share of padded tokens
among all tokens the model ran (from the lengths: the same for every repeat), real tokens per
second of training (one epoch's real tokens over its training seconds: fit's per-update seconds;
for the plain loop, the step times), and the ratio of the two methods' tokens/s within each repeat.
The first update or step of each run is left out of the time (it traces); its tokens too.

    python tools/bench/padding_bench.py --benchmarks-md BENCHMARKS.md
    python tools/bench/padding_bench.py --from-json tools/bench/results/padding.json --benchmarks-md BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS_DIR, environment, load_average, log, publish_section, write_json

SECTION_START = "<!-- padding_bench:start -->"
SECTION_END = "<!-- padding_bench:end -->"
MAX_TOKENS = 512


def corpus_sequences() -> tuple[list[np.ndarray], np.ndarray, str]:
    from edgebatch.text.docstrings import Vocabulary, encode_corpus, load_docstrings, split
    from edgebatch.models.text import VOCABULARY_SIZE

    corpus = load_docstrings()
    train, _ = split(corpus)
    vocabulary = Vocabulary.build(train.texts, max_size=VOCABULARY_SIZE)
    return encode_corpus(train, vocabulary, MAX_TOKENS), train.labels.astype("int64"), corpus.fingerprint


def padded_share(batches: list[list[int]]) -> tuple[int, int]:
    """(real tokens, tokens run) when each batch (a list of lengths) is padded to its longest. Pure."""
    real = sum(sum(batch) for batch in batches)
    run = sum(max(batch) * len(batch) for batch in batches if batch)
    return real, run


def fixed_batches(lengths: list[int], micro: int) -> list[list[int]]:
    return [lengths[i : i + micro] for i in range(0, len(lengths), micro)]


def sorted_pieces(lengths: list[int], effective: int, micro: int) -> list[list[int]]:
    """fit's pieces: each update's lengths sorted (stable), cut into micro-batches. Pure."""
    pieces = []
    for start in range(0, len(lengths), effective):
        update = sorted(lengths[start : start + effective])
        pieces += [update[i : i + micro] for i in range(0, len(update), micro)]
    return pieces


def window_pieces(lengths: list[int], window: int, effective: int, micro: int) -> list[list[int]]:
    """fit_window's pieces: each window's updates as training/length_window.py plans them, each cut
    into micro-batches. Pure."""
    from edgebatch.training.length_window import plan_window, window_seed

    pieces = []
    for index, start in enumerate(range(0, len(lengths), window)):
        window_lengths = lengths[start : start + window]
        for group in plan_window(window_lengths, effective, False, window_seed(0, index)):
            update = sorted(window_lengths[p] for p in group)
            pieces += [update[i : i + micro] for i in range(0, len(update), micro)]
    return pieces


def build_model():
    import keras

    from edgebatch.models.text import transformer_tiny

    keras.utils.set_random_seed(0)
    return transformer_tiny(keras)


def run_fixed(tokens: list[np.ndarray], labels: np.ndarray, micro: int) -> dict:
    import keras
    import tensorflow as tf

    from edgebatch.training.sequences import pad_rows

    model, optimizer = build_model(), keras.optimizers.Adam(1e-3)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int64)])
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
        return value

    seconds, real = 0.0, 0
    for index, start in enumerate(range(0, len(tokens), micro)):
        rows = np.empty(len(tokens[start : start + micro]), dtype=object)
        rows[:] = tokens[start : start + micro]
        x = tf.constant(pad_rows(rows))
        started = time.perf_counter()
        step(x, tf.constant(labels[start : start + micro])).numpy()
        if index:  # the first step traces
            seconds += time.perf_counter() - started
            real += sum(len(row) for row in rows)
    return {"seconds": seconds, "real_tokens": real, "tokens_per_second": real / seconds}


def run_fit(tokens: list[np.ndarray], labels: np.ndarray, effective: int, micro: int, window: int | None = None) -> dict:
    import keras
    import tensorflow as tf

    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit

    model = build_model()
    data = tf.data.Dataset.from_generator(lambda: zip(tokens, labels), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)))
    governor = Governor(GovernorConfig(ceiling_batch=micro, effective_batch=effective, slow_step_factor=1e9))
    report = fit(model, data, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 optimizer=keras.optimizers.Adam(1e-3), effective_batch=effective, governor=governor,
                 length_window_examples=window)
    real = sum(record.tokens for record in report.updates[1:])  # the first update traces
    seconds = sum(record.seconds for record in report.updates[1:])
    return {"seconds": seconds, "real_tokens": real, "tokens_per_second": real / seconds}


def render(data: dict) -> str:
    s = data["summary"]
    gains = [run["fit_window"]["tokens_per_second"] / run["fit"]["tokens_per_second"] for run in data["runs"]]
    window_gain = (statistics.median(gains), min(gains), max(gains))
    lines = [
        SECTION_START, "",
        "## 11. Variable-length batches: padding and tokens/s (issue 14)", "",
        f"`python tools/bench/padding_bench.py` (commit {data['environment'].get('git_commit')}; load average before "
        f"{data['load_average_start']}). `transformer_tiny` on the standard library's docstrings ({data['corpus']}, "
        f"{data['examples']} training texts, at most {MAX_TOKENS} tokens), one epoch per run, {data['repeats']} "
        f"repeats taking turns. Micro-batch {data['micro_batch']}; fit's updates take {data['effective_batch']} "
        "examples. How it is made: the docstring of tools/bench/padding_bench.py.", "",
        "| method | padded share of tokens run | real tokens/s (median) | x fixed (median, min..max) |",
        "|---|---|---|---|",
        *[f"| {label} | {s[key + '_padding_share']:.1%} | {s[key + '_tokens_per_second']:.0f} | "
          f"{s[key + '_speedup'][0]:.2f} ({s[key + '_speedup'][1]:.2f}..{s[key + '_speedup'][2]:.2f}) |"
          for key, label in method_labels(data)], "",
        f"Not only the padding differs between fit and the plain loop: fit applies the optimizer once per "
        f"update of {data['effective_batch']}, the plain loop once per batch of {data['micro_batch']}, and fit "
        "has its own per-update work. Between the two fit rows only the padding differs: the window changes "
        "which examples share an update, not how an update is computed: with the window, fit trained "
        f"{window_gain[0]:.2f}x the real tokens/s it did without one (per-repeat ratios "
        f"{window_gain[1]:.2f}..{window_gain[2]:.2f}).", "",
        SECTION_END,
    ]
    return "\n".join(lines)


METHODS = ("fixed", "fit", "fit_window")


def method_labels(data: dict) -> list[tuple[str, str]]:
    window = data["window_updates"] * data["effective_batch"]
    return [("fixed", "fixed batches padded to their longest"),
            ("fit", "fit, length-sorted micro-batches"),
            ("fit_window", f"fit, length window of {window} examples ({data['window_updates']} updates)")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--effective-batch", type=int, default=64)
    parser.add_argument("--window-updates", type=int, default=8, help="updates per length window (fit_window)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--benchmarks-md", type=Path)
    parser.add_argument("--from-json", type=Path)
    args = parser.parse_args()
    if args.from_json:
        data = json.loads(args.from_json.read_text())
    else:
        tokens, labels, fingerprint = corpus_sequences()
        lengths = [len(t) for t in tokens]
        window = args.window_updates * args.effective_batch
        data = {"environment": environment(), "load_average_start": load_average(), "corpus": fingerprint,
                "examples": len(tokens), "micro_batch": args.micro_batch, "effective_batch": args.effective_batch,
                "window_updates": args.window_updates, "repeats": args.repeats, "runs": []}
        for repeat in range(args.repeats):
            order = METHODS[repeat % len(METHODS):] + METHODS[: repeat % len(METHODS)]
            result = {}
            for method in order:
                if method == "fixed":
                    result[method] = run_fixed(tokens, labels, args.micro_batch)
                else:
                    result[method] = run_fit(tokens, labels, args.effective_batch, args.micro_batch,
                                             window if method == "fit_window" else None)
                log(f"repeat {repeat} {method}: {result[method]['tokens_per_second']:.0f} real tokens/s")
            data["runs"].append(result)
        pieces = {"fixed": fixed_batches(lengths, args.micro_batch),
                  "fit": sorted_pieces(lengths, args.effective_batch, args.micro_batch),
                  "fit_window": window_pieces(lengths, window, args.effective_batch, args.micro_batch)}
        data["summary"] = {}
        for method in METHODS:
            real, run = padded_share(pieces[method])
            ratios = [r[method]["tokens_per_second"] / r["fixed"]["tokens_per_second"] for r in data["runs"]]
            data["summary"].update({
                method + "_padding_share": 1 - real / run,
                method + "_tokens_per_second": statistics.median(r[method]["tokens_per_second"] for r in data["runs"]),
                method + "_speedup": [statistics.median(ratios), min(ratios), max(ratios)],
            })
        data["load_average_end"] = load_average()
        write_json(RESULTS_DIR / "padding.json", data)
    publish_section(render(data), args.benchmarks_md, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
