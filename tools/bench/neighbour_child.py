"""The two processes of the neighbour scenario (neighbour_bench.py starts both, in one memory cgroup).

`train`: edgebatch.fit on dense_wide (tests/models) at micro-batch CEILING, one JSON line per update
appended to PROGRESS (wall-clock `t`, so the bench can line updates up with the neighbour). Kinds:
- `governed`: a Governor with a process-RSS memory model from this process's own warm-up (peak RSS
  at CEILING/4 and CEILING, VmHWM reset between them), a PressureReader read every update, and a
  checkpoint every 2 updates in CKPT_DIR; the bench runs it under `edgebatch supervise`, so a child
  the kernel's OOM killer ends is restarted from its checkpoint. A restarted child reads the
  warm-up's model back from CKPT_DIR instead of measuring again.
- `static`: the same fit with the same warm-up and no pressure reader and no checkpoints, so the
  micro-batch stays at CEILING (only a Python-level OOM could move it; under a cgroup limit the
  kernel kills instead).
Both stop after the update during which STOP (a file) appeared, or at MAX_UPDATES.

`neighbour`: another job in the same cgroup: takes BYTES at RATE bytes/s (touching every page, so
it is resident and charged), prints "filled", holds the memory until its stdin closes, then exits.
The training raises its own oom_score_adj to 500, so the kernel's OOM killer ends the training,
not the neighbour: the neighbour stands for the job that has priority on the device.

    python neighbour_child.py train {governed|static} PROGRESS CEILING MAX_UPDATES STOP [CKPT_DIR]
    python neighbour_child.py neighbour BYTES RATE_BYTES_PER_SECOND
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests" / "models" / "dense_wide.py"
MODEL_FILE = "neighbour_memory_model.json"
CHECKPOINT_EVERY = 2
CHUNK = 16 * 1024**2


def _append(progress: Path, record: dict) -> None:
    with progress.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def _memory_model(fit, model, dataset, loss, optimizer, ceiling: int) -> dict:
    """fixed and per-sample bytes of this process's peak RSS, from a fit at ceiling/4 and one at ceiling.

    Three updates each: with oneDNN off and a fixed mmap threshold (neighbour_bench.py sets both) a
    step's tensors go back to the OS afterwards, so VmHWM after a reset is that size's own peak.
    """
    from edgebatch.sensors import process_peak_rss_bytes, reset_process_peak_rss

    peaks = {}
    for batch in (ceiling // 4, ceiling):
        reset_process_peak_rss()
        fit(model, dataset.take(3 * batch), loss=loss, optimizer=optimizer, effective_batch=batch, max_updates=3)
        peaks[batch] = process_peak_rss_bytes()
    small, large = ceiling // 4, ceiling
    per_sample = max(1.0, (peaks[large] - peaks[small]) / (large - small))
    return {"fixed_bytes": float(peaks[large] - per_sample * large), "per_sample_bytes": float(per_sample),
            "peaks": {str(b): p for b, p in peaks.items()}}


def train(kind: str, progress: Path, ceiling: int, max_updates: int, stop: Path, checkpoint_dir: str | None) -> int:
    import keras
    import numpy as np
    import tensorflow as tf

    from edgebatch.governor import Governor, GovernorConfig, PressureReader
    from edgebatch.training import fit
    from edgebatch.models.zoo import build_model, parse_model_spec

    # The OOM killer picks by resident size plus this; +500 makes it pick the training over a
    # neighbour of similar size (lowering the neighbour's instead needs a privilege this sandbox lacks).
    Path("/proc/self/oom_score_adj").write_text("500")
    restart = int(os.environ.get("EDGEBATCH_SUPERVISOR_RESTART", "0"))
    _append(progress, {"event": "start", "t": time.time(), "pid": os.getpid(), "restart": restart, "kind": kind})
    model = build_model(parse_model_spec(f"{MODEL}:build"))
    examples = ceiling * (max_updates + 8)
    rng = np.random.default_rng(0)
    x = rng.random((examples, 64), dtype=np.float32)
    y = rng.integers(0, 10, examples).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(1e-3)
    saved = Path(checkpoint_dir) / MODEL_FILE if checkpoint_dir else None
    if saved is not None and saved.exists():
        memory = json.loads(saved.read_text())  # a restart: the first child measured it
    else:
        memory = _memory_model(fit, model, dataset, loss, optimizer, ceiling)
        if saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(memory))
    _append(progress, {"event": "memory_model", "t": time.time(), **memory})

    class StopWhenAsked(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if stop.exists():
                self.model.stop_training = True

    def on_update(record) -> None:
        _append(progress, {"event": "update", "t": time.time(), "update": record.update, "examples": record.examples,
                           "micro_batch": record.largest_micro_batch, "oom_events": record.oom_events,
                           "pressure": record.pressure, "reason": record.reason,
                           "next_micro_batch": record.next_micro_batch, "restart": restart})

    if kind == "governed":
        # Memory is under test: on the shared 2-core machine steps run 2-7x slow for reasons of their
        # own (tests/support/pressure_run.py saw each such streak halve the micro-batch), so the
        # slow-step rule is off; every other setting is GovernorConfig's default.
        governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=ceiling,
                                           fixed_bytes=memory["fixed_bytes"], per_sample_bytes=memory["per_sample_bytes"],
                                           model_measure="process_peak", slow_step_factor=50.0))
        reader = PressureReader("CPU:0", every_n_updates=1, min_interval_seconds=0.0)
        fit(model, dataset, loss=loss, optimizer=optimizer, effective_batch=ceiling, governor=governor,
            pressure_reader=reader, checkpoint_dir=checkpoint_dir, checkpoint_every_updates=CHECKPOINT_EVERY,
            max_updates=max_updates, on_update=on_update, callbacks=[StopWhenAsked()])
    else:
        fit(model, dataset, loss=loss, optimizer=optimizer, effective_batch=ceiling, max_updates=max_updates,
            on_update=on_update, callbacks=[StopWhenAsked()])
    _append(progress, {"event": "end", "t": time.time(), "restart": restart})
    return 0


def neighbour(size: int, rate: float) -> int:
    blocks, taken, started = [], 0, time.perf_counter()
    while taken < size:
        block = bytearray(min(CHUNK, size - taken))
        for i in range(0, len(block), 4096):
            block[i] = 1  # touch every page: resident, so charged to the cgroup
        blocks.append(block)
        taken += len(block)
        ahead = taken / rate - (time.perf_counter() - started)
        if ahead > 0:
            time.sleep(ahead)
    print("filled", flush=True)
    sys.stdin.read()
    return 0


def main(argv: list[str]) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if argv[0] == "train":
        kind, progress, ceiling, max_updates, stop = argv[1], Path(argv[2]), int(argv[3]), int(argv[4]), Path(argv[5])
        return train(kind, progress, ceiling, max_updates, stop, argv[6] if len(argv) > 6 else None)
    if argv[0] == "neighbour":
        return neighbour(int(argv[1]), float(argv[2]))
    raise SystemExit(f"unknown mode {argv[0]!r}: use train or neighbour")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
