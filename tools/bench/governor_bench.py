"""Section 2: what the governor costs per optimizer update, as a share of a real training step.

First a throughput sweep (samples/s against batch, the probe's own TrialRunner, in this process)
finds the model's knee: the smallest batch within 5% of the best samples/s (summary.KNEE_FRACTION).
Then, in each repeat, side by side: the median training step at the knee, `Governor.observe` and a
forced `PressureReader.read` (tools/bench/governor_cost.py's timers, reused), and their ratios. The
reader rate-limits itself in training (at most one read every 10 updates and 0.5 s), so the
per-update share of sensor reads is also given amortised that way.
"""

from __future__ import annotations

import math
import statistics

import governor_cost
from harness import Deadline, Mode, log, ratio_stat, stat_of

QUICK_MODEL, QUICK_BATCHES = "small_cnn", (8, 16, 32, 64, 128)
FULL_MODEL, FULL_BATCHES = "mobilenet_v2", (8, 16, 32, 64, 96, 128)
OBSERVE_CALLS = 2000
READ_CALLS = 200
# PressureReader's defaults: a read at most every 10 updates and every 0.5 s.
READ_EVERY_UPDATES, READ_MIN_INTERVAL_SECONDS = 10, 0.5


def build_runner(model_name: str):
    import tensorflow as tf

    from edgebatch.probing.trial import TrialRunner
    from edgebatch.models.zoo import build_model, parse_model_spec

    with tf.device("CPU:0"):
        model = build_model(parse_model_spec(model_name))
    runner = TrialRunner(model, optimizer="adam", device="CPU:0")
    runner.run_steps(1, 1)  # trace once (batch dimension None)
    return runner


def throughput_sweep(runner, batches, repeats: int, steps: int, seconds_left) -> dict:
    """Median step seconds and samples/s per batch, the batches interleaved within each repeat."""
    seconds: dict[int, list[float]] = {b: [] for b in batches}
    for batch in batches:
        runner.run_steps(batch, 1)  # first call at a new shape pays for memory growth, not training
    for repeat in range(repeats):
        if repeat and seconds_left() < 0:
            break
        for batch in batches:
            seconds[batch].append(statistics.median(runner.run_steps(batch, steps)))
    rows = []
    for batch in batches:
        rows.append({
            "batch": batch,
            "step_seconds": stat_of(seconds[batch]),
            "samples_per_second": stat_of([batch / s for s in seconds[batch]]),
        })
    best = max(row["samples_per_second"].median for row in rows)
    knee = min(row["batch"] for row in rows if row["samples_per_second"].median >= 0.95 * best)
    return {"rows": rows, "knee_batch": knee, "best_samples_per_second": best}


def run(mode: Mode, deadline: Deadline, end: float) -> dict:
    model_name, batches = (QUICK_MODEL, QUICK_BATCHES) if mode.quick else (FULL_MODEL, FULL_BATCHES)
    seconds_left = lambda: deadline.until(end)  # noqa: E731
    runner = build_runner(model_name)
    sweep = throughput_sweep(runner, batches, mode.repeats, 3 if mode.quick else 5, seconds_left)
    knee = sweep["knee_batch"]
    log(f"governor: {model_name} knee batch {knee} ({sweep['best_samples_per_second']:.0f} samples/s at best)")
    step_s, observe_us, read_us, sources = [], [], [], None
    for repeat in range(mode.repeats):
        if repeat and seconds_left() < 0:
            break
        step_s.append(statistics.median(runner.run_steps(knee, 3 if mode.quick else 5)))
        observe_us.append(governor_cost.bench_observe(1, OBSERVE_CALLS)["median_us"])
        read = governor_cost.bench_read(1, READ_CALLS, "CPU:0", True)
        read_us.append(read["median_us"])
        sources = read.get("sources")
    # Reads per update under the reader's rate limits, at this step time.
    reads_per_update = [1 / max(READ_EVERY_UPDATES, math.ceil(READ_MIN_INTERVAL_SECONDS / s)) for s in step_s]
    step_us = [s * 1e6 for s in step_s]
    amortised_read_us = [r * k for r, k in zip(read_us, reads_per_update)]
    per_update_us = [o + a for o, a in zip(observe_us, amortised_read_us)]
    return {
        "model": model_name,
        "sweep": sweep,
        "knee_batch": knee,
        "repeats": len(step_s),
        "sensor_sources": sources,
        "step_us": stat_of(step_us),
        "observe_us": stat_of(observe_us),
        "read_us": stat_of(read_us),
        "observe_share": ratio_stat(observe_us, step_us),
        "read_share_every_update": ratio_stat(read_us, step_us),
        "read_share_amortised": ratio_stat(amortised_read_us, step_us),
        "per_update_share": ratio_stat(per_update_us, step_us),
    }
