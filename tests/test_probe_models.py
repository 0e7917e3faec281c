"""Model specs the probe accepts: tf_keras functions, integer-token inputs, saved .keras files, objects."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from edgebatch.errors import UsageError
from edgebatch.probing import probe
from edgebatch.models.zoo import parse_model_spec

HERE = Path(__file__).parent
MIB = 1024**2


def test_spec_parsing_needs_no_tensorflow(tmp_path):
    (tmp_path / "m.py").write_text("def build(): pass\n")
    assert parse_model_spec("mlp").kind == "builtin"
    assert parse_model_spec(f"{tmp_path}/m.py:build").function == "build"
    with pytest.raises(UsageError, match="not a Python function name"):
        parse_model_spec(f"{tmp_path}/m.py:not-a-name")
    with pytest.raises(UsageError, match="is not a .py file"):
        parse_model_spec(f"{tmp_path}/m.txt:build")


@pytest.mark.slow
def test_tf_keras_model_from_a_function(tmp_path):
    # One reading of the answer (here and below): these check how models load, not the answer's safety.
    profile = probe(f"{HERE / 'models' / 'tf_keras_mlp.py'}:build", device="CPU:0", memory_budget="4GiB",
                    max_batch_limit=64, profiles_dir=tmp_path, save=False, answer_readings=1)
    assert profile.model["keras_flavor"] == "tf_keras"
    assert profile.max_batch == 64
    assert profile.model["inputs"] == [{"shape": [32], "dtype": "float32"}]


@pytest.mark.slow
def test_integer_token_model_and_a_keras_model_object(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((16,), dtype="int32"), keras.layers.Embedding(50, 8),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1, activation="sigmoid")],
                             name="tokens")
    profile = probe(model, device="CPU:0", memory_budget="4GiB", max_batch_limit=32, profiles_dir=tmp_path, save=False,
                    answer_readings=1)
    assert profile.max_batch == 32
    assert profile.model["inputs"] == [{"shape": [16], "dtype": "int32"}]


@pytest.mark.slow
def test_a_model_that_fails_for_another_reason_stops_the_probe_with_its_message(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def build():\n    raise RuntimeError('my model is broken')\n")
    with pytest.raises(Exception, match="my model is broken"):
        probe(f"{bad}:build", device="CPU:0", memory_budget="4GiB", profiles_dir=tmp_path, save=False)


def processes_with_marker(marker):
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(environ.parent.name)
        except OSError:
            pass
    return found


def _why_it_did_not_stop(process, marker, seen) -> str:
    """What a probe that outlived its signal's 60 s was doing: where its threads were (SIGABRT makes
    faulthandler print them), or, where it had exited, that something else held its pipes open.
    The test hung once in six suite runs at 941526c, and in 2 of 19 runs of this module on
    2026-12-06 (AMD EPYC; [sigterm] once, [ctrl-c] once). The second dump showed why: the stopping
    probe waited for ever in Worker.close, in Popen.wait(), on a lock that the interrupt had left
    held inside an earlier Popen.poll() (edgebatch/probing/reaping.py says how, and why a signal
    sent on a trial's line meets that window). Workers and the fork server are now killed and
    reaped without that lock; tests/test_probe_worker_faults.py holds the lock as the interrupt
    leaves it."""
    exited = process.poll()
    if exited is None:
        process.send_signal(signal.SIGABRT)
    try:
        _, rest = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        _, rest = process.communicate()
    state = (f"it had exited with {exited}, but its output pipes stayed open" if exited is not None
             else "it was still running; aborted, its threads were")
    return (f"the probe did not stop within 60 s of the signal: {state}:\n{rest[-6000:]}\nprocesses left: "
            f"{processes_with_marker(marker)}\nbefore the signal:\n{''.join(seen)[-2000:]}")


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "exit_code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                           (signal.SIGTERM, 143, "terminated (SIGTERM)")],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_workers_and_writes_nothing(tmp_path, signum, exit_code, said, terminal_signals):
    marker = f"EDGEBATCH_TEST_MARK={uuid.uuid4()}"
    # PYTHONFAULTHANDLER: a probe that does not stop is aborted and prints where each thread was.
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1], "PYTHONFAULTHANDLER": "1"}
    args = [sys.executable, "-m", "edgebatch", "probe", "--model", "small_cnn", "--memory-budget", "3GiB",
            "--device", "CPU:0", "--profiles-dir", str(tmp_path)]
    process = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                               preexec_fn=terminal_signals)
    deadline = time.time() + 300
    seen = []
    for line in process.stderr:  # wait until trials are running
        seen.append(line)
        if (" ok " in line and "batch" in line) or time.time() > deadline:
            break
    process.send_signal(signum)
    try:
        _, rest = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(_why_it_did_not_stop(process, marker, seen))
    assert process.returncode == exit_code, "".join(seen) + rest
    assert f"edgebatch: {said}; nothing was written" in rest and "Traceback" not in rest
    assert list(tmp_path.iterdir()) == []
    time.sleep(1)
    assert processes_with_marker(marker) == [], "probe workers outlived the stopped probe"


def test_a_float16_model_trials_with_a_loss_scale_optimizer():
    import keras

    from edgebatch.probing.trial import TrialRunner

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), keras.layers.Dense(3)])
    finally:
        keras.mixed_precision.set_global_policy(previous)
    runner = TrialRunner(model, optimizer="sgd")
    assert runner.loss_scaled and type(runner.optimizer).__name__ == "LossScaleOptimizer"
    before = [w.copy() for w in model.get_weights()]
    runner.run_steps(4, 2)
    assert any(abs(a - b).max() > 0 for a, b in zip(model.get_weights(), before))  # unscaled, finite steps
    plain = TrialRunner(keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)]), optimizer="sgd")
    assert not plain.loss_scaled
