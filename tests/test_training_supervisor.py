"""The supervisor with tiny pure-Python children: restarts, what the next child is told, signals, CLI.

The real-TensorFlow proof (weights after real SIGKILLs) is test_training_supervisor_kill.py.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgebatch
from edgebatch.cli import main
from edgebatch.errors import UsageError
from edgebatch.training import supervise
from edgebatch.training.hard_failure import ENV_HARD_FAILURE_MICRO_BATCH, MARKER_FILE
from write_interrupts import stopped_before_renaming_to

REPO = Path(__file__).resolve().parents[1]

# Records what it was told, writes a running micro-batch like fit would (halving per start), then
# dies by the signal its plan lists for this start, or exits with the plan's last code.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path

    work, checkpoint_dir = Path(sys.argv[1]), Path(sys.argv[2])
    plan = json.loads(sys.argv[3])
    start = len(list(work.glob("start-*")))
    (work / f"start-{start}").write_text(json.dumps({
        "hard_failure": os.environ.get("EDGEBATCH_HARD_FAILURE_MICRO_BATCH"),
        "restart": os.environ.get("EDGEBATCH_SUPERVISOR_RESTART"),
        "marker_left": (checkpoint_dir / "edgebatch_running_micro_batch.json").exists(),
    }))
    step = plan[min(start, len(plan) - 1)]
    if step.get("write_marker", True):
        checkpoint_dir.mkdir(exist_ok=True)
        (checkpoint_dir / "edgebatch_running_micro_batch.json").write_text(json.dumps({"micro_batch": 64 >> start}))
    if "signal" in step:
        os.kill(os.getpid(), getattr(signal, step["signal"]))
    sys.exit(step.get("exit", 0))
    """
)


@pytest.fixture
def child(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    work, checkpoint_dir = tmp_path / "work", tmp_path / "ckpt"
    work.mkdir()

    def run(plan, **kwargs):
        argv = [sys.executable, str(script), str(work), str(checkpoint_dir), json.dumps(plan)]
        report = supervise(argv, checkpoint_dir=checkpoint_dir, progress=None, **kwargs)
        starts = [json.loads((work / f"start-{i}").read_text()) for i in range(len(list(work.glob("start-*"))))]
        return report, starts

    run.checkpoint_dir = checkpoint_dir
    return run


def test_killed_children_restart_and_are_told_the_running_micro_batch(child):
    report, starts = child([{"signal": "SIGKILL"}, {"signal": "SIGABRT"}, {"exit": 0}])
    assert report.exit_code == 0 and report.restarts == 2
    assert report.signals == ("SIGKILL", "SIGABRT")
    assert [run.running_micro_batch for run in report.runs] == [64, 32, None]
    assert [run.restarted for run in report.runs] == [True, True, False]
    assert [s["hard_failure"] for s in starts] == [None, "64", "32"]
    assert [s["restart"] for s in starts] == ["0", "1", "2"]
    assert not any(s["marker_left"] for s in starts)  # cleared before every start
    assert report.reason == "the child finished (exit code 0)"


def test_normal_exit_code_passes_through_and_is_not_restarted(child):
    report, starts = child([{"exit": 3}])
    assert report.exit_code == 3 and report.restarts == 0 and len(starts) == 1
    assert report.runs[0].running_micro_batch is None  # only read after a death by signal


def test_restarts_are_bounded(child):
    report, starts = child([{"signal": "SIGABRT"}], max_restarts=2)
    assert len(starts) == 3 and report.restarts == 2
    assert report.exit_code == 128 + signal.SIGABRT
    assert report.reason == "the child died by SIGABRT and all 2 restart(s) are spent"
    assert "signals: SIGABRT, SIGABRT, SIGABRT" in report.summary()


def test_a_stale_marker_or_inherited_value_is_never_passed_on(child, monkeypatch):
    monkeypatch.setenv(ENV_HARD_FAILURE_MICRO_BATCH, "7")  # from some earlier run
    child.checkpoint_dir.mkdir()
    (child.checkpoint_dir / MARKER_FILE).write_text(json.dumps({"micro_batch": 99}))
    # The first child dies before it records a micro-batch (say, while importing TensorFlow).
    report, starts = child([{"signal": "SIGKILL", "write_marker": False}, {"exit": 0}])
    assert report.runs[0].running_micro_batch is None
    assert [s["hard_failure"] for s in starts] == [None, None]


def test_a_child_stopped_by_sigterm_from_outside_is_not_restarted(child):
    report, starts = child([{"signal": "SIGTERM"}, {"exit": 0}])
    assert len(starts) == 1 and report.exit_code == 128 + signal.SIGTERM
    assert "not a crash" in report.reason


def test_bad_arguments_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="list of arguments.*got 'python train.py'"):
        supervise("python train.py")
    with pytest.raises(UsageError, match="empty"):
        supervise([])
    with pytest.raises(UsageError, match="max_restarts must be an integer >= 0, got -1"):
        supervise(["true"], max_restarts=-1)
    with pytest.raises(UsageError, match="cannot start '/nonexistent/train'"):
        supervise(["/nonexistent/train"], progress=None)


