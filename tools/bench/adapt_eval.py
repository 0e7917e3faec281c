"""Issue 13's evaluation: does the statistical batch policy reach a target accuracy in fewer updates?

Not part of the test suite. Two real tasks that need no download:

- `digits`: scikit-learn's 8x8 handwritten digits (1,797 images, 10 classes), pixels / 16, a fixed
  80/20 split; an MLP 64 -> 64 (relu) -> 10.
- `docstrings`: edgebatch.text.docstrings, the standard library's docstrings labelled by package
  (8 classes), split by the corpus's own hash; a bag of words (binary, the 4,096 most frequent
  training tokens) -> 64 (relu) -> 8. (The sequence models of the variable-length work need
  padded batches, which fit does not take yet: this is the same text as a fixed-width input.)

Methods, all trained by `edgebatch.fit` with Adam (base rate 1e-3, tuned for batch 16) for the same
number of epochs, i.e. the same examples:
- `static16`: effective batch 16;
- `static128`: effective batch 128, rate x sqrt(8) (the sqrt rule for Adam);
- `schedule`: Smith et al. 2018's increase-batch schedule in place of a decay: 16, 32, 64, 128 for
  a quarter of the epochs each, constant rate;
- `adapt`: fit(adapt=AdaptConfig(lr_rule="sqrt", max_effective_batch_samples=512)): the defaults
  (the seed's timing: a check every 50 updates, 200 updates of cooldown; growth below half the
  noise scale, capped at it; plateau, schedule and drift triggers; no direction rule), start 16;
- `adapt-short`: the same with a check every 10 updates and 20 of cooldown (these runs are short:
  a few hundred to a few thousand updates);
- `seed-rules`: AdaptConfig.seed_rules(max_effective_batch_samples=512): the defaults plus the
  seed's direction rule (mean cosine > 0.8 grows, < 0.3 shrinks) and its inverse LR rule.
The adaptive runs get a governor whose ceiling (512) is no limit for these tiny models, and split
every update in at least two pieces (the noise scale's pair).

Every update the validation accuracy is computed (a compiled forward pass over the whole
validation set, outside the timed update). Reported per method over the seeds (each seed: model
initialisation and the data order): optimizer updates and training seconds until the validation
accuracy first reaches the target, and the final accuracy. The target is fixed from the static
runs only: 98% of the better static method's median final accuracy, rounded down to 0.5 points.
Training seconds are the sum of fit's per-update seconds (input wait + step), not the evaluation.

Writes tools/bench/results/adapt_eval.json and, with --benchmarks-md, its own section of
BENCHMARKS.md (between the markers below).

    python tools/bench/adapt_eval.py --benchmarks-md BENCHMARKS.md
    python tools/bench/adapt_eval.py --from-json tools/bench/results/adapt_eval.json --benchmarks-md BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS_DIR, environment, load_average, log, publish_section, write_json

SECTION_START = "<!-- adapt_eval:start -->"
SECTION_END = "<!-- adapt_eval:end -->"
BASE_RATE = 1e-3
METHODS = ("static16", "static128", "schedule", "adapt", "adapt-short", "seed-rules")
TASKS = ("digits", "docstrings")
VOCABULARY_TOKENS = 4096
HIDDEN_UNITS = 64
ADAPT_MAX_BATCH = 512
TARGET_FRACTION = 0.98
# The adaptive methods' settings (AdaptConfig keyword arguments; "seed" marks AdaptConfig.seed_rules).
ADAPT_METHODS = {
    "adapt": {"lr_rule": "sqrt"},
    "adapt-short": {"lr_rule": "sqrt", "check_every_updates": 10, "cooldown_updates": 20},
    "seed-rules": {"seed": True},
}


def load_task(name: str) -> dict:
    """x/y train and validation arrays (float32 features, int labels) and a description."""
    if name == "digits":
        from sklearn.datasets import load_digits

        data = load_digits()
        x = (data.data / 16.0).astype("float32")
        y = data.target.astype("int64")
        order = np.random.default_rng(1234).permutation(len(x))
        cut = int(0.8 * len(x))
        train, val = order[:cut], order[cut:]
        return {"x": x[train], "y": y[train], "x_val": x[val], "y_val": y[val], "classes": 10,
                "about": f"sklearn digits, {len(train)} train / {len(val)} validation"}
    if name == "docstrings":
        from edgebatch.text.docstrings import Vocabulary, encode_corpus, load_docstrings, split

        corpus = load_docstrings()
        train, val = split(corpus)
        vocabulary = Vocabulary.build(train.texts, max_size=VOCABULARY_TOKENS)

        def bag(part):
            rows = np.zeros((len(part), vocabulary.size), dtype="float32")
            for i, ids in enumerate(encode_corpus(part, vocabulary)):
                rows[i, ids] = 1.0
            return rows

        return {"x": bag(train), "y": train.labels.astype("int64"), "x_val": bag(val),
                "y_val": val.labels.astype("int64"), "classes": len(corpus.label_names),
                "about": f"stdlib docstrings {corpus.fingerprint}, {len(train)} train / {len(val)} validation, "
                         f"bag of {vocabulary.size} token ids"}
    raise ValueError(f"unknown task {name!r}")


def run_one(task: dict, method: str, seed: int, epochs: int) -> dict:
    """Train one (method, seed); per-update validation accuracy, updates and seconds."""
    import keras
    import tensorflow as tf

    from edgebatch.adapt import AdaptConfig
    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit

    keras.utils.set_random_seed(seed)
    features = task["x"].shape[1]
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(HIDDEN_UNITS, activation="relu"),
                              keras.layers.Dense(task["classes"])])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x_val = tf.constant(task["x_val"])
    predict = tf.function(lambda x: tf.argmax(model(x, training=False), axis=-1))
    curve: list[tuple[int, float, float]] = []  # (update, training seconds so far, validation accuracy)
    clock = {"seconds": 0.0, "updates": 0}
    effective: list[int] = []

    def on_update(record) -> None:
        clock["seconds"] += record.seconds
        clock["updates"] += 1
        effective.append(record.examples)
        accuracy = float(np.mean(predict(x_val).numpy() == task["y_val"]))
        curve.append((clock["updates"], clock["seconds"], accuracy))

    dataset = tf.data.Dataset.from_tensor_slices((task["x"], task["y"])).shuffle(
        len(task["x"]), seed=seed, reshuffle_each_iteration=True)
    changes: list[dict] = []
    started = time.perf_counter()
    if method in ("static16", "static128"):
        batch = 16 if method == "static16" else 128
        optimizer = keras.optimizers.Adam(BASE_RATE * math.sqrt(batch / 16))
        fit(model, dataset, loss=loss, optimizer=optimizer, effective_batch=batch, epochs=epochs, on_update=on_update)
    elif method == "schedule":
        optimizer = keras.optimizers.Adam(BASE_RATE)
        phases = (16, 32, 64, 128)
        per_phase = [epochs // len(phases) + (1 if i < epochs % len(phases) else 0) for i in range(len(phases))]
        for batch, phase_epochs in zip(phases, per_phase):
            if phase_epochs:
                fit(model, dataset, loss=loss, optimizer=optimizer, effective_batch=batch, epochs=phase_epochs,
                    on_update=on_update)
    else:
        settings = dict(ADAPT_METHODS[method], max_effective_batch_samples=ADAPT_MAX_BATCH)
        config = AdaptConfig.seed_rules(**settings) if settings.pop("seed", False) else AdaptConfig(**settings)
        governor = Governor(GovernorConfig(ceiling_batch=ADAPT_MAX_BATCH, effective_batch=ADAPT_MAX_BATCH))
        report = fit(model, dataset, loss=loss, optimizer=keras.optimizers.Adam(BASE_RATE), effective_batch=16,
                     epochs=epochs, adapt=config, governor=governor, on_update=on_update)
        changes = report.adapt_changes
    return {"method": method, "seed": seed, "curve": curve, "wall_seconds": time.perf_counter() - started,
            "changes": changes, "final_effective_batch": effective[-2] if len(effective) > 1 else effective[-1],
            "updates": clock["updates"]}


def thinned(run: dict) -> dict:
    """A run as saved: the summary is made from every update; the file keeps every 10th point of
    the curve (the seed-rules runs have over 10,000 updates each)."""
    saved = {key: value for key, value in run.items() if key != "curve"}
    last = run["curve"][-1][0]
    saved["final_accuracy"] = run["curve"][-1][2]
    saved["curve_every_10_updates"] = [[u, round(s, 4), round(a, 4)] for u, s, a in run["curve"]
                                       if u % 10 == 0 or u == last]
    return saved


def first_reach(curve: list, target: float) -> tuple[int | None, float | None]:
    """(updates, training seconds) when the validation accuracy first reached `target`."""
    for updates, seconds, accuracy in curve:
        if accuracy >= target:
            return updates, seconds
    return None, None


def reason_kind(reason: str) -> str:
    """A change's trigger, from its reason text (edgebatch/adapt/policy.py `_trigger`)."""
    if reason.startswith("drift"):
        return "drift (shrink)"
    if reason.startswith("mean cosine"):
        return "cosine < threshold (shrink)" if " < " in reason.split(":")[0] else "cosine > threshold (grow)"
    if reason.startswith("loss plateau"):
        return "plateau (grow)"
    if reason.startswith("schedule"):
        return "schedule decay (grow)"
    if "noise scale" in reason:
        return "below the noise scale (grow)"
    return reason.split(":")[0]


