"""edgebatch.settings.threads: the inter-op setting a profile was measured with, set and checked in training.

The decisions are pure and tested here directly; what TensorFlow does with the setting runs in a
new process each (a process's TensorFlow fixes its thread pools once, and this one's has started).
"""

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from edgebatch.errors import UsageError
from edgebatch.settings.threads import (
    mismatch,
    recorded_inter_op_threads,
    set_inter_op_threads,
    warn_on_mismatch,
)


def test_an_older_profile_counts_as_measured_with_tensorflows_pool():
    assert recorded_inter_op_threads({"strategy": "slow_start"}) == 0
    assert recorded_inter_op_threads(None) == 0
    assert recorded_inter_op_threads({"inter_op_threads": 1}) == 1


def test_mismatch_names_both_settings_and_the_call_that_fixes_it():
    assert mismatch(1, 1) is None
    line = mismatch(1, 0)
    assert "measured with 1 inter-op thread" in line and "TensorFlow's own inter-op pool" in line
    assert "edgebatch.set_inter_op_threads(1)" in line and "\n" not in line
    assert "set_inter_op_threads(0)" in mismatch(0, 2)


@pytest.mark.parametrize("threads", [-1, 1.0, "1", True, None])
def test_bad_thread_counts_are_refused_in_one_line(threads):
    with pytest.raises(UsageError, match=r"inter-op threads must be a whole number >= 0"):
        set_inter_op_threads(threads)


def test_no_warning_before_tensorflow_is_imported_or_without_recorded_settings(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    assert warn_on_mismatch(SimpleNamespace(search={"inter_op_threads": 1})) is None
    assert warn_on_mismatch(SimpleNamespace(max_batch=8)) is None


CHILD = textwrap.dedent(
    """
    import json, warnings
    from types import SimpleNamespace
    import tensorflow as tf
    import edgebatch
    from edgebatch.errors import UsageError
    from edgebatch.settings.threads import inter_op_threads_in_effect, warn_on_mismatch

    out = {"env_only": inter_op_threads_in_effect()}
    edgebatch.set_inter_op_threads(1)
    out["set"] = tf.config.threading.get_inter_op_parallelism_threads()
    tf.constant(1.0) + 1.0  # TensorFlow starts: its pools are fixed from here on
    edgebatch.set_inter_op_threads(1)  # the same setting again is fine
    try:
        edgebatch.set_inter_op_threads(0)
    except UsageError as error:
        out["late"] = str(error)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        governor = edgebatch.Governor.from_profile(
            SimpleNamespace(max_batch=64, safe_batch=48, memory_model=None, measure="process_peak",
                            search={"inter_op_threads": 0}),
            effective_batch=32)
    out["warned"] = [str(w.message) for w in caught]
    out["ceiling"] = governor.config.ceiling_batch
    out["same"] = warn_on_mismatch(SimpleNamespace(search={"inter_op_threads": 1}))
    print(json.dumps(out))
    """
)


def test_set_before_tensorflow_starts_refused_after_and_a_profile_measured_otherwise_warns():
    env = {**os.environ, "TF_NUM_INTEROP_THREADS": "3", "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["env_only"] == 3, "TF_NUM_INTEROP_THREADS counts until tf.config says otherwise"
    assert out["set"] == 1
    assert out["late"].startswith("TensorFlow has already started with 1 inter-op thread")
    assert "TF_NUM_INTEROP_THREADS=0" in out["late"] and "\n" not in out["late"]
    assert len(out["warned"]) == 1 and "measured with TensorFlow's own inter-op pool" in out["warned"][0]
    assert out["ceiling"] == 48
    assert out["same"] is None
