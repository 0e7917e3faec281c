"""A governed training run while another process takes memory (used by test_governor_real.py).

Runs inside a memory cgroup made by the test. At update HOG_AT it starts a second process that
fills the cgroup to ~95% of its limit; HOLD updates after the governor first shrinks, the hog is
stopped. Prints one JSON line per update: update, micro_batches, pressure, reason.

usage: python pressure_run.py LIMIT_BYTES
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HOG_AT = 8
HOLD = 12
UPDATES = 90
HOG = """
import sys
size = int(sys.argv[1])
block = bytearray(size)
for i in range(0, size, 4096):
    block[i] = 1  # touch every page so it is resident and charged to the cgroup
print("filled", flush=True)
sys.stdin.read()
"""


def cgroup_usage_bytes():
    from edgebatch.sensors import read_cgroup_memory

    memory = read_cgroup_memory()
    return memory.usage_bytes


def main():
    limit_bytes = int(sys.argv[1])
    import keras
    import numpy as np
    import tensorflow as tf

    from edgebatch.governor import Governor, GovernorConfig, PressureReader
    from edgebatch.sensors import process_peak_rss_bytes
    from edgebatch.training import fit

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * UPDATES, 32)).astype("float32")
    y = rng.integers(0, 4, size=(64 * UPDATES,)).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
    # The governor judges a room reading by a memory model in the host sensor's measure (process
    # RSS): a one-point line from a short warm-up run's peak RSS at 64, ~4 KiB a sample on top.
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    fit(model, dataset.take(64 * 3), loss=loss, optimizer=keras.optimizers.SGD(0.01), effective_batch=64)
    per_sample_bytes = 4096.0
    fixed_bytes = process_peak_rss_bytes() - 64 * per_sample_bytes
    governor = Governor(GovernorConfig(ceiling_batch=64, effective_batch=64, grow_patience=3, cooldown_updates=3,
                                       fixed_bytes=fixed_bytes, per_sample_bytes=per_sample_bytes,
                                       model_measure="process_peak",
                                       # Memory is under test: on a shared 2-core machine steps run
                                       # 2-7x slow for reasons of their own (seen: 7.0x, 2.8x, 2.4x
                                       # after the hog left, each halving the micro-batch).
                                       slow_step_factor=50.0))
    reader = PressureReader(device="CPU:0", every_n_updates=1, min_interval_seconds=0.0)
    state = {"hog": None, "shrunk_at": None}

    def on_update(record):
        if record.update == HOG_AT:
            room = int(0.95 * limit_bytes) - cgroup_usage_bytes()
            state["hog"] = subprocess.Popen([sys.executable, "-c", HOG, str(room)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, text=True)
            state["hog"].stdout.readline()  # wait until the memory is really taken
        if state["shrunk_at"] is None and record.next_micro_batch < 64:
            state["shrunk_at"] = record.update
        if state["hog"] is not None and state["shrunk_at"] is not None and record.update >= state["shrunk_at"] + HOLD:
            state["hog"].stdin.close()
            state["hog"].wait()
            state["hog"] = None
            print(json.dumps({"event": "hog_stopped", "update": record.update}), flush=True)
        print(json.dumps({"update": record.update, "micro_batches": list(record.micro_batches),
                          "pressure": record.pressure, "reason": record.reason,
                          "next_micro_batch": record.next_micro_batch}), flush=True)

    fit(model, dataset, loss=loss, optimizer=keras.optimizers.SGD(0.01), effective_batch=64, governor=governor,
        pressure_reader=reader, on_update=on_update)
    if state["hog"] is not None:
        state["hog"].stdin.close()


if __name__ == "__main__":
    main()
