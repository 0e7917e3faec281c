"""`--optimize qat|prune`: the probe wraps a tf_keras model with TFMOT in its worker, and only there.

Importing tensorflow_model_optimization sets TF_USE_LEGACY_KERAS=1 (tf.keras becomes tf_keras for
the process: docs/tensorflow-memory.md#tfmot), so the probe's own process must never import it;
these tests check that in-process, beside a Keras 3 model that must keep working.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgebatch.cli import main
from edgebatch.errors import UsageError
from edgebatch.probing import probe
from edgebatch.profiles import model_key

HERE = Path(__file__).parent
REPO = HERE.parent
CNN = f"{HERE / 'models' / 'tf_keras_cnn.py'}:build"
# One reading of the answer: these tests check what TFMOT's wrappers do in a probe, not the answer's
# safety (tests/test_probe_real.py does), and each repeat is a new process with a TensorFlow import.
SMALL = {"device": "CPU:0", "memory_budget": "4GiB", "max_batch_limit": 32, "trial_seconds": 2.0, "answer_readings": 1}


def test_model_keys_without_optimize_are_the_committed_ones():
    profiles = sorted((REPO / "device_profiles").glob("*.json"))
    assert profiles
    for path in profiles:
        data = json.loads(path.read_text())
        model = data["model"]
        args = (model["name"], model["config_hash"], model["inputs"], model["precision"], model["optimizer"],
                data["versions"]["tensorflow"])
        assert model_key(*args) == model["key"], path.name
        assert model_key(*args, optimize="none") == model["key"], path.name
        qat = model_key(*args, optimize="qat")
        assert qat != model["key"] and f"-{model['optimizer']}-qat-tf" in qat
        assert model_key(*args, optimize="prune") not in (qat, model["key"])


def test_optimize_is_an_option_and_checked_before_any_worker(tmp_path):
    result = CliRunner().invoke(main, ["probe", "--help"])
    assert result.exit_code == 0 and "--optimize [none|qat|prune]" in result.output
    result = CliRunner().invoke(main, ["probe", "--optimize", "int8", "--no-save"])
    assert result.exit_code == 2 and "int8" in result.output
    with pytest.raises(UsageError, match="unknown --optimize 'int8'"):
        probe("mlp", optimize="int8", profiles_dir=tmp_path, save=False, **SMALL)


def _legacy_keras_state():
    return os.environ.get("TF_USE_LEGACY_KERAS"), "tensorflow_model_optimization" in sys.modules, "tf_keras" in sys.modules


@pytest.mark.slow
def test_qat_probe_of_a_tf_keras_cnn_leaves_this_process_keras_3(tmp_path):
    import keras
    import numpy as np
    import tensorflow as tf

    keras_model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    keras_model.compile(optimizer="sgd", loss="mse")
    before = (_legacy_keras_state(), keras.__name__, tf.keras.version())
    assert before[2].startswith("3.")

    profile = probe(CNN, optimize="qat", profiles_dir=tmp_path, save=False, **SMALL)

    assert profile.model["optimize"] == "qat"
    assert profile.model["key"].startswith("tf_keras_cnn-float32-adam-qat-tf")
    assert profile.model["name"] == "tf_keras_cnn" and profile.model["keras_flavor"] == "tf_keras"
    assert profile.versions["tensorflow_model_optimization"]
    assert [trial.batch for trial in profile.trials if trial.ok] and profile.max_batch == 32
    # This process: no TFMOT, no legacy switch, `keras` and `tf.keras` still Keras 3, its model still trains.
    assert (_legacy_keras_state(), keras.__name__, tf.keras.version()) == before
    assert type(keras_model).__module__.startswith("keras.")
    keras_model.fit(np.zeros((4, 4)), np.zeros((4, 2)), epochs=1, verbose=0)


@pytest.mark.slow
def test_pruned_probe_runs_its_steps_and_its_profile_is_found_again(tmp_path):
    lines = []
    first = probe(CNN, optimize="prune", profiles_dir=tmp_path, progress=lines.append, **SMALL)
    assert first.model["optimize"] == "prune" and "-adam-prune-tf" in first.model["key"]
    assert first.max_batch == 32 and all(trial.ok for trial in first.trials)
    assert any("TFMOT prune" in line for line in lines)
    # Another worker builds, wraps and hashes the same model: the same key, so the profile is reused.
    again = probe(CNN, optimize="prune", profiles_dir=tmp_path, progress=lines.append, **SMALL)
    assert again.model["key"] == first.model["key"] and again.created_at == first.created_at
    assert any(line.startswith("reusing cached profile") for line in lines)
    # Training code finds it too, by spec or by the unwrapped tf_keras model, without importing TFMOT.
    from edgebatch import cached_profile
    from edgebatch.models.zoo import build_base_model, parse_model_spec

    found = cached_profile(CNN, optimize="prune", profiles_dir=tmp_path)
    assert found is not None and found.model["key"] == first.model["key"]
    base = build_base_model(parse_model_spec(CNN), optimize="prune")
    assert cached_profile(base, optimize="prune", profiles_dir=tmp_path).model["key"] == first.model["key"]
    assert cached_profile(CNN, optimize="qat", profiles_dir=tmp_path) is None
    assert "tensorflow_model_optimization" not in sys.modules and "TF_USE_LEGACY_KERAS" not in os.environ


@pytest.mark.slow
def test_a_builtin_is_built_with_tf_keras_for_qat(tmp_path):
    profile = probe("mlp", optimize="qat", profiles_dir=tmp_path, save=False,
                    **{**SMALL, "max_batch_limit": 16})
    assert profile.model["name"] == "mlp" and profile.model["keras_flavor"] == "tf_keras"
    assert profile.model["key"].startswith("mlp-float32-adam-qat-tf")
    assert profile.max_batch == 16


@pytest.mark.slow
def test_a_keras_3_model_with_optimize_is_a_one_line_usage_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "edgebatch", "probe", "--model", f"{HERE / 'models' / 'dense_wide.py'}:build",
         "--optimize", "qat", "--memory-budget", "4GiB", "--device", "CPU:0", "--no-save",
         "--profiles-dir", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "needs a tf_keras model" in last and "Keras 3" in last and "tf_keras_mlp.py" in last
    assert "Traceback" not in result.stderr
    # A Keras 3 model object is refused before any worker starts; the caller imported Keras already.
    import keras

    with pytest.raises(UsageError, match="needs a tf_keras model .* Keras 3 Sequential"):
        probe(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), optimize="prune", save=False,
              profiles_dir=tmp_path, **SMALL)


@pytest.mark.slow
def test_wrapped_models_keep_their_loss_and_pruning_steps_run():
    """In a process of its own (it imports TFMOT): a softmax output stays a probability output
    through QAT's and pruning's wrappers, and pruned steps run only with UpdatePruningStep driven."""
    script = f"""
import sys
sys.path.insert(0, {str(HERE / 'models')!r})
import tf_keras_mlp
from edgebatch.probing.trial import TrialRunner, target_spec
from edgebatch.models.zoo import optimize_model, training_callbacks
for mode in ("qat", "prune"):
    model = optimize_model(tf_keras_mlp.build(), mode)
    assert target_spec(model).from_logits is False, mode
    runner = TrialRunner(model, callbacks=training_callbacks(model, mode))
    assert len(runner.run_steps(4, 3)) == 3
    assert runner.run_trial(8, 2, 1.0)["ok"], mode
bare = optimize_model(tf_keras_mlp.build(), "prune")
try:
    TrialRunner(bare).run_steps(4, 1)
except Exception as error:
    assert "UpdatePruningStep" in str(error), error
else:
    raise AssertionError("a pruned step without UpdatePruningStep ran")
print("checked")
"""
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0 and "checked" in result.stdout, result.stderr[-2000:]