def summarize(task_runs: list[dict]) -> dict:
    """Target from the static runs, then per method: updates/seconds to it and final accuracy."""
    finals = {m: [r["curve"][-1][2] for r in task_runs if r["method"] == m] for m in METHODS}
    best_static = max(statistics.median(finals[m]) for m in ("static16", "static128") if finals[m])
    target = math.floor(TARGET_FRACTION * best_static * 200) / 200
    rows = {}
    for method in METHODS:
        runs = [r for r in task_runs if r["method"] == method]
        if not runs:
            continue
        reached = [first_reach(r["curve"], target) for r in runs]
        rows[method] = {
            "updates_to_target": [u for u, _ in reached],
            "seconds_to_target": [s for _, s in reached],
            "final_accuracy": [r["curve"][-1][2] for r in runs],
            "updates": [r["updates"] for r in runs],
            "changes": [len(r["changes"]) for r in runs],
            "final_effective_batch": [r["final_effective_batch"] for r in runs],
            "reasons": dict(Counter(reason_kind(c["reason"]) for r in runs for c in r["changes"])),
        }
    return {"target_accuracy": target, "best_static_final": best_static, "methods": rows}


def _mean_sd(values: list, digits: int = 0, scale: float = 1.0) -> str:
    present = [v * scale for v in values if v is not None]
    if not present:
        return "not reached"
    missing = len(values) - len(present)
    mean = statistics.fmean(present)
    spread = statistics.stdev(present) if len(present) > 1 else 0.0
    text = f"{mean:.{digits}f} ± {spread:.{digits}f}"
    return text + (f" ({missing} of {len(values)} never)" if missing else "")


