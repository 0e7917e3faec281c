"""Which resident peak does a traced training step get? New processes, one step reading at a time.

docs/probe-evidence.md ("Why: a step's peak is decided by the allocator's growth in its first
step") says what this shows: with
TensorFlow's default oneDNN build on CPU, large tensors come from a pooling allocator that keeps what
it grew (the resident size after a step equals the step's peak), and how far it grows depends on the
order the step's allocations happen in, which is fixed when the step is traced. So every step of one
traced function reads the same peak, and a new process (or a re-trace) can read a higher one,
in steps of about one activation-sized tensor.

Each process builds the model, traces the step at batch 1, and runs STEPS steps at BATCH, resetting
the resident peak (VmHWM) before each step; with --functions F it traces F separate functions one
after another in the same process. Per step it records the peak and the resident size after the
step. Settings compare environments (each a list of VAR=VALUE, "as-is" for none):

    python tools/allocator_modes.py text_cnn 799 --processes 8
    python tools/allocator_modes.py text_cnn 799 --processes 5 \\
        --setting TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 --setting TF_ENABLE_ONEDNN_OPTS=0 --out modes.json

Integer inputs get random token ids (as the probe's trials and tests/support/fresh_step.py feed them);
one inter-op thread, as `edgebatch probe` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import statistics
import sys
import time

MIB = 2**20


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def child(spec: str, batch: int, steps: int, functions: int) -> None:
    """One process: `functions` traced steps, `steps` readings each; prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    from edgebatch.zoo import build_model, parse_model_spec

    model = build_model(parse_model_spec(spec), "float32")
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x_shape = tuple(model.inputs[0].shape[1:])
    dtype = model.inputs[0].dtype if isinstance(model.inputs[0].dtype, str) else model.inputs[0].dtype.name
    classes = model.outputs[0].shape[-1]
    if dtype.startswith("int"):
        vocabulary = next(layer.input_dim for layer in model.layers if type(layer).__name__ == "Embedding")
        x = tf.random.uniform((batch, *x_shape), 1, vocabulary, dtype)
    else:
        x = tf.random.uniform((batch, *x_shape))
    y = tf.random.uniform((batch,), 0, classes, tf.int32)

    def traced_step():
        @tf.function(input_signature=[tf.TensorSpec((None, *x_shape), dtype), tf.TensorSpec((None,), tf.int32)])
        def train(inputs, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, tf.cast(model(inputs, training=True), tf.float32))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return train

    readings = []
    for _ in range(functions):
        train = traced_step()
        train(x[:1], y[:1]).numpy()
        rows = []
        for _ in range(steps):
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")  # VmHWM back to the current resident size
            started = time.perf_counter()
            train(x, y).numpy()
            rows.append({"peak_bytes": _status_bytes("VmHWM"), "resident_after_bytes": _status_bytes("VmRSS"),
                         "step_seconds": round(time.perf_counter() - started, 4)})
        readings.append(rows)
    print("@@modes " + json.dumps(readings))


def run_process(spec: str, batch: int, steps: int, functions: int, setting: dict[str, str]) -> list | None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", **setting)
    out = subprocess.run([sys.executable, __file__, "--child", spec, str(batch), str(steps), str(functions)],
                         capture_output=True, text=True, env=env, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("@@modes ")]
    return json.loads(lines[-1][len("@@modes "):]) if lines else None


def parse_setting(text: str) -> dict[str, str]:
    if text == "as-is":
        return {}
    pairs = [part.split("=", 1) for part in text.split(",")]
    if any(len(pair) != 2 for pair in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: expected VAR=VALUE[,VAR=VALUE...] or as-is")
    return dict(pairs)


def summary_line(name: str, processes: list[list | None]) -> str:
    """Per process, each function's last peak in MiB, and whether memory stayed after the step."""
    cells = []
    kept = []
    for readings in processes:
        if readings is None:
            cells.append("failed")
            continue
        cells.append("/".join(f"{rows[-1]['peak_bytes'] / MIB:.0f}" for rows in readings))
        kept.extend(rows[-1]["resident_after_bytes"] >= 0.98 * rows[-1]["peak_bytes"] for rows in readings)
    held = f"{sum(kept)}/{len(kept)} functions keep their peak resident after the step"
    seconds = [row["step_seconds"] for readings in processes if readings for rows in readings for row in rows[1:]]
    step = f"; median step {statistics.median(seconds):.3f} s" if seconds else ""
    return f"{name}: {', '.join(cells)} MiB ({held}{step})"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="zoo name or path/to/file.py:function")
    parser.add_argument("batch", type=int)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--functions", type=int, default=1, help="traced functions per process, one after another")
    parser.add_argument("--setting", type=parse_setting, action="append",
                        help="environment for one arm, VAR=VALUE[,VAR=VALUE]; 'as-is' always runs first")
    parser.add_argument("--out", help="write every reading as JSON here")
    args = parser.parse_args()
    settings = [{}] + [setting for setting in args.setting or [] if setting]
    results = []
    for setting in settings:
        name = ",".join(f"{key}={value}" for key, value in setting.items()) or "as-is"
        processes = []
        for index in range(args.processes):
            processes.append(run_process(args.model, args.batch, args.steps, args.functions, setting))
            print(f"  {name}: process {index + 1}/{args.processes} done", file=sys.stderr, flush=True)
        print(summary_line(name, processes), flush=True)
        results.append({"setting": setting, "processes": processes})
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"model": args.model, "batch": args.batch, "steps": args.steps, "functions": args.functions,
                       "results": results}, handle, indent=1)


if __name__ == "__main__":
    main()
