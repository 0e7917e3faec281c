"""Padding waste and tokens/s: fit's length-sorted micro-batches against fixed batches padded to their
longest sequence (issue 14, item 5, first measurement).

Not part of the test suite. Real text: the standard library's docstrings (edgebatch.text.docstrings,
the training split, token ids from a 4,096-token vocabulary, truncated to 512 tokens), model
`transformer_tiny` from the zoo (Keras 3), Adam, one epoch per run, on this machine's CPU.

- `fixed`: the plain loop. Consecutive batches of `--micro-batch` examples in the dataset's order,
  each padded to its own longest sequence, one optimizer step each. This is what
  `padded_batch(micro_batch)` gives; the effective batch is the micro-batch.
- `fit`: `edgebatch.fit` with `effective_batch = --effective-batch` and a governor whose micro-batch
  is `--micro-batch`. Each update's examples are sorted by length and every micro-batch is padded
  to its own longest (training/sequences.py). The update is exact, so only the padding changes.

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
    from edgebatch.text.models import VOCABULARY_SIZE

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


def build_model():
    import keras

    from edgebatch.text.models import transformer_tiny

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


def run_fit(tokens: list[np.ndarray], labels: np.ndarray, effective: int, micro: int) -> dict:
    import keras
    import tensorflow as tf

    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit

    model = build_model()
    data = tf.data.Dataset.from_generator(lambda: zip(tokens, labels), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)))
    governor = Governor(GovernorConfig(ceiling_batch=micro, effective_batch=effective, slow_step_factor=1e9))
    report = fit(model, data, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 optimizer=keras.optimizers.Adam(1e-3), effective_batch=effective, governor=governor)
    first = report.updates[0].examples
    real = sum(len(t) for t in tokens[first:])
    seconds = sum(record.seconds for record in report.updates[1:])
    return {"seconds": seconds, "real_tokens": real, "tokens_per_second": real / seconds}


def render(data: dict) -> str:
    s = data["summary"]
    lines = [
        SECTION_START, "",
        "## 9. Variable-length batches: padding and tokens/s (issue 14)", "",
        f"`python tools/bench/padding_bench.py` (commit {data['environment'].get('git_commit')}; load average before "
        f"{data['load_average_start']}). `transformer_tiny` on the standard library's docstrings ({data['corpus']}, "
        f"{data['examples']} training texts, at most {MAX_TOKENS} tokens), one epoch per run, {data['repeats']} "
        f"repeats taking turns. Micro-batch {data['micro_batch']}; fit's updates take {data['effective_batch']} "
        "examples. How it is made: the docstring of tools/bench/padding_bench.py.", "",
        "| method | padded share of tokens run | real tokens/s (median) |",
        "|---|---|---|",
        f"| fixed batches padded to their longest | {s['fixed_padding_share']:.1%} | {s['fixed_tokens_per_second']:.0f} |",
        f"| fit, length-sorted micro-batches | {s['fit_padding_share']:.1%} | {s['fit_tokens_per_second']:.0f} |", "",
        f"fit trained {s['speedup_median']:.2f}x as many real tokens per second (per-repeat ratios "
        f"{s['speedup_min']:.2f}..{s['speedup_max']:.2f}). Not only the padding differs: fit applies the "
        f"optimizer once per update of {data['effective_batch']}, the plain loop once per batch of "
        f"{data['micro_batch']}, and fit has its own per-update work. Sorting within an update of "
        f"{data['effective_batch']} leaves much padding; bucketing over a longer window (tf.data's "
        "bucket_by_sequence_length) would leave less, and is not in fit yet.", "",
        SECTION_END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--effective-batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--benchmarks-md", type=Path)
    parser.add_argument("--from-json", type=Path)
    args = parser.parse_args()
    if args.from_json:
        data = json.loads(args.from_json.read_text())
    else:
        tokens, labels, fingerprint = corpus_sequences()
        lengths = [len(t) for t in tokens]
        data = {"environment": environment(), "load_average_start": load_average(), "corpus": fingerprint,
                "examples": len(tokens), "micro_batch": args.micro_batch, "effective_batch": args.effective_batch,
                "repeats": args.repeats, "runs": []}
        for repeat in range(args.repeats):
            order = ("fixed", "fit") if repeat % 2 == 0 else ("fit", "fixed")
            result = {}
            for method in order:
                result[method] = (run_fixed(tokens, labels, args.micro_batch) if method == "fixed"
                                  else run_fit(tokens, labels, args.effective_batch, args.micro_batch))
                log(f"repeat {repeat} {method}: {result[method]['tokens_per_second']:.0f} real tokens/s")
            data["runs"].append(result)
        fixed_real, fixed_run = padded_share(fixed_batches(lengths, args.micro_batch))
        fit_real, fit_run = padded_share(sorted_pieces(lengths, args.effective_batch, args.micro_batch))
        ratios = [run["fit"]["tokens_per_second"] / run["fixed"]["tokens_per_second"] for run in data["runs"]]
        data["summary"] = {
            "fixed_padding_share": 1 - fixed_real / fixed_run, "fit_padding_share": 1 - fit_real / fit_run,
            "fixed_tokens_per_second": statistics.median(r["fixed"]["tokens_per_second"] for r in data["runs"]),
            "fit_tokens_per_second": statistics.median(r["fit"]["tokens_per_second"] for r in data["runs"]),
            "speedup_median": statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios),
        }
        data["load_average_end"] = load_average()
        write_json(RESULTS_DIR / "padding.json", data)
    publish_section(render(data), args.benchmarks_md, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
