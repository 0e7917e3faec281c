"""`edgebatch fleet plan` against a real synchronous update on two workers of different speed.

Not part of the test suite. On this 2-core machine the two "devices" are made honestly, by CPU
affinity and a competing load or a CPU quota, never by sleeps:

- worker `fast`: a process pinned to CPU 0, alone there (as far as this run goes);
- worker `slow`: a process pinned to CPU 1, made slow in one of two ways (`--conditions`, both by
  default, one run each): `spin`, sharing CPU 1 with a busy pure-Python spin loop pinned there (the
  competing load), so it gets about half of that CPU; `quota`, alone on CPU 1 but in a cgroup v1
  cpu cgroup whose quota is half of one CPU (needs root; skipped, and said so, elsewhere).

Each worker is a separate Python process running TensorFlow with one intra-op and one inter-op
thread (set before any op), training a small CNN (32x32x3 inputs, 10 classes, Adam) on synthetic
data. The run:

1. Profile: both workers, at the same time and under the conditions above, time training steps
   (gradient + apply) at batches 1, 2, 4, ... up to their stated safe batch (fast 128, slow 64: the
   safe batches are stated, not probed: the slow worker's stands for a device with less memory),
   after one warm-up step per batch, in PROFILE_ROUNDS rounds over the batches; samples/s is the
   batch over the median step time. These figures become PlanDevices (steady figures).
2. Plan: `plan_fleet` for the effective batch, and the equal split beside it.
3. Measure: both workers run real synchronous updates, K per repeat: each processes its share as
   micro-batches (gradients accumulated in variables), applies once, and meets the other at a
   barrier (multiprocessing.Barrier) before and after; the update time is the wall time between
   the two barriers (the larger of the two workers' readings). Plan and equal split take turns
   update by update, so each repeat's ratio compares neighbours in time.
   No gradients are exchanged between the workers: there is no all-reduce to time, and the plan
   runs with overhead 0.

Writes tools/bench/results/fleet_plan.json and, with --benchmarks-md, replaces (or appends) its own
section at the end of BENCHMARKS.md between the markers below.

    python tools/bench/fleet_plan_bench.py --wait-for-load 1.0 --benchmarks-md BENCHMARKS.md
    python tools/bench/fleet_plan_bench.py --from-json tools/bench/results/fleet_plan.json   # re-render only
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    RESULTS_DIR,
    Stat,
    environment,
    load_average,
    log,
    ratio_stat,
    stat_of,
    spin_load,
    wait_for_load,
    write_json,
    publish_section,
)

from edgebatch.fleet.plan import PlanDevice, ThroughputPoint, plan_fleet

SECTION_START = "<!-- fleet_plan_bench:start -->"
SECTION_END = "<!-- fleet_plan_bench:end -->"
WORKERS = (
    {"name": "fast", "cpu": 0, "safe_batch": 128},
    {"name": "slow", "cpu": 1, "safe_batch": 64},
)
SLOW_CPU = 1
CPU_CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")
QUOTA_FRACTION = 0.5
QUOTA_PERIOD_US = 10_000
CONDITIONS = {
    "spin": "fast pinned to CPU 0; slow pinned to CPU 1 beside a pure-Python spin loop pinned there too",
    "quota": f"fast pinned to CPU 0; slow pinned to CPU 1 in a cgroup v1 cpu cgroup with a quota of "
             f"{QUOTA_FRACTION:.0%} of one CPU (period {QUOTA_PERIOD_US // 1000} ms)",
}
IMAGE_SHAPE = (32, 32, 3)
CLASSES = 10
WAIT_LIMIT_SECONDS = 900.0
PROFILE_ROUNDS = 3  # per batch and round: timed steps for at least PROFILE_MIN_SECONDS and PROFILE_MIN_STEPS
PROFILE_MIN_SECONDS = 0.4
PROFILE_MIN_STEPS = 3
INTERFERENCE_BATCH = 64  # a batch both workers may run
INTERFERENCE_SECONDS = 2.0


def _worker(spec: dict, names: list, effective_batch: int, repeats: int, updates: int, inbox, outbox, barrier) -> None:
    if spec.get("cgroup"):  # before TensorFlow starts any thread: every thread inherits it
        Path(spec["cgroup"], "cgroup.procs").write_text(str(os.getpid()))
    os.sched_setaffinity(0, {spec["cpu"]})
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    os.environ["OMP_NUM_THREADS"] = "1"
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras = tf.keras
    tf.random.set_seed(0)
    model = keras.Sequential([
        keras.Input(IMAGE_SHAPE),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES),
    ])
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    accumulators = [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]
    optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(spec["cpu"])
    largest = max(effective_batch, spec["safe_batch"])
    images = tf.constant(rng.standard_normal((largest, *IMAGE_SHAPE), dtype=np.float32))
    labels = tf.constant(rng.integers(0, CLASSES, largest, dtype=np.int32))

    signature = [tf.TensorSpec([None, *IMAGE_SHAPE], tf.float32), tf.TensorSpec([None], tf.int32)]

    @tf.function(input_signature=signature)
    def accumulate(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        for accumulator, gradient in zip(accumulators, tape.gradient(loss, model.trainable_variables)):
            accumulator.assign_add(gradient)

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def apply(samples):
        optimizer.apply_gradients([(a / samples, v) for a, v in zip(accumulators, model.trainable_variables)])
        for accumulator in accumulators:
            accumulator.assign(tf.zeros_like(accumulator))

    def train_step(batch: int) -> None:
        accumulate(images[:batch], labels[:batch])
        apply(tf.constant(float(batch)))
        accumulators[0].numpy()  # wait for the step to finish

    def run_share(layout: dict) -> float:
        started = time.perf_counter()
        if layout["share"] > 0:
            sizes = [layout["micro_batch"]] * (layout["accumulation"] - 1) + [layout["last_micro_batch"]]
            for size in sizes:
                accumulate(images[:size], labels[:size])
            apply(tf.constant(float(layout["share"])))
            accumulators[0].numpy()
        return time.perf_counter() - started

    # 1. Profile, under this worker's condition; the other worker profiles at the same time.
    batches = []
    batch = 1
    while batch <= spec["safe_batch"]:
        batches.append(batch)
        batch *= 2
    for batch in batches:
        train_step(batch)  # warm-up: first use of this shape

    def profile() -> list[dict]:
        # Rounds over all batches, each step timed on its own, the median step kept: a burst of
        # load from another process spoils a few steps of one round, not a batch's figure.
        step_seconds = {batch: [] for batch in batches}
        for _ in range(PROFILE_ROUNDS):
            for batch in batches:
                steps, started = 0, time.perf_counter()
                while steps < PROFILE_MIN_STEPS or time.perf_counter() - started < PROFILE_MIN_SECONDS:
                    step_started = time.perf_counter()
                    train_step(batch)
                    step_seconds[batch].append(time.perf_counter() - step_started)
                    steps += 1
        return [
            {"batch": batch, "samples_per_second": batch / statistics.median(step_seconds[batch]),
             "steps": len(step_seconds[batch])}
            for batch in batches
        ]

    def timed_steps(batch: int, seconds: float) -> float:
        """Median seconds of training steps at `batch`, run for `seconds`."""
        times, started = [], time.perf_counter()
        while time.perf_counter() - started < seconds:
            step_started = time.perf_counter()
            train_step(batch)
            times.append(time.perf_counter() - step_started)
        return statistics.median(times)

    def timed_micro_steps(batch: int, seconds: float) -> float:
        """Mean seconds of accumulating micro-steps at `batch` (no apply), as an update runs them."""
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            accumulate(images[:batch], labels[:batch])
            count += 1
        accumulators[0].numpy()
        elapsed = time.perf_counter() - started
        apply(tf.constant(float(batch * count)))
        return elapsed / count

    def interference() -> dict:
        # Are the two CPUs independent? Each worker times steps alone (the other waits at the
        # barrier), then both time steps at once.
        batch = INTERFERENCE_BATCH
        result = {"batch": batch}
        for name in names:
            barrier.wait()
            if name == spec["name"]:
                result["alone_step_seconds"] = timed_steps(batch, INTERFERENCE_SECONDS)
                result["alone_micro_step_seconds"] = timed_micro_steps(batch, INTERFERENCE_SECONDS)
            barrier.wait()
        barrier.wait()
        result["together_step_seconds"] = timed_steps(batch, INTERFERENCE_SECONDS)
        barrier.wait()
        return result

    points = profile()
    outbox.put(("profile", spec["name"], points))

    # 2. The layouts to run come back from the parent.
    layouts = inbox.get()
    for layout in layouts.values():  # warm every shape the timed updates use
        run_share(layout)
        run_share(layout)
    barrier.wait()

    # 3. Synchronous updates.
    readings = {name: [] for name in layouts}
    busy = {name: [] for name in layouts}
    for repeat in range(repeats):
        for update in range(updates):
            # Plan and equal split take turns update by update (which goes first alternates), so
            # both meet the same bursts of load from the rest of the machine.
            order = list(layouts) if (repeat + update) % 2 == 0 else list(reversed(layouts))
            for name in order:
                barrier.wait()
                started = time.perf_counter()
                busy[name].append(run_share(layouts[name]))
                barrier.wait()
                readings[name].append((repeat, time.perf_counter() - started))
    barrier.wait()
    # The same profile again, after the updates: how far the machine drifted during the run.
    end_points = profile()
    outbox.put(("updates", spec["name"], readings, busy, end_points, interference()))


def _layout(assignment) -> dict:
    return {
        "share": assignment.share,
        "micro_batch": assignment.micro_batch,
        "accumulation": assignment.accumulation,
        "last_micro_batch": assignment.last_micro_batch,
        "predicted_seconds": assignment.predicted_seconds,
    }


def _idle() -> dict:
    return {"share": 0, "micro_batch": 0, "accumulation": 0, "last_micro_batch": 0, "predicted_seconds": 0.0}


class Unavailable(Exception):
    """A condition this machine cannot set up (no root, no cgroup v1 cpu hierarchy)."""


def _make_quota_cgroup() -> Path:
    """A cgroup v1 cpu cgroup capped at QUOTA_FRACTION of one CPU, with a short period (smooth throttling)."""
    if os.geteuid() != 0 or not (CPU_CGROUP_ROOT / "cpu.cfs_quota_us").exists():
        raise Unavailable(f"needs root and a cgroup v1 cpu hierarchy at {CPU_CGROUP_ROOT}")
    path = CPU_CGROUP_ROOT / f"edgebatch-fleet-plan-bench-{os.getpid()}"
    path.mkdir(exist_ok=True)
    (path / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
    (path / "cpu.cfs_quota_us").write_text(str(int(QUOTA_PERIOD_US * QUOTA_FRACTION)))
    return path


def _remove_cgroup(path: Path) -> None:
    for _ in range(50):  # the worker's exit takes a moment to leave the cgroup empty
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    log(f"could not remove {path}; remove it by hand (rmdir) once it is empty")


def run(condition: str, effective_batch: int, repeats: int, updates: int) -> dict:
    """One bench run with the slow worker made slow by `condition` ("spin" or "quota")."""
    context = mp.get_context("spawn")
    stop = context.Event()
    spinner = None
    cgroup = None
    specs = [dict(spec) for spec in WORKERS]
    if condition == "spin":
        spinner = context.Process(target=spin_load, args=(SLOW_CPU, stop), daemon=True)
        spinner.start()
    elif condition == "quota":
        cgroup = _make_quota_cgroup()
        specs[1]["cgroup"] = str(cgroup)
    else:
        raise ValueError(f"unknown condition {condition!r}")
    barrier = context.Barrier(len(specs))
    outbox = context.Queue()
    inboxes = {spec["name"]: context.Queue() for spec in specs}
    workers = [
        context.Process(target=_worker, args=(spec, [w["name"] for w in specs], effective_batch, repeats, updates,
                                             inboxes[spec["name"]], outbox, barrier))
        for spec in specs
    ]
    started = time.monotonic()
    try:
        for worker in workers:
            worker.start()
        log(f"{condition}: workers started ({CONDITIONS[condition]}); profiling")
        profiles = {}
        while len(profiles) < len(specs):
            kind, name, points = outbox.get(timeout=300)
            assert kind == "profile"
            profiles[name] = points
        devices = [
            PlanDevice(spec["name"], spec["name"], spec["safe_batch"],
                       tuple(ThroughputPoint(p["batch"], p["samples_per_second"]) for p in profiles[spec["name"]]))
            for spec in specs
        ]
        plan = plan_fleet(devices, effective_batch)
        log(f"{condition}: plan {plan.plan.predicted_update_seconds:.4f} s, "
            f"equal split {plan.equal_split.predicted_update_seconds:.4f} s")
        by_plan = {a.device_id: a for a in plan.plan.assignments}
        by_equal = {a.device_id: a for a in plan.equal_split.assignments}
        for spec in specs:
            name = spec["name"]
            inboxes[name].put({
                "plan": _layout(by_plan[name]) if name in by_plan else _idle(),
                "equal": _layout(by_equal[name]),
            })
        results, end_profiles, interferences = {}, {}, {}
        while len(results) < len(specs):
            kind, name, readings, busy, end_points, interference = outbox.get(timeout=600)
            assert kind == "updates"
            results[name] = (readings, busy)
            end_profiles[name] = end_points
            interferences[name] = interference
        for worker in workers:
            worker.join(timeout=30)
    finally:
        stop.set()
        for process in (*workers, *([spinner] if spinner else [])):
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
        if cgroup is not None:
            _remove_cgroup(cgroup)

    measured = {}
    for layout in ("plan", "equal"):
        per_repeat = []
        for repeat in range(repeats):
            # An update lasts from the first barrier to the second: the larger of the two readings.
            columns = [[s for r, s in results[spec["name"]][0][layout] if r == repeat] for spec in specs]
            per_repeat.append(statistics.median(max(values) for values in zip(*columns)))
        busy = {spec["name"]: statistics.median(results[spec["name"]][1][layout]) for spec in specs}
        measured[layout] = {"per_repeat_median_seconds": per_repeat, "stat": stat_of(per_repeat), "busy_median_seconds": busy}
    predicted = {"plan": plan.plan.predicted_update_seconds, "equal": plan.equal_split.predicted_update_seconds}
    # The same two splits timed with the profiles taken after the updates (the plan is not redone).
    end_devices = {
        spec["name"]: PlanDevice(spec["name"], spec["name"], spec["safe_batch"],
                                 tuple(ThroughputPoint(p["batch"], p["samples_per_second"]) for p in end_profiles[spec["name"]]))
        for spec in specs
    }
    predicted_from_end = {
        layout: max(end_devices[a.device_id].share_seconds(a.share, a.micro_batch) for a in split.assignments if a.share)
        for layout, split in (("plan", plan.plan), ("equal", plan.equal_split))
    }
    errors = {
        layout: stat_of([100.0 * (predicted[layout] - m) / m for m in measured[layout]["per_repeat_median_seconds"]])
        for layout in measured
    }
    return {
        "condition": condition,
        "condition_text": CONDITIONS[condition],
        "seconds": time.monotonic() - started,
        "load_average_at_end": load_average(),
        "effective_batch": effective_batch,
        "repeats": repeats,
        "updates_per_repeat": updates,
        "workers": specs,
        "profiles": profiles,
        "profiles_after_updates": end_profiles,
        "interference": interferences,
        "predicted_seconds_from_profiles_after_updates": predicted_from_end,
        "plan": plan.to_dict(),
        "predicted_seconds": predicted,
        "measured": measured,
        "prediction_error_percent": errors,
        "measured_speedup_equal_over_plan": ratio_stat(
            measured["equal"]["per_repeat_median_seconds"], measured["plan"]["per_repeat_median_seconds"]
        ),
        "predicted_speedup_equal_over_plan": plan.speedup,
    }


def _fmt(stat, digits: int = 3) -> str:
    """`median [min-max]` of a Stat, or of its dict form (results read back from JSON)."""
    if stat is None:
        return "-"
    if isinstance(stat, dict):
        stat = Stat(**stat)
    return f"{stat.median:.{digits}f} [{stat.min:.{digits}f}-{stat.max:.{digits}f}]"


def _median(stat) -> float:
    return stat["median"] if isinstance(stat, dict) else stat.median


def _drift_percent(data: dict, name: str) -> float:
    """Median over batches of (samples/s after the updates / before - 1), in percent."""
    after = {p["batch"]: p["samples_per_second"] for p in data["profiles_after_updates"][name]}
    return 100.0 * statistics.median(after[p["batch"]] / p["samples_per_second"] - 1 for p in data["profiles"][name])


def reading(run: dict) -> str:
    """The reading of one run, from its numbers."""
    plan_error = _median(run["prediction_error_percent"]["plan"])
    equal_error = _median(run["prediction_error_percent"]["equal"])
    measured_speedup = run["measured_speedup_equal_over_plan"]
    drift = ", ".join(f"{spec['name']} {_drift_percent(run, spec['name']):+.0f}%" for spec in run["workers"])
    return (
        f"Reading: the prediction error, (predicted - measured) / measured, is {plan_error:+.1f}% for the plan and "
        f"{equal_error:+.1f}% for the equal split (medians over repeats); the plan was measured "
        f"{_median(measured_speedup):.2f}x faster than the equal split against a predicted "
        f"{run['predicted_speedup_equal_over_plan']:.2f}x. The profiles taken after the updates differ from those "
        f"before by (median over batches) {drift}; the last column shows what the same splits predict from them. "
        f"{_interference_text(run)}"
    )


def _interference_text(run: dict) -> str:
    """Each worker's step alone against its step while the other one trains too."""
    found = run.get("interference") or {}
    parts = []
    for spec in run["workers"]:
        item = found.get(spec["name"])
        if item and item.get("alone_step_seconds") and item.get("together_step_seconds"):
            slower = 100.0 * (item["together_step_seconds"] / item["alone_step_seconds"] - 1)
            micro = item.get("alone_micro_step_seconds")
            parts.append(
                f"{spec['name']} {1000 * item['alone_step_seconds']:.1f} ms alone, "
                f"{1000 * item['together_step_seconds']:.1f} ms while the other trains ({slower:+.0f}%)"
                + (f", an accumulating micro-step (no apply) {1000 * micro:.1f} ms alone" if micro else "")
            )
    if not parts:
        return ""
    batch = next(iter(found.values()))["batch"]
    return f"Checks after the updates, a training step at batch {batch}: " + "; ".join(parts) + "."


