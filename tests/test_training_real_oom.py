"""A real out-of-memory (RLIMIT_AS), not an injected one: fit recovers and ends with the reference weights.

The subprocess imports TensorFlow, builds a model whose hidden layer is 300k wide, then caps its
own address space at its current size plus BUDGET_MIB. At 256 examples the first activation alone
is 293 MiB, more than the whole cap, so the very first allocation of the step fails, cleanly, in
TensorFlow's allocator, with the cap's room still free. After the governor shrinks by 1/16, 16
examples fit with room to spare (activations of 18 MiB; 4 inputs keep the kernel, its gradient
and its accumulator at 4.6 MiB each: with 32 inputs they took 37 MiB each, and 16 sometimes
failed too; 24 runs of 24 passed here after the change).

The failure must come early. With 100k units and a 200 MiB cap, 256 failed late in the backward
pass with a few MiB left, and whatever allocated next outside TensorFlow's allocator (Eigen's
buffers, a thread) threw std::bad_alloc on a thread with no handler: the process aborted
(exit -6) in 3 runs of 10 here, and in CI. Nothing in-process can recover from that.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BUDGET_MIB = 250
WIDE_UNITS = 300_000
SHRINK = 1 / 16

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np
    import keras, tensorflow as tf
    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit

    sys.path.insert(0, sys.argv[3])
    from test_training_real_oom import make_problem

    model, x, y = make_problem()
    model(x[:1])  # start TensorFlow's runtime before measuring what is left

    def vm_bytes():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))

    cap = vm_bytes() + int(float(sys.argv[2]) * 2**20)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    governor = Governor(GovernorConfig(ceiling_batch=256, effective_batch=256, oom_shrink_factor=float(sys.argv[4])))
    report = fit(model, tf.data.Dataset.from_tensor_slices((x, y)), loss=keras.losses.MeanSquaredError(),
                 optimizer=keras.optimizers.SGD(0.01), effective_batch=256, governor=governor)
    np.savez(sys.argv[1] + ".npz", *model.get_weights())
    with open(sys.argv[1] + ".json", "w") as out:
        json.dump(report.to_dict(), out)
    """
)


def make_problem():
    """The wide model (seeded, so parent and child build the same) and 512 regression examples."""
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    y = rng.normal(size=(512, 1)).astype("float32")
    init = keras.initializers.GlorotUniform(seed=5)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(WIDE_UNITS, activation="relu", kernel_initializer=init),
        keras.layers.Dense(1, kernel_initializer=init),
    ])
    return model, x, y


@pytest.mark.slow
def test_real_oom_under_rlimit_as_recovers_exactly(tmp_path):
    tf = pytest.importorskip("tensorflow")
    import keras

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    # oneDNN off: with TensorFlow's default oneDNN kernels, running out of address space while a
    # kernel is being set up can SEGFAULT instead of raising
    # (docs/tensorflow-memory.md#onednn-convolutions-can-crash; seen here too, exit -11, in 3 runs
    # out of 4); without them the OOM is a clean ResourceExhaustedError and instant.
    # Fewer malloc arenas: each reserves 64 MiB of address space, which would blur the cap.
    env = dict(os.environ, PYTHONPATH=str(REPO), MALLOC_ARENA_MAX="2", TF_ENABLE_ONEDNN_OPTS="0")
    out = tmp_path / "result"
    done = subprocess.run([sys.executable, str(script), str(out), str(BUDGET_MIB), str(REPO / "tests"), str(SHRINK)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(Path(f"{out}.json").read_text())
    events = report["oom_events"]
    assert events, "the cap did not cause an OOM: the test proves nothing"
    assert events[0]["micro_batch"] == 256 and not events[0]["injected"]
    assert "OOM" in events[0]["message"] or "ResourceExhausted" in events[0]["message"]
    assert not any(event["gave_up"] for event in events)
    assert report["examples_seen"] == 512
    assert [sum(update["micro_batches"]) for update in report["updates"]] == [256, 256]

    model, x, y = make_problem()
    optimizer, loss = keras.optimizers.SGD(0.01), keras.losses.MeanSquaredError()
    for start in (0, 256):
        with tf.GradientTape() as tape:
            value = loss(y[start:start + 256], model(x[start:start + 256], training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
    with np.load(f"{out}.npz") as saved:
        got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(got, model.get_weights()))
    assert diff < 1e-4
