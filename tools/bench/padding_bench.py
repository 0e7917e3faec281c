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
- `fit_ceilings`: `fit_window` with the profile's ceilings by length but no piece cost: each piece
  as large as its ceiling allows, whatever its padding (the cut before the piece cost).
- `fit_cost`: `fit_window` with `length_ceilings=profile`, a probe per length of transformer_tiny
  (`--profile`, or probed here under `--budget-mib` into a temporary directory): each piece at most
  the ceiling of its own length bucket, and each update cut where the step times the probe measured
  predict the least time (training/piece_cost.py), so a piece is padded only where that costs less
  than another step. Its padded share is counted from fit's records (each piece's size and longest
  example), not predicted.

Reported per method, as the median over `--repeats` runs taking turns: the share of padded tokens
among all tokens the model ran (from the lengths: the same for every repeat), real tokens per
second of training (one epoch's real tokens over its training seconds: fit's per-update seconds;
for the plain loop, the step times), and the ratio of the two methods' tokens/s within each repeat.
The first update or step of each run is left out of the time (it traces); its tokens too.

    python tools/bench/padding_bench.py --benchmarks-md BENCHMARKS.md
    python tools/bench/padding_bench.py --profile tools/bench/results/padding_profile_transformer_tiny.json --benchmarks-md BENCHMARKS.md
    python tools/bench/padding_bench.py --from-json tools/bench/results/padding.json --benchmarks-md BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_output_options, environment, load_average, log, measured_or_loaded, publish_section

SECTION_START = "<!-- padding_bench:start -->"
SECTION_END = "<!-- padding_bench:end -->"
MAX_TOKENS = 512
PROBE_LENGTHS = (64, 128, 256, 512)


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


def run_fit(tokens: list[np.ndarray], labels: np.ndarray, effective: int, micro: int, window: int | None = None,
            ceilings=None) -> dict:
    """One epoch of fit; with `ceilings` (a LengthCeilings) its pieces follow them and `micro` is unused."""
    import keras
    import tensorflow as tf

    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import Sequences, fit

    model = build_model()
    data = tf.data.Dataset.from_generator(lambda: zip(tokens, labels), output_signature=(
        tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)))
    ceiling = micro if ceilings is None else ceilings.reference_ceiling
    governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=effective, slow_step_factor=1e9))
    report = fit(model, data, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 optimizer=keras.optimizers.Adam(1e-3), effective_batch=effective, governor=governor,
                 sequences=Sequences(length_window_examples=window, length_ceilings=ceilings))
    real = sum(record.tokens for record in report.updates[1:])  # the first update traces
    seconds = sum(record.seconds for record in report.updates[1:])
    result = {"seconds": seconds, "real_tokens": real, "tokens_per_second": real / seconds,
              "pieces_per_update": statistics.mean(len(record.micro_batches) for record in report.updates)}
    if ceilings is not None:  # each piece's size and longest example: the tokens it ran, padding included
        result["tokens_run"] = sum(size * length for record in report.updates
                                   for size, length in zip(record.micro_batches, record.piece_lengths))
        result["all_real_tokens"] = sum(record.tokens for record in report.updates)
        if report.piece_cost is not None:  # refitted from the pieces' times (training/piece_cost.py)
            result["piece_cost"] = dataclasses.asdict(report.piece_cost)
    return result


def per_length_profile(path: Path | None, budget_mib: float):
    """The profile at `path`, or a probe per length of transformer_tiny under `budget_mib` (not kept)."""
    import tempfile

    from edgebatch.probing import probe
    from edgebatch.profiles import load_profile

    if path is not None:
        return load_profile(path), None
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        profile = probe("transformer_tiny", device="CPU:0", memory_budget=int(budget_mib * 2**20),
                        seq_lens=PROBE_LENGTHS, profiles_dir=scratch, save=False, progress=log)
    return profile, round(time.perf_counter() - started, 1)


def ratio_range(data: dict, method: str, baseline: str) -> list[float]:
    """Median, min and max over the repeats of `method`'s tokens/s over `baseline`'s, within each repeat."""
    ratios = [run[method]["tokens_per_second"] / run[baseline]["tokens_per_second"] for run in data["runs"]]
    return [statistics.median(ratios), min(ratios), max(ratios)]