def render(data: dict) -> str:
    lines = [SECTION_START, "", "## 7. Adaptive batch (issue 13): updates to a target accuracy on real data", "",
             "`python tools/bench/adapt_eval.py --benchmarks-md BENCHMARKS.md` "
             f"(commit {data['environment'].get('git_commit')}, {data['seeds']} seeds, {data['epochs']} epochs per run, "
             f"load average at the start {data['load_average_start']}). What each method and number is: the "
             "docstring of tools/bench/adapt_eval.py. Mean ± standard deviation over the seeds; seconds are "
             "training seconds (update steps, not the per-update evaluation), on a shared 2-core machine.", ""]
    for task_name, result in data["tasks"].items():
        summary = result["summary"]
        lines += [f"### {task_name}: {result['about']}", "",
                  f"Target: validation accuracy {summary['target_accuracy']:.3f} "
                  f"(98% of the better static median final, {summary['best_static_final']:.3f}).", "",
                  "| method | updates to target | seconds to target | final accuracy (%) | updates in all | "
                  "batch changes | last effective batch |",
                  "|---|---|---|---|---|---|---|"]
        for method, row in summary["methods"].items():
            lines.append(
                f"| {method} | {_mean_sd(row['updates_to_target'])} | {_mean_sd(row['seconds_to_target'], 1)} | "
                f"{_mean_sd(row['final_accuracy'], 1, 100.0)} | {_mean_sd(row['updates'])} | "
                f"{_mean_sd(row['changes'], 1)} | {_mean_sd(row['final_effective_batch'])} |")
        lines += ["", verdict(summary), ""]
        reasons = {m: row["reasons"] for m, row in summary["methods"].items() if row["reasons"]}
        if reasons:
            lines.append("What moved the adaptive batches (changes over all seeds): " + "; ".join(
                f"{m}: " + ", ".join(f"{why} x{n}" for why, n in sorted(r.items(), key=lambda kv: -kv[1]))
                for m, r in reasons.items()) + ".")
            lines.append("")
    lines.append(SECTION_END)
    return "\n".join(lines)