def test_public_entry_points():
    assert edgebatch.supervise is supervise
    assert "supervise" in edgebatch.__all__


def test_cli_exit_code_and_report():
    runner = CliRunner()
    result = runner.invoke(main, ["supervise", "--max-restarts", "1", "--", sys.executable, "-c",
                                  "import sys; sys.exit(4)"])
    assert result.exit_code == 4
    assert "exit code 4; 0 restart(s) of at most 1; signals: none" in result.output
    missing = runner.invoke(main, ["supervise"])
    assert missing.exit_code == 2 and "Missing argument" in missing.output
    bad = runner.invoke(main, ["supervise", "--", "/nonexistent/train"])
    assert bad.exit_code == 2 and "cannot start '/nonexistent/train'" in bad.output


def test_cli_writes_the_report_as_json(tmp_path):
    path = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["supervise", "--report", str(path), "--", sys.executable, "-c",
                                       "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert result.exit_code == 128 + signal.SIGKILL
    report = json.loads(path.read_text())
    assert report["exit_code"] == 137 and report["restarts"] == 3 and report["signals"] == ["SIGKILL"] * 4
    assert [run["restarted"] for run in report["runs"]] == [True, True, True, False]
    ran = tmp_path / "ran"
    nowhere = CliRunner().invoke(main, ["supervise", "--report", str(tmp_path / "missing" / "r.json"), "--",
                                        "touch", str(ran)])
    assert nowhere.exit_code == 2 and "its folder does not exist" in nowhere.output
    assert not ran.exists()  # refused before the command ran


def test_a_report_write_stopped_midway_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    stopped_before_renaming_to(path, monkeypatch)
    result = CliRunner().invoke(main, ["supervise", "--report", str(path), "--", sys.executable, "-c", "pass"])
    assert result.exit_code == 130 and "interrupted" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_cli_forwards_stop_signals_and_does_not_restart(tmp_path, signum):
    ready, got = tmp_path / "ready", tmp_path / "got-signal"
    child = textwrap.dedent(
        f"""
        import signal, sys, time
        from pathlib import Path
        def on_stop(signum, frame):
            Path({str(got)!r}).write_text(str(signum))
            sys.exit(5)
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGHUP, on_stop)
        Path({str(ready)!r}).write_text("ready")
        time.sleep(60)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    supervisor = subprocess.Popen([sys.executable, "-m", "edgebatch.cli", "supervise", "--", sys.executable, "-c", child],
                                  env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and supervisor.poll() is None, "the child never started"
        time.sleep(0.05)
    supervisor.send_signal(signum)
    _, stderr = supervisor.communicate(timeout=60)
    assert got.read_text() == str(int(signum))
    assert supervisor.returncode == 5, stderr
    assert "1 restart" not in stderr and "0 restart(s)" in stderr
