"""Issue 42's evaluation: the goodput policy against a sweep of static batches.

Not part of the test suite. The tasks, model and training are tools/bench/adapt_eval.py's (digits
and the standard library's docstrings; an MLP; Adam at 1e-3 for batch 16; the same epochs, so the
same examples, for every method). Methods:
- `static16` ... `static256`: one effective batch each, the rate scaled by the square root of the
  batch over 16 (the rule the adaptive runs use, lr_rule="sqrt");
- `adapt`: the noise-scale policy, AdaptConfig(lr_rule="sqrt", check_every_updates=10,
  cooldown_updates=20) (adapt_eval's `adapt-short`: these runs are a few hundred updates), start 16;
- `goodput`: the same timing with policy="goodput" and throughput="measured": no profile, the
  curve learned from fit's own step times (adapt/goodput.py, MeasuredSteps), start 16.
The adaptive runs get a governor of ceiling 512, no limit for these models.

Per task, over the seeds (each seed: initialisation and data order), the medians of: training
seconds (fit's update seconds, not the per-update evaluation) and samples until the validation
accuracy first reaches the target, and the final accuracy. The target is 98% of the best static
median final accuracy, rounded down to 0.5 points. The issue's targets are checked on the medians:
goodput's seconds to the target <= 1.1x the best static's and <= 0.75x the median static's, its
final accuracy within 0.5 points of the best static's. The batch trajectories of seed 0 are
plotted to tools/bench/results/goodput_trajectory.png.

    python tools/bench/goodput_sweep.py --seeds 5 --benchmarks-md BENCHMARKS.md
    python tools/bench/goodput_sweep.py --from-json tools/bench/results/goodput_sweep.json --benchmarks-md BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapt_eval import BASE_RATE, HIDDEN_UNITS, TARGET_FRACTION, load_task
from harness import (RESULTS_DIR, ROOT, add_output_options, environment, load_average, log, measured_or_loaded,
                     publish_section)

SECTION_START = "<!-- goodput_sweep:start -->"
SECTION_END = "<!-- goodput_sweep:end -->"
STATIC_BATCHES = (16, 32, 64, 128, 256)
STATICS = tuple(f"static{batch}" for batch in STATIC_BATCHES)
METHODS = (*STATICS, "adapt", "goodput")
TASKS = ("digits", "docstrings")
ADAPT_MAX_BATCH = 512
ADAPT_TIMING = {"lr_rule": "sqrt", "check_every_updates": 10, "cooldown_updates": 20,
                "max_effective_batch_samples": ADAPT_MAX_BATCH}
PLOT = RESULTS_DIR / "goodput_trajectory.png"


def run_one(task: dict, method: str, seed: int, epochs: int) -> dict:
    """One (method, seed): per update (training seconds so far, samples so far, validation accuracy,
    effective batch asked for)."""
    import keras
    import tensorflow as tf

    from edgebatch.adapt import AdaptConfig
    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((task["x"].shape[1],)), keras.layers.Dense(HIDDEN_UNITS, activation="relu"),
                              keras.layers.Dense(task["classes"])])
    x_val = tf.constant(task["x_val"])
    predict = tf.function(lambda x: tf.argmax(model(x, training=False), axis=-1))
    curve: list[tuple[float, int, float, int]] = []
    totals = {"seconds": 0.0, "samples": 0}

    def on_update(record) -> None:
        totals["seconds"] += record.seconds
        totals["samples"] += record.examples
        accuracy = float(np.mean(predict(x_val).numpy() == task["y_val"]))
        curve.append((totals["seconds"], totals["samples"], accuracy, record.effective_batch))

    dataset = tf.data.Dataset.from_tensor_slices((task["x"], task["y"])).shuffle(
        len(task["x"]), seed=seed, reshuffle_each_iteration=True)
    arguments = {"loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "epochs": epochs,
                 "on_update": on_update}
    if method in STATICS:
        batch = int(method.removeprefix("static"))
        fit(model, dataset, optimizer=keras.optimizers.Adam(BASE_RATE * math.sqrt(batch / 16)), effective_batch=batch,
            **arguments)
    else:
        policy = {"policy": "goodput", "throughput": "measured"} if method == "goodput" else {}
        governor = Governor(GovernorConfig(ceiling_batch=ADAPT_MAX_BATCH, effective_batch=ADAPT_MAX_BATCH))
        fit(model, dataset, optimizer=keras.optimizers.Adam(BASE_RATE), effective_batch=16, governor=governor,
            adapt=AdaptConfig(**ADAPT_TIMING, **policy), **arguments)
    return {"method": method, "seed": seed, "curve": curve}


def thinned(run: dict) -> dict:
    """A run as saved: seed 0's adaptive runs whole (the plot), the others every 10th update and the last."""
    if run["seed"] == 0 and run["method"] in ("adapt", "goodput"):
        return run
    curve = run["curve"]
    return dict(run, curve=[point for index, point in enumerate(curve) if index % 10 == 0 or index == len(curve) - 1])


def to_target(curve: list, target: float) -> tuple[float | None, int | None]:
    """(training seconds, samples) when the validation accuracy first reached `target`."""
    for seconds, samples, accuracy, _batch in curve:
        if accuracy >= target:
            return seconds, samples
    return None, None


def _median(values: list) -> float | None:
    """The median, or None when a seed never got there (counted as slower than every other)."""
    return None if any(v is None for v in values) else statistics.median(values)


