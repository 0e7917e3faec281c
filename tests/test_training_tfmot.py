"""edgebatch.fit on TFMOT models (tf_keras): a pruned model's schedule advances once per optimizer
update whatever the split, its updates equal the plain loop's with UpdatePruningStep, pruned and
quantization-aware MobileNetV2 fine-tune governed updates, and a Keras 3 model in the same process
is unaffected. Each scenario runs in a fresh process (tests/support/tfmot_fit_run.py): importing
TFMOT changes what `tf.keras` means for the whole process."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# Never import TFMOT here (importorskip would): it changes what tf.keras means for every later test.
if importlib.util.find_spec("tensorflow_model_optimization") is None:
    pytest.skip("tensorflow-model-optimization is not installed", allow_module_level=True)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "tfmot_fit_run.py")


def run(scenario: str) -> dict:
    result = subprocess.run([sys.executable, SCRIPT, scenario], capture_output=True, text=True, timeout=600,
                            check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("@@result ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    return json.loads(lines[-1][len("@@result "):])


def test_a_pruned_model_steps_its_schedule_once_per_update_and_equals_the_plain_loop():
    found = run("pruned_exact")
    # 2 epochs of 4 updates; 3-example micro-batches after an injected OOM at micro-batch 1: the
    # forward passes alone would have counted every micro-step.
    assert found["updates"] == 8 and found["oom_events"] == 1 and found["micro_steps"] > 8 * 5
    assert found["pruning_step"] == found["plain_pruning_step"] == 8
    assert found["max_diff"] < 1e-5  # measured 5.6e-9
    assert 0.5 < found["sparsity"] <= 0.6 and found["exactness"] == "exact"
    assert found["keras_version"].startswith("3.") and found["keras3_model_module"] == "keras"
    assert found["keras3_updates"] == 4


def test_model_fit_with_micro_batching_steps_a_pruned_model_once_per_batch():
    found = run("keras_fit")
    # 2 epochs of 4 batches of 16 in pieces of 3: each piece's forward pass would add 1 (48 in
    # all, measured with the reset disabled); the batch's step is restored before every piece.
    assert found["pruning_step"] == found["plain_pruning_step"] == 8
    assert found["max_diff"] < 1e-5 and found["sparsity"] > 0.5  # measured 6e-8


@pytest.mark.slow
def test_pruned_and_qat_mobilenet_v2_fine_tune_governed_updates():
    found = run("mobilenet")
    pruned, qat = found["prune"], found["qat"]
    assert pruned["flavor"] == qat["flavor"] == "tf_keras"
    # 8 examples, updates of 4 in micro-batches of 2; the injected OOM (the 2nd micro-step) shrinks
    # them to 1: [2, (2 failed), 1, 1] then [1, 1, 1, 1], 8 micro-steps; the pruning step counts 2.
    assert pruned["updates"] == 2 and pruned["micro_steps"] == 8 and pruned["pruning_step"] == 2
    assert qat["updates"] == 2 and qat["pruning_step"] is None
    assert qat["exactness"] == "micro_batch_statistics"  # QAT's ranges (and BatchNormalization)
    assert pruned["losses_finite"] and qat["losses_finite"]
    assert found["keras_version"].startswith("3.") and found["keras3_model_module"] == "keras"
