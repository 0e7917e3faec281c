"""One training run under an address-space cap, in its own process (training_bench.py starts it).

The cap stands in for memory pressure that arrived after the device was probed: the profile's
ceiling no longer fits. `static` trains at a fixed batch and stops at the first OOM, as a plain
loop would crash; `governed` runs edgebatch.training.fit with the governor's ceiling at that batch.
Prints one JSON line (harness.send_reply): completed, updates, samples/s, OOM events, and the
micro-batch of every update (the batch-over-time plot).

    python pressure_child.py {static|governed} MODEL_SPEC BATCH UPDATES HEADROOM_BYTES
    python pressure_child.py supervised MODEL_SPEC BATCH UPDATES HEADROOM_BYTES CHECKPOINT_DIR

`supervised` is `governed` with a checkpoint every 2 updates in CHECKPOINT_DIR, for a run under
`edgebatch supervise`: a child that dies by a signal (oneDNN's `dnnl::error` abort) is restarted
and resumes from the checkpoint; the reply of the child that finished says which restart it was.
"""

from __future__ import annotations

import os
import resource
import sys
import time

from harness import send_reply, status_bytes


def main(argv: list[str]) -> int:
    mode, spec, batch, updates, headroom = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    from edgebatch.models.zoo import build_model, parse_model_spec

    model = build_model(parse_model_spec(spec))
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    classes = int(model.outputs[0].shape[-1])
    rng = np.random.default_rng(0)
    x = rng.random((batch * updates, *shape), dtype=np.float32)
    y = rng.integers(0, classes, batch * updates).astype(np.int32)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    # The same cap as the probe's workers and the truth runs: this process's size now + headroom.
    resource.setrlimit(resource.RLIMIT_AS, (status_bytes("VmSize") + headroom, resource.RLIM_INFINITY))
    started = time.perf_counter()
    if mode == "static":
        reply = _static(model, loss, optimizer, x, y, batch, updates, tf)
    else:
        reply = _governed(model, loss, optimizer, x, y, batch, updates, tf, argv[5] if mode == "supervised" else None)
    reply.update({"mode": mode, "model": spec, "batch": batch, "updates_planned": updates,
                  "headroom_bytes": headroom, "wall_seconds": time.perf_counter() - started})
    send_reply(reply)
    return 0


def _oom_line(exc: BaseException) -> str:
    """The line of TensorFlow's message that says what failed (its first line is 'Graph execution error:')."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return next((line for line in lines if "OOM" in line), lines[0] if lines else "")[:200]


def _static(model, loss_fn, optimizer, x, y, batch, updates, tf) -> dict:
    spec_x = tf.TensorSpec((None, *x.shape[1:]), tf.float32)

    @tf.function(input_signature=[spec_x, tf.TensorSpec((None,), tf.int32)])
    def step(xb, yb):
        with tf.GradientTape() as tape:
            value = loss_fn(yb, model(xb, training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
        return value

    stamps, timeline, error = [time.perf_counter()], [], None
    for update in range(updates):
        try:
            step(x[update * batch:(update + 1) * batch], y[update * batch:(update + 1) * batch]).numpy()
        except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
            error = f"{type(exc).__name__}: {_oom_line(exc)}"
            break
        stamps.append(time.perf_counter())
        timeline.append({"update": update + 1, "seconds": stamps[-1] - stamps[0], "micro_batch": batch,
                         "effective_batch": batch, "oom_events": 0})
    done = len(stamps) - 1
    return {
        "completed": done == updates,
        "updates_done": done,
        "oom_events": 0 if error is None else 1,
        "error": error,
        "samples_per_second": batch * done / (stamps[-1] - stamps[0]) if done else None,
        # After the first (tracing) update, as for every other figure of this section.
        "steady_samples_per_second": batch * (done - 1) / (stamps[-1] - stamps[1]) if done > 1 else None,
        "timeline": timeline,
    }


def _governed(model, loss, optimizer, x, y, batch, updates, tf, checkpoint_dir=None) -> dict:
    from edgebatch.errors import TrainingError
    from edgebatch.governor import Governor, GovernorConfig, PressureReader
    from edgebatch.training import fit

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    governor = Governor(GovernorConfig(ceiling_batch=batch, effective_batch=batch))
    stamps, timeline, error = [time.perf_counter()], [], None

    def on_update(record) -> None:
        stamps.append(time.perf_counter())
        timeline.append({"update": record.update, "seconds": stamps[-1] - stamps[0],
                         "micro_batch": record.largest_micro_batch, "effective_batch": record.examples,
                         "oom_events": record.oom_events})

    report = None
    try:
        report = fit(model, dataset, loss=loss, optimizer=optimizer, effective_batch=batch, governor=governor,
                     pressure_reader=PressureReader("CPU:0"), max_updates=updates, on_update=on_update,
                     checkpoint_dir=checkpoint_dir, checkpoint_every_updates=2 if checkpoint_dir else None)
    except TrainingError as exc:
        error = str(exc)[:300]
    except Exception as exc:  # noqa: BLE001 - e.g. a MemoryError while tracing: fit crashed, report it
        error = f"fit raised {type(exc).__name__}: {str(exc)[:240]}"
    done = len(timeline)
    examples = [t["effective_batch"] for t in timeline]
    last_oom = max((i for i, t in enumerate(timeline) if t["oom_events"]), default=-1)
    steady = timeline[last_oom + 1:]
    steady_seconds = steady[-1]["seconds"] - timeline[last_oom]["seconds"] if steady and last_oom >= 0 else None
    if last_oom < 0 and done > 1:
        steady, steady_seconds = timeline[1:], timeline[-1]["seconds"] - timeline[0]["seconds"]
    return {
        # A resumed child's updates are numbered from the run's start (fit restores the count).
        "completed": error is None and bool(timeline) and timeline[-1]["update"] == updates,
        "restart": int(os.environ.get("EDGEBATCH_SUPERVISOR_RESTART", "0")),
        "updates_done": done,
        "oom_events": len(report.oom_events) if report else sum(t["oom_events"] for t in timeline),
        "error": error,
        "samples_per_second": sum(examples) / (stamps[-1] - stamps[0]) if done else None,
        # After the last update that met an OOM: the pace the governor settled at.
        "steady_samples_per_second": (sum(t["effective_batch"] for t in steady) / steady_seconds
                                      if steady and steady_seconds else None),
        "decisions": report.decisions if report else None,
        "timeline": timeline,
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