def summarize(runs: list[dict]) -> dict:
    """Target from the static runs, then per method the medians over the seeds."""
    finals = {m: statistics.median(r["curve"][-1][2] for r in runs if r["method"] == m) for m in STATICS}
    best_final = max(finals.values())
    target = math.floor(TARGET_FRACTION * best_final * 200) / 200
    rows = {}
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        reached = [to_target(r["curve"], target) for r in mine]
        rows[method] = {"seconds_to_target": _median([s for s, _ in reached]),
                        "samples_to_target": _median([n for _, n in reached]),
                        "final_accuracy": statistics.median(r["curve"][-1][2] for r in mine),
                        "last_batch": statistics.median(r["curve"][-1][3] for r in mine)}
    return {"target_accuracy": target, "best_static_final": best_final, "methods": rows, "verdict": verdict(rows)}


def verdict(rows: dict) -> dict:
    """Issue 42's targets on the medians (module docstring)."""
    static_seconds = [rows[m]["seconds_to_target"] for m in STATICS]
    reached = [s for s in static_seconds if s is not None]
    best, median = min(reached), statistics.median(s if s is not None else math.inf for s in static_seconds)
    goodput = rows["goodput"]
    best_final = max(rows[m]["final_accuracy"] for m in STATICS)
    seconds = goodput["seconds_to_target"]
    return {"best_static_seconds": best, "median_static_seconds": median,
            "vs_best": None if seconds is None else seconds / best,
            "vs_median": None if seconds is None else seconds / median,
            "final_gap_points": 100 * (goodput["final_accuracy"] - best_final),
            "met": seconds is not None and seconds <= 1.1 * best and seconds <= 0.75 * median
            and goodput["final_accuracy"] >= best_final - 0.005}


def plot(data: dict, path: Path) -> None:
    """Effective batch over training samples, seed 0, the adaptive methods and the best static."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(data["tasks"])
    figure, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for axis, task_name in zip(axes[0], tasks):
        for run in data["tasks"][task_name]["runs"]:
            if run["seed"] == 0 and run["method"] in ("adapt", "goodput"):
                samples = [point[1] for point in run["curve"]]
                axis.step(samples, [point[3] for point in run["curve"]], where="post", label=run["method"])
        axis.set(title=task_name, xlabel="training samples", ylabel="effective batch", yscale="log")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _cell(value, digits: int, scale: float = 1.0) -> str:
    return "not reached" if value is None else f"{value * scale:.{digits}f}"


def render(data: dict) -> str:
    lines = [SECTION_START, "", "## 16. Goodput against a sweep of static batches (issue 42)", "",
             f"`python tools/bench/goodput_sweep.py --seeds {data['seeds']} --benchmarks-md BENCHMARKS.md` (commit "
             f"{data['environment'].get('git_commit')}, {data['epochs']} epochs per run, load average "
             f"{data['load_average_start']} at the start, {data['load_average_end']} at the end). Medians over "
             f"{data['seeds']} seeds; seconds are training seconds on a shared 2-core machine. What each method is: "
             "the docstring of tools/bench/goodput_sweep.py. Both adaptive policies start at 16 and move at most "
             "x1.5 a change, with a check every 10 updates and 20 updates of cooldown. Batch trajectories (seed 0): "
             f"`{PLOT.relative_to(ROOT)}`.", ""]
    for task_name, result in data["tasks"].items():
        summary, check = result["summary"], result["summary"]["verdict"]
        lines += [f"### {task_name}: {result['about']}", "",
                  f"Target: validation accuracy {summary['target_accuracy']:.3f} (98% of the best static median "
                  f"final, {summary['best_static_final']:.3f}).", "",
                  "| method | seconds to target | samples to target | final accuracy (%) | last effective batch |",
                  "|---|---|---|---|---|"]
        for method, row in summary["methods"].items():
            lines.append(f"| {method} | {_cell(row['seconds_to_target'], 2)} | {_cell(row['samples_to_target'], 0)} | "
                         f"{_cell(row['final_accuracy'], 1, 100.0)} | {row['last_batch']:.0f} |")
        ratios = ("never reached the target" if check["vs_best"] is None else
                  f"{check['vs_best']:.2f}x the best static's seconds (target <= 1.1x) and {check['vs_median']:.2f}x "
                  "the median static's (target <= 0.75x)")
        lines += ["", f"goodput: {ratios}; final accuracy {check['final_gap_points']:+.1f} points from the best "
                  f"static (target >= -0.5): {'met' if check['met'] else 'not met'}.", ""]
    lines.append(SECTION_END)
    return "\n".join(lines)


def measure(args: argparse.Namespace) -> dict:
    data = {"environment": environment(), "load_average_start": load_average(), "seeds": args.seeds,
            "epochs": args.epochs, "tasks": {}}
    for task_name in args.tasks.split(","):
        task = load_task(task_name)
        log(f"{task_name}: {task['about']}")
        runs = []
        for seed in range(args.seeds):
            for method in METHODS:  # methods take turns within a seed: load drifts hit them alike
                started = time.perf_counter()
                runs.append(run_one(task, method, seed, args.epochs))
                log(f"  seed {seed} {method}: final accuracy {runs[-1]['curve'][-1][2]:.3f}, "
                    f"{time.perf_counter() - started:.1f} s")
        data["tasks"][task_name] = {"about": task["about"], "summary": summarize(runs),
                                    "runs": [thinned(run) for run in runs]}
    data["load_average_end"] = load_average()
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    add_output_options(parser)
    args = parser.parse_args()
    data = measured_or_loaded(args.from_json, lambda: measure(args), "goodput_sweep.json")
    if args.from_json is None:
        plot(data, PLOT)
    publish_section(render(data), args.benchmarks_md, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
