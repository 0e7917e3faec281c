"""The edgebatch command: exit codes, one-line errors, profile commands, one end-to-end probe."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from profile_factory import make_profile

from edgebatch.cli import main
from edgebatch.profiles import save_profile


@pytest.fixture
def runner():
    return CliRunner()


def test_help_is_instant_and_imports_no_tensorflow():
    code = "import sys; from edgebatch.cli import main; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
    help_run = subprocess.run([sys.executable, "-m", "edgebatch", "probe", "--help"], capture_output=True, text=True)
    assert help_run.returncode == 0
    assert "--memory-budget" in help_run.stdout and "--seq-lens" in help_run.stdout
    print(f"import + help: {time.perf_counter() - started:.2f} s")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["probe", "--model", "no_such_model"], "unknown model 'no_such_model'"),
        (["probe", "--model", "missing.keras"], "does not exist"),
        (["probe", "--model", "nofile.py:build"], "does not exist"),
        (["probe", "--memory-budget", "12XB"], "unknown unit"),
        (["probe", "--memory-budget", "lots"], "cannot read memory size"),
        (["probe", "--device", "TPU:0"], "unknown device"),
        (["probe", "--headroom", "1.5"], "--headroom"),
        (["probe", "--tolerance", "0"], "--tolerance"),
        (["probe", "--precision", "int4"], "--precision"),
        (["probe", "--start", "0"], "--start"),
        (["probe", "--max-batch", "4", "--multiple", "8", "--memory-budget", "1GiB"], "--max-batch"),
        (["probe", "--model", "mobilenet_v2", "--seq-lens", "64"], "fixed input shape"),
        (["probe", "--model", "transformer_tiny", "--seq-lens", "64,x"], "--seq-lens expects token counts"),
        (["probe", "--model", "transformer_tiny", "--seq-lens", "0,64"], "--seq-lens must be 1 token or more"),
        (["probe", "--model", "transformer_tiny", "--seq-lens", "64,1024"], "at most 512 tokens"),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(runner, args, fragment, tmp_path):
    result = runner.invoke(main, args + ["--profiles-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == [], "nothing is written on bad input"


def test_profile_list_show_validate(runner, tmp_path):
    profile = make_profile()
    path = save_profile(profile, tmp_path)
    listed = runner.invoke(main, ["profile", "list", "--profiles-dir", str(tmp_path)])
    assert listed.exit_code == 0
    assert f"max {profile.max_batch}, safe {profile.safe_batch}" in listed.output
    shown = runner.invoke(main, ["profile", "show", str(path), "--json"])
    assert shown.exit_code == 0
    assert json.loads(shown.output)["max_batch"] == profile.max_batch
    valid = runner.invoke(main, ["profile", "validate", str(tmp_path)])
    assert valid.exit_code == 0 and ": ok" in valid.output


def test_validate_reports_a_corrupt_profile_with_exit_1(runner, tmp_path):
    save_profile(make_profile(), tmp_path)
    (tmp_path / "broken.json").write_text('{"schema_version": 1, "max_batch": ')
    result = runner.invoke(main, ["profile", "validate", str(tmp_path)])
    assert result.exit_code == 1
    assert "broken.json" in result.output and "INVALID" in result.output
    assert "Traceback" not in result.output


def test_show_missing_file_is_exit_1_naming_the_file(runner, tmp_path):
    result = runner.invoke(main, ["profile", "show", str(tmp_path / "nope.json")])
    assert result.exit_code == 1
    assert "nope.json" in result.output


def test_devices_json_without_tensorflow(runner):
    result = runner.invoke(main, ["devices", "--json", "--no-tensorflow"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["cpu"]["ram_total_bytes"] > 0
    assert info["cpu"]["cores_logical"] >= 1


def test_devices_holds_back_tensorflows_native_log():
    """`import tensorflow` writes absl/oneDNN/cuInit lines to fd 2 on this host kind; the table is
    what `edgebatch devices` prints, and nothing on stderr."""
    done = subprocess.run([sys.executable, "-m", "edgebatch", "devices"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "TensorFlow  " in done.stdout and "not inspected" not in done.stdout
    assert done.stderr == ""


def _devices_that_log(gpus, tf_gpus):
    def describe_devices(include_tensorflow=True):
        os.write(2, b"I0000 native line from the runtime\n")
        return {"cpu": {}, "gpus": gpus, "nvml": {}, "tensorflow": {"version": "x", "gpu_devices": tf_gpus}}
    return describe_devices


@pytest.mark.parametrize(("args", "gpus", "tf_gpus", "shown"), [
    ([], [], [], False),
    (["--verbose"], [], [], True),
    ([], [{"index": 0}], ["GPU:0"], False),
    ([], [{"index": 0}], [], True),  # TensorFlow misses a GPU NVML sees: its log says why
])
def test_devices_shows_the_native_log_only_where_it_is_wanted(monkeypatch, capfd, args, gpus, tf_gpus, shown):
    import edgebatch.sensors

    monkeypatch.setattr(edgebatch.sensors, "describe_devices", _devices_that_log(gpus, tf_gpus))
    result = CliRunner().invoke(main, ["devices", "--json", *args])
    assert result.exit_code == 0, result.output
    assert ("native line from the runtime" in result.output) is shown
    assert "native line" not in capfd.readouterr().err  # held back from the real fd 2 either way


@pytest.mark.slow
def test_probe_json_end_to_end_in_a_subprocess(tmp_path):
    env = {**os.environ, "EDGEBATCH_PROFILES": str(tmp_path)}
    # One reading of the answer: each more is a new process with a TensorFlow import (~8 s), and
    # what this checks is the command's output and cache, not the answer.
    args = [sys.executable, "-m", "edgebatch", "probe", "--model", "mlp", "--memory-budget", "4GiB",
            "--max-batch", "256", "--device", "CPU:0", "--json", "--answer-readings", "1"]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    profile = json.loads(done.stdout)  # stdout is only the profile
    assert profile["max_batch"] == 256
    assert profile["model"]["name"] == "mlp"
    assert "batch    256  ok" in done.stderr  # the live trial lines go to stderr
    saved = list(tmp_path.glob("*.json"))
    assert len(saved) == 1
    # The second run finds the cached profile instead of probing again.
    again = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0
    assert "reusing cached profile" in again.stderr
    assert json.loads(again.stdout)["created_at"] == profile["created_at"]


def test_profile_plot_writes_a_png(runner, tmp_path):
    path = save_profile(make_profile(), tmp_path)
    out = tmp_path / "plots" / "p.png"
    result = runner.invoke(main, ["profile", "plot", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.parent.glob("*.tmp.png"))
    bad = runner.invoke(main, ["profile", "plot", str(path), "-o", str(tmp_path / "p.jpg")])
    assert bad.exit_code == 2 and ".png" in bad.output


def test_a_plot_stopped_mid_save_leaves_no_temporary_and_no_picture(runner, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def stopped_mid_save(self, target, **kwargs):
        Path(target).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt  # what Ctrl-C, or SIGTERM under handle_errors (Terminated), raises

    path = save_profile(make_profile(), tmp_path)
    monkeypatch.setattr(Figure, "savefig", stopped_mid_save)
    out = tmp_path / "plots" / "p.png"
    result = runner.invoke(main, ["profile", "plot", str(path), "-o", str(out)])
    assert result.exit_code == 130 and "interrupted" in result.output
    assert list(out.parent.iterdir()) == []
