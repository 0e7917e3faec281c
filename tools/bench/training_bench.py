"""Section 3: governed training (edgebatch.training.fit) against the best static batch.

No pressure, in this process: a sweep of static batches picks the oracle (the best samples/s), then
each repeat runs, side by side on the same data, a plain static loop at the oracle's batch and `fit`
with the governor (default PressureReader, so its sensor reads are paid for): once with the oracle's
batch as both effective batch and ceiling (the loop's own overhead), once with twice the batch as
the effective batch (gradient accumulation over two micro-batches of the oracle's size). Samples/s
count the updates after the first (the first traces the step), timestamped the same way for both.

Pressure, in child processes (pressure_child.py): an address-space cap under which a static batch at
the ceiling crashes; the governed run starts at that ceiling; a third run beside them is the governed
one under `edgebatch supervise` (a child oneDNN aborts is restarted from its checkpoint). Reported:
completion, restarts, samples/s, OOM events, and the micro-batch of every update (the batch-over-time plot).
"""

from __future__ import annotations

import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from harness import MIB, ROOT, Deadline, Mode, capped_malloc_arenas, log, ratio_stat, run_child, stat_of

MODEL = "small_cnn"
CANDIDATES = (32, 64, 128)
# dense_wide (tests/models): dense kernels only, so an OOM under the cap is a clean
# ResourceExhaustedError that fit can recover from (convolutions may segfault instead: docs/tensorflow-memory.md).
# Measured here: a fresh process (plain step) under a 600 MiB cap runs batch 256 and fails at 512; a
# static loop at 512 fails under 600-800 MiB caps. fit recovered at 600 and 700 MiB (3 and 2 OOM
# shrinks) and, once at 800 MiB, died of a MemoryError while tracing its apply step, all with glibc's
# default malloc arenas; with two (capped_malloc_arenas, as these runs use) 700 MiB took 1 shrink.
PRESSURE_MODEL = f"{ROOT / 'tests' / 'models' / 'dense_wide.py'}:build"
PRESSURE_CEILING = 512
QUICK_PRESSURE_HEADROOMS = (700 * MIB,)
FULL_PRESSURE_HEADROOMS = (600 * MIB, 700 * MIB, 800 * MIB)
PRESSURE_CHILD = ROOT / "tools" / "bench" / "pressure_child.py"
# What one static + governed pair took here, side by side (the governed run: a TensorFlow import,
# two ~10 s OOMs, 6 updates): 33-49 s; the supervised governed run beside them, and its restart
# when oneDNN aborts, adds to that.
PAIR_SECONDS = 60.0
# The governed run under `edgebatch supervise` (a death by a signal is restarted from its checkpoint).
KINDS = ("static", "governed", "supervised")
LABELS = {"static": "static", "governed": "governed", "supervised": "governed + supervisor"}
# The no-pressure sweep and its first repeat (quick mode, small_cnn): ~20 s here.
NO_PRESSURE_MIN_SECONDS = 20.0


def _data(model, examples: int):
    import numpy as np

    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    rng = np.random.default_rng(0)
    x = rng.random((examples, *shape), dtype=np.float32)
    y = rng.integers(0, int(model.outputs[0].shape[-1]), examples).astype(np.int32)
    return x, y


def _pace(stamps: list[float], examples: list[int]) -> float | None:
    """Samples/s over the updates after the first: stamps[i] is when update i ended."""
    if len(stamps) < 2:
        return None
    return sum(examples[1:]) / (stamps[-1] - stamps[0])


def static_run(model, x, y, batch: int, updates: int) -> float | None:
    import keras
    import tensorflow as tf

    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec((None, *x.shape[1:]), tf.float32), tf.TensorSpec((None,), tf.int32)])
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).prefetch(tf.data.AUTOTUNE)
    stamps, examples = [], []
    for xb, yb in dataset.take(updates + 1):
        step(xb, yb).numpy()  # one host sync per update, as fit has
        stamps.append(time.perf_counter())
        examples.append(int(xb.shape[0]))
    return _pace(stamps, examples)


def governed_run(model, x, y, effective_batch: int, ceiling: int, updates: int) -> tuple[float | None, dict]:
    import keras
    import tensorflow as tf

    from edgebatch.governor import Governor, GovernorConfig, PressureReader
    from edgebatch.training import fit

    stamps, examples = [], []

    def on_update(record) -> None:
        stamps.append(time.perf_counter())
        examples.append(record.examples)

    governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=effective_batch))
    report = fit(model, tf.data.Dataset.from_tensor_slices((x, y)),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 optimizer=keras.optimizers.Adam(1e-3), effective_batch=effective_batch, governor=governor,
                 pressure_reader=PressureReader("CPU:0"), max_updates=updates + 1, on_update=on_update)
    facts = {"decisions": len(report.decisions), "oom_events": len(report.oom_events), "traces": report.traces,
             "micro_batches": sorted({m for r in report.updates for m in r.micro_batches})}
    return _pace(stamps, examples), facts