def render(data: dict) -> str:
    s = data["summary"]
    window_gain = ratio_range(data, "fit_window", "fit")
    has_cost = "fit_cost" in data["runs"][0]
    lines = [
        SECTION_START, "",
        "## 11. Variable-length batches: padding and tokens/s (issues 14 and 42)", "",
        f"`python tools/bench/padding_bench.py` (commit {data['environment'].get('git_commit')}; load average before "
        f"{data['load_average_start']}). `transformer_tiny` on the standard library's docstrings ({data['corpus']}, "
        f"{data['examples']} training texts, at most {MAX_TOKENS} tokens), one epoch per run, {data['repeats']} "
        f"repeats taking turns. Micro-batch {data['micro_batch']}; fit's updates take {data['effective_batch']} "
        "examples. How it is made: the docstring of tools/bench/padding_bench.py.", "",
        "| method | padded share of tokens run (median, min..max) | pieces per update | real tokens/s (median) | x fixed (median, min..max) "
        "| x length window (median, min..max) |",
        "|---|---|---|---|---|---|",
        *[f"| {label} | {_share_text(s, key)} | {s[key + '_pieces_per_update']} | "
          f"{s[key + '_tokens_per_second']:.0f} | {_range_text(s[key + '_speedup'])} | "
          f"{_range_text(ratio_range(data, key, 'fit_window'))} |"
          for key, label in method_labels(data)], "",
        f"Not only the padding differs between fit and the plain loop: fit applies the optimizer once per "
        f"update of {data['effective_batch']}, the plain loop once per batch of {data['micro_batch']}, and fit "
        "has its own per-update work. Between the fit rows the updates are the same exact means: the window changes "
        "which examples share an update, the ceilings and the piece cost only how an update is cut. With the "
        f"window, fit trained {window_gain[0]:.2f}x the real tokens/s it did without one (per-repeat ratios "
        f"{window_gain[1]:.2f}..{window_gain[2]:.2f}).", "",
    ]
    if has_cost:
        lines += [_cost_paragraph(data), ""]
    return "\n".join(lines + [SECTION_END])


def _share_text(summary: dict, key: str) -> str:
    """The padded share; with its range over the repeats where they differ."""
    low, high = summary.get(key + "_padding_range", [None, None])
    text = f"{summary[key + '_padding_share']:.1%}"
    return text if low is None or low == high else f"{text} ({low:.1%}..{high:.1%})"


def _range_text(values: list[float]) -> str:
    return f"{values[0]:.2f} ({values[1]:.2f}..{values[2]:.2f})"


def _cost_paragraph(data: dict) -> str:
    """What the piece-cost row shows against issue 42's targets (padding <= 10%, >= 1.2x the window)."""
    s, probe = data["summary"], data["probe"]
    gain = ratio_range(data, "fit_cost", "fit_window")
    ceilings = ", ".join(f"{length}: {ceiling}" for length, ceiling in probe["ceilings"])
    cost = probe["piece_cost"]
    worst = s.get("fit_cost_padding_range", [None, s["fit_cost_padding_share"]])[1]
    verdict = ("both met" if s["fit_cost_padding_share"] <= 0.10 and gain[0] >= 1.2 else "not both met")
    where = (f"probed here in {probe['seconds']:.0f} s" if probe.get("seconds") is not None
             else f"from {probe['path']}")
    return (f"The piece-cost row's profile: a probe per length under {probe['budget_mib']:.0f} MiB ({where}); "
            f"safe batch by length (tokens: examples) {ceilings}; step time fitted from its trials "
            f"{cost['overhead_seconds'] * 1e3:.2f} ms + {cost['seconds_per_token'] * 1e6:.2f} us per token + "
            f"{cost['seconds_per_token_squared'] * 1e9:.2f} ns per token x length{_refit_text(data)}. "
            "Issue 42 asks for a padded share "
            f"of at most 10% and at least 1.2x the length window's real tokens/s: "
            f"{s['fit_cost_padding_share']:.1%} (at most {worst:.1%} in a repeat) and {gain[0]:.2f}x (medians), "
            f"{verdict}." + _greedy_sentence(data))


def _refit_text(data: dict) -> str:
    """What fit refitted the piece cost to from its own pieces, in the first repeat."""
    cost = data["runs"][0]["fit_cost"].get("piece_cost")
    if cost is None:
        return ""
    return (f"; fit refitted it from its own pieces' times (every 32 pieces; repeat 0 ended at "
            f"{cost['overhead_seconds'] * 1e3:.2f} ms + {cost['seconds_per_token'] * 1e6:.2f} us per token + "
            f"{cost['seconds_per_token_squared'] * 1e9:.2f} ns per token x length)")


def _greedy_sentence(data: dict) -> str:
    """The ceilings without the piece cost, where the run has that row."""
    if "fit_ceilings" not in data["runs"][0]:
        return ""
    s = data["summary"]
    return (f" The same ceilings cut greedily padded {s['fit_ceilings_padding_share']:.1%} of the tokens run in "
            f"{s['fit_ceilings_pieces_per_update']} pieces per update; the piece cost trained "
            f"{ratio_range(data, 'fit_cost', 'fit_ceilings')[0]:.2f}x their real tokens/s (median of the repeats).")


