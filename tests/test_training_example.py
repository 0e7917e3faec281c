"""examples/finetune_digits.py runs as documented (it is the first thing a new user tries)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_finetune_digits_runs_and_recovers_from_injected_ooms(tmp_path):
    pytest.importorskip("sklearn")
    env = dict(os.environ, EDGEBATCH_PROFILES=str(tmp_path / "no_profiles"))  # no cached profile: fallback path
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "finetune_digits.py"), "--epochs", "1", "--inject-oom", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "governor from explicit numbers" in done.stdout
    assert "1 OOM(s)" in done.stdout
    accuracy = float(done.stdout.split("test accuracy ")[1].split(";")[0])
    assert accuracy > 0.5  # one epoch of a working loop is far above chance (0.1)


def test_finetune_digits_rejects_a_bad_flag_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "finetune_digits.py"), "--inject-oom", "two"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert "error: --inject-oom" in done.stderr and "'two'" in done.stderr and "Traceback" not in done.stderr