def no_pressure(mode: Mode, seconds_left) -> dict:
    from edgebatch.models.zoo import build_model, parse_model_spec

    # Quick: 8 timed updates (~1.3 s) gave ratios from 0.81 to 1.33 on the shared machine: time longer.
    updates = 12 if mode.quick else 30
    model = build_model(parse_model_spec(MODEL))
    x, y = _data(model, 2 * max(CANDIDATES) * (updates + 1))
    # The sweep only picks the oracle; quick mode gives it fewer updates than the timed repeats.
    sweep = {batch: static_run(model, x, y, batch, 4 if mode.quick else updates) for batch in CANDIDATES}
    oracle = max(sweep, key=lambda b: sweep[b] or 0)
    log(f"training: static sweep {', '.join(f'{b}: {s:.0f}/s' for b, s in sweep.items())}; oracle batch {oracle}")
    static, governed, accumulated, facts = [], [], [], []
    for repeat in range(mode.repeats):
        if repeat and seconds_left() < 0:
            break
        static.append(static_run(model, x, y, oracle, updates))
        pace, fact = governed_run(model, x, y, oracle, oracle, updates)
        governed.append(pace)
        facts.append(fact)
        if not mode.quick:  # quick mode has no time for it
            pace, fact = governed_run(model, x, y, 2 * oracle, oracle, updates)
            accumulated.append(pace)
            facts.append(fact)
    return {
        "model": MODEL,
        "updates_timed": updates,
        "static_sweep_samples_per_second": {str(b): s for b, s in sweep.items()},
        "oracle_batch": oracle,
        "repeats": len(static),
        "static_samples_per_second": stat_of(static),
        "governed_samples_per_second": stat_of(governed),
        "governed_accumulating_samples_per_second": stat_of(accumulated),
        "governed_vs_oracle": ratio_stat(governed, static),
        "governed_accumulating_vs_oracle": ratio_stat(accumulated, static),
        "governed_facts": facts,
    }


def under_pressure(mode: Mode, seconds_left) -> dict:
    updates = 6 if mode.quick else 40
    repeats = 1 if mode.quick else 3
    headrooms = QUICK_PRESSURE_HEADROOMS if mode.quick else FULL_PRESSURE_HEADROOMS
    runs: dict[str, dict[str, list[dict]]] = {str(h): {kind: [] for kind in KINDS} for h in headrooms}
    skipped = []
    with ThreadPoolExecutor(max_workers=len(KINDS)) as pool, capped_malloc_arenas(), \
            tempfile.TemporaryDirectory(prefix="edgebatch-pressure-") as checkpoints:
        for repeat in range(repeats):
            for headroom in headrooms:
                if seconds_left() < PAIR_SECONDS:
                    skipped.append(f"{headroom // MIB} MiB cap, repeat {repeat + 1}: time budget")
                    continue
                # The pair runs side by side: the static loop crashes at its first step (a TensorFlow
                # import and the allocator's ~10 s of retrying), mostly before the governed run,
                # which meets the same OOMs first, reaches the updates that set its pace.
                timeout = max(90.0, seconds_left() + 30)
                arguments = [PRESSURE_MODEL, str(PRESSURE_CEILING), str(updates), str(headroom)]
                directory = f"{checkpoints}/{headroom}-{repeat}"
                commands = {
                    "static": [str(PRESSURE_CHILD), "static", *arguments],
                    "governed": [str(PRESSURE_CHILD), "governed", *arguments],
                    "supervised": ["-m", "edgebatch", "supervise", "--checkpoint-dir", directory, "--",
                                   sys.executable, str(PRESSURE_CHILD), "supervised", *arguments, directory],
                }
                futures = {kind: pool.submit(run_child, commands[kind], timeout) for kind in KINDS}
                for kind, future in futures.items():
                    child = future.result()
                    reply = child.reply or {"completed": False,
                                            "error": f"child exit {child.returncode}: {child.stderr_tail}"}
                    reply["child_seconds"] = child.seconds
                    runs[str(headroom)][kind].append(reply)
                    log(f"pressure {headroom // MIB} MiB {kind}: completed {reply.get('completed')}, "
                        f"{reply.get('updates_done')} updates, {reply.get('oom_events')} OOM events, "
                        f"restart {reply.get('restart', '-')}, "
                        f"{child.seconds:.0f} s {reply.get('error') or ''}"[:300])
    summary = {}
    for headroom, kinds in runs.items():
        for kind, replies in kinds.items():
            summary[f"{LABELS[kind]}, {int(headroom) // MIB} MiB cap"] = {
                "kind": kind,
                "headroom_bytes": int(headroom),
                "runs": len(replies),
                "restarts": sum(r.get("restart") or 0 for r in replies),
                "completed_runs": sum(bool(r.get("completed")) for r in replies),
                "updates_done": stat_of([r.get("updates_done") for r in replies]),
                "oom_events": stat_of([r.get("oom_events") for r in replies]),
                "samples_per_second": stat_of([r.get("samples_per_second") for r in replies]),
                "steady_samples_per_second": stat_of([r.get("steady_samples_per_second") for r in replies]),
                "errors": sorted({r["error"] for r in replies if r.get("error")}),
            }
    return {"model": "dense_wide (tests/models)", "ceiling_batch": PRESSURE_CEILING, "repeats": repeats,
            "updates_planned": updates, "summary": summary, "runs": runs, "skipped": skipped}


def run(mode: Mode, deadline: Deadline, end: float) -> dict:
    """Pressure first (its completion is a target and a pair cannot be cut short), then the
    no-pressure comparison with what is left (its sweep and first repeat always run)."""
    pressure = under_pressure(mode, lambda: deadline.until(end) - NO_PRESSURE_MIN_SECONDS)
    return {"no_pressure": no_pressure(mode, lambda: deadline.until(end)), "pressure": pressure}