METHODS = ("fixed", "fit", "fit_window", "fit_ceilings", "fit_cost")


def method_labels(data: dict) -> list[tuple[str, str]]:
    window = data["window_updates"] * data["effective_batch"]
    labels = [("fixed", "fixed batches padded to their longest"),
              ("fit", "fit, length-sorted micro-batches"),
              ("fit_window", f"fit, length window of {window} examples ({data['window_updates']} updates)"),
              ("fit_ceilings", "fit, the same window, pieces as large as their length's ceiling"),
              ("fit_cost", "fit, the same window, pieces by length ceilings and piece cost")]
    return [(key, label) for key, label in labels if key in data["runs"][0]]


def run_method(method: str, tokens: list[np.ndarray], labels: np.ndarray, args: argparse.Namespace,
               ceilings) -> dict:
    window = args.window_updates * args.effective_batch
    if method == "fixed":
        return run_fixed(tokens, labels, args.micro_batch)
    by_method = {"fit_ceilings": dataclasses.replace(ceilings, piece_cost=None), "fit_cost": ceilings}
    return run_fit(tokens, labels, args.effective_batch, args.micro_batch,
                   None if method == "fit" else window, by_method.get(method))


def summarise(data: dict, lengths: list[int], args: argparse.Namespace) -> dict:
    """Padded share, pieces per update and tokens/s by method (padding predicted from the lengths,
    except that of the methods with ceilings, counted from their runs)."""
    window = args.window_updates * args.effective_batch
    pieces = {"fixed": fixed_batches(lengths, args.micro_batch),
              "fit": sorted_pieces(lengths, args.effective_batch, args.micro_batch),
              "fit_window": window_pieces(lengths, window, args.effective_batch, args.micro_batch)}
    summary = {}
    for method in data["runs"][0]:
        if method in pieces:
            real, run = padded_share(pieces[method])
            updates = -(-len(lengths) // (args.micro_batch if method == "fixed" else args.effective_batch))
            per_update = round(len(pieces[method]) / updates, 1)
            shares = [1 - real / run]
        else:  # counted from each run: the cut follows timings, so repeats can differ
            shares = [1 - r[method]["all_real_tokens"] / r[method]["tokens_run"] for r in data["runs"]]
            per_update = round(statistics.median(r[method]["pieces_per_update"] for r in data["runs"]), 1)
        summary.update({
            method + "_padding_share": statistics.median(shares),
            method + "_padding_range": [min(shares), max(shares)],
            method + "_pieces_per_update": per_update,
            method + "_tokens_per_second": statistics.median(r[method]["tokens_per_second"] for r in data["runs"]),
            method + "_speedup": ratio_range(data, method, "fixed"),
        })
    return summary


def measure(args: argparse.Namespace) -> dict:
    from edgebatch.training import LengthCeilings

    tokens, labels, fingerprint = corpus_sequences()
    profile, probe_seconds = per_length_profile(args.profile, args.budget_mib)
    ceilings = LengthCeilings.from_profile(profile)
    if ceilings.piece_cost is None:
        raise SystemExit("the profile's trials do not determine a piece cost: probe per length again")
    data = {"environment": environment(), "load_average_start": load_average(), "corpus": fingerprint,
            "examples": len(tokens), "micro_batch": args.micro_batch, "effective_batch": args.effective_batch,
            "window_updates": args.window_updates, "repeats": args.repeats, "runs": [],
            "probe": {"path": str(args.profile) if args.profile else None, "seconds": probe_seconds,
                      "budget_mib": profile.budget_bytes / 2**20, "ceilings": list(ceilings.table),
                      "piece_cost": dataclasses.asdict(ceilings.piece_cost)}}
    for repeat in range(args.repeats):
        order = METHODS[repeat % len(METHODS):] + METHODS[: repeat % len(METHODS)]
        result = {}
        for method in order:
            result[method] = run_method(method, tokens, labels, args, ceilings)
            log(f"repeat {repeat} {method}: {result[method]['tokens_per_second']:.0f} real tokens/s")
        data["runs"].append({method: result[method] for method in METHODS})
    data["summary"] = summarise(data, [len(t) for t in tokens], args)
    data["load_average_end"] = load_average()
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--effective-batch", type=int, default=64)
    parser.add_argument("--window-updates", type=int, default=8, help="updates per length window (fit_window)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=Path, help="a probe per length of transformer_tiny (else probed here)")
    parser.add_argument("--budget-mib", type=float, default=1536.0, help="the probe's budget without --profile")
    add_output_options(parser)
    args = parser.parse_args()
    data = measured_or_loaded(args.from_json, lambda: measure(args), "padding.json")
    publish_section(render(data), args.benchmarks_md, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