def _run_markdown(run: dict) -> list[str]:
    plan = run["plan"]
    rows = []
    for label, layout, split in (("plan", "plan", plan["plan"]), ("equal split", "equal", plan["equal_split"])):
        shares = ", ".join(
            f"{d['label']} {d['share']} = {d['micro_batch']} x {d['accumulation']}"
            + (f" (last {d['last_micro_batch']})" if d["last_micro_batch"] != d["micro_batch"] else "")
            for d in split["devices"] if d["share"] > 0
        )
        busy = run["measured"][layout]["busy_median_seconds"]
        predicted_each = ", ".join(f"{d['label']} {d['predicted_seconds']:.3f}" for d in split["devices"] if d["share"] > 0)
        measured_each = ", ".join(f"{name} {seconds:.3f}" for name, seconds in busy.items())
        rows.append(
            f"| {label} | {shares} | {run['predicted_seconds'][layout]:.3f} | {_fmt(run['measured'][layout]['stat'])} "
            f"| {_fmt(run['prediction_error_percent'][layout], 1)} | {predicted_each} | {measured_each} "
            f"| {run['predicted_seconds_from_profiles_after_updates'][layout]:.3f} |"
        )
    profile_lines = []
    for spec in run["workers"]:
        after = {p["batch"]: p["samples_per_second"] for p in run["profiles_after_updates"][spec["name"]]}
        figures = ", ".join(
            f"{p['batch']}: {p['samples_per_second']:.0f} ({after[p['batch']]:.0f})" for p in run["profiles"][spec["name"]]
        )
        profile_lines.append(
            f"- {spec['name']} (CPU {spec['cpu']}, safe batch {spec['safe_batch']}): samples/s at batch {figures}"
        )
    left = "; ".join(f"{d['label']}: {d['reason']}" for d in plan["left_out"]) or "none"
    return [
        f"### Slow worker: {run['condition']} ({run['condition_text']})",
        "",
        (f"{run['seconds']:.0f} s; load average at its end {run['load_average_at_end']}. Profiles, samples/s (in "
        "brackets: the same profile taken again after the updates):"),
        "",
        *profile_lines,
        "",
        ("| split | shares | predicted s | measured s | error % | predicted s per worker | measured busy s per worker "
        "| predicted s from the profile after |"),
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        (f"Left out by the plan: {left}. Equal split micro-batch {plan['equal_split']['micro_batch']} (the smallest "
        f"ceiling). Speedup of the plan over the equal split: predicted {run['predicted_speedup_equal_over_plan']:.2f}x, "
        f"measured {_fmt(run['measured_speedup_equal_over_plan'], 2)}x (per-repeat ratios, same run)."),
        "",
        reading(run),
        "",
    ]