def verdict(summary: dict) -> str:
    """The issue's aim, checked: >= 20% fewer updates than static16 to the target, final accuracy
    within 0.5 points of the best static."""
    rows = summary["methods"]

    def mean_updates(method):
        values = rows[method]["updates_to_target"]
        return statistics.fmean(values) if values and all(v is not None for v in values) else None

    base = mean_updates("static16") if "static16" in rows else None
    statics = [m for m in ("static16", "static128") if m in rows]
    if not statics:
        return "No static run to compare with."
    best_final = max(statistics.fmean(rows[m]["final_accuracy"]) for m in statics)
    parts = []
    for method in ("adapt", "adapt-short"):
        if method not in rows:
            continue
        updates = mean_updates(method)
        final_gap = 100 * (statistics.fmean(rows[method]["final_accuracy"]) - best_final)
        saving = None if updates is None or base is None else 100 * (1 - updates / base)
        met = saving is not None and saving >= 20 and final_gap >= -0.5
        parts.append(
            f"{method}: " + ("did not reach the target in every seed" if saving is None else
                             f"{saving:+.0f}% fewer updates than static16") +
            f", final accuracy {final_gap:+.1f} points from the best static: aim {'met' if met else 'not met'}")
    return "Against the aim (>= 20% fewer updates than static16, final within 0.5 points of the best static): " + \
        "; ".join(parts) + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--benchmarks-md", type=Path)
    parser.add_argument("--from-json", type=Path, help="re-render a saved result instead of running")
    args = parser.parse_args()
    if args.from_json:
        data = json.loads(args.from_json.read_text())
    else:
        data = {"environment": environment(), "load_average_start": load_average(), "seeds": args.seeds,
                "epochs": args.epochs, "tasks": {}}
        for task_name in args.tasks.split(","):
            task = load_task(task_name)
            log(f"{task_name}: {task['about']}")
            runs = []
            for method in args.methods.split(","):
                for seed in range(args.seeds):
                    run = run_one(task, method, seed, args.epochs)
                    log(f"  {method} seed {seed}: final accuracy {run['curve'][-1][2]:.3f}, {run['updates']} updates, "
                        f"{len(run['changes'])} changes, {run['wall_seconds']:.1f} s")
                    runs.append(run)
            data["tasks"][task_name] = {"about": task["about"], "summary": summarize(runs),
                                        "runs": [thinned(run) for run in runs]}
        data["load_average_end"] = load_average()
        write_json(RESULTS_DIR / "adapt_eval.json", data)
    publish_section(render(data), args.benchmarks_md, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