def markdown(data: dict) -> str:
    env = data["environment"]
    first = data["runs"][0] if data["runs"] else None
    waited = data.get("waited_for_load")
    wait_text = ""
    if waited:
        wait_text = (
            f" It first waited {waited['seconds']:.0f} s for the 1-minute load average to fall below {waited['below']:g} "
            f"({'it did' if waited['reached'] else 'it did not; it ran anyway'})."
        )
    lines = [
        SECTION_START,
        "## 6. Fleet plan: predicted against measured synchronous updates",
        "",
        (f"Written by `{data['command']}` on {env['date_utc']} (commit {env['git_commit']}, {data['seconds']:.0f} s); "
        f"raw numbers in `tools/bench/results/fleet_plan.json`. Machine: {env['cpu']}, {env['cores']} cores, shared "
        f"with other sessions' tests; load average at start {env['load_average_at_start']}, at end "
        f"{data['load_average_at_end']}.{wait_text}"),
        "",
        "Two workers of different speed, made by CPU affinity and a competing load or a CPU quota, never by sleeps. "
        "Each is its own process running TensorFlow with 1 intra-op and 1 inter-op thread, training a small CNN "
        "(32x32x3, 3 conv layers, Adam) on synthetic data. Both profile at the same time, under the conditions of the "
        "run (one warm-up step per batch, then "
        f"{PROFILE_ROUNDS} rounds over the batches of >= {PROFILE_MIN_STEPS} steps and >= {PROFILE_MIN_SECONDS} s each; "
        "samples/s = batch / median step time); the safe batches (fast 128, slow 64) are stated, not probed. "
        "`plan_fleet` splits the effective batch from those profiles. Then both run real synchronous updates: each "
        "worker's share as micro-batches with gradients accumulated, then one apply, between two barriers "
        "(multiprocessing.Barrier); the update time is the wall time between the barriers. No gradients cross between "
        "the workers, so there is no all-reduce (overhead 0). Plan and equal split take turns update by update."
        + (f" Effective batch {first['effective_batch']}; {first['repeats']} repeats of {first['updates_per_repeat']} "
           "updates per split. Measured = median over repeats of the per-repeat median [min-max over repeats]; "
           "error = (predicted - measured) / measured." if first else ""),
        "",
    ]
    for run in data["runs"]:
        lines += _run_markdown(run)
    for condition, why in data.get("skipped", {}).items():
        lines += [f"### Slow worker: {condition}", "", f"Not run: {why}.", ""]
    lines += [
        ("How to read it: the planner takes each device's speed from its profile: a full training step "
        "(gradient and apply) timed while both workers train, and independent of what the other device does. The "
        "checks at the end of each reading test those assumptions on this machine: whether one worker slows the other "
        "(the two vCPUs may share the host's core, caches or memory bandwidth), and how an accumulating micro-step "
        "(no apply, as inside an update) compares with the profiled step. The plan keeps both workers busy until the "
        "end of the update, like the profile; the equal split leaves the fast worker idle for much of each update. "
        "The prediction can be no better than the profile it starts from, and on this shared machine a worker's "
        "speed moves by tens of percent within a minute (compare each profile with its repeat after the updates). "
        "Under the spin loop the slow worker's share of CPU 1 is the scheduler's to decide and may change when it "
        "sleeps at the barrier; the CPU quota caps it at the same share whether it waits or not, closer to a device "
        "that is simply slower. Single-digit percentages are noise here."),
        "",
        SECTION_END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effective-batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--updates", type=int, default=20, help="timed updates per split per repeat")
    parser.add_argument("--conditions", default="spin,quota",
                        help="how the slow worker is made slow, in order: spin (a spin loop on its CPU), quota (a CPU quota)")
    parser.add_argument("--benchmarks-md", type=Path, default=None, help="write this bench's section into this file")
    parser.add_argument("--wait-for-load", type=float, default=None, metavar="LOAD",
                        help="first wait (up to 15 min) for the 1-minute load average to fall below LOAD")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="do not run: render the section from a results file this tool wrote")
    args = parser.parse_args()
    unknown = set(args.conditions.split(",")) - set(CONDITIONS)
    if unknown:
        parser.error(f"unknown conditions {sorted(unknown)}; choose from {sorted(CONDITIONS)}")
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text())
    else:
        waited = None if args.wait_for_load is None else wait_for_load(args.wait_for_load, WAIT_LIMIT_SECONDS)
        started = time.monotonic()
        data = {
            "command": "python tools/bench/fleet_plan_bench.py " + " ".join(sys.argv[1:]),
            "environment": environment(),
            "waited_for_load": waited,
            "runs": [],
            "skipped": {},
        }
        for condition in args.conditions.split(","):
            try:
                data["runs"].append(run(condition, args.effective_batch, args.repeats, args.updates))
            except Unavailable as why:
                data["skipped"][condition] = str(why)
        data["seconds"] = time.monotonic() - started
        data["load_average_at_end"] = load_average()
        write_json(RESULTS_DIR / "fleet_plan.json", data)
    publish_section(markdown(data), args.benchmarks_md, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
