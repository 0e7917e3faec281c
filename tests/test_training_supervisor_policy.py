"""The supervisor's pure pieces: the restart decision by table, the running micro-batch record."""

import json
import os

import pytest

from edgebatch.errors import UsageError
from edgebatch.training.hard_failure import (
    ENV_HARD_FAILURE_MICRO_BATCH,
    MARKER_FILE,
    RunningMarker,
    clear_running_marker,
    read_running_micro_batch,
    take_hard_failure_micro_batch,
)
from edgebatch.training.restart_policy import ChildRun, SupervisorReport, death_signal_of, restart_decision
from write_interrupts import stopped_before_renaming_to

# returncode, restarts_done, max_restarts, stop_requested -> restart, exit_code
DECISIONS = [
    pytest.param(0, 0, 3, False, False, 0, id="success"),
    pytest.param(0, 3, 3, False, False, 0, id="success-after-restarts"),
    pytest.param(1, 0, 3, False, False, 1, id="python-exception"),
    pytest.param(2, 0, 3, False, False, 2, id="usage-error"),
    pytest.param(130, 0, 3, False, False, 130, id="exit-130-is-a-chosen-status"),
    pytest.param(-9, 0, 3, False, True, 137, id="sigkill-oom-killer"),
    pytest.param(-6, 2, 3, False, True, 134, id="sigabrt-onednn-last-restart"),
    pytest.param(-11, 0, 3, False, True, 139, id="sigsegv"),
    pytest.param(-7, 0, 3, False, True, 135, id="sigbus"),
    pytest.param(-9, 3, 3, False, False, 137, id="sigkill-restarts-spent"),
    pytest.param(-9, 0, 0, False, False, 137, id="no-restarts-allowed"),
    pytest.param(-9, 0, 3, True, False, 137, id="sigkill-after-stop-request"),
    pytest.param(-15, 0, 3, False, False, 143, id="sigterm-from-outside"),
    pytest.param(-2, 0, 3, True, False, 130, id="forwarded-sigint"),
    pytest.param(-1, 0, 3, False, False, 129, id="sighup"),
    pytest.param(137, 0, 3, False, True, 137, id="shell-reports-sigkill"),
    pytest.param(134, 1, 3, False, True, 134, id="shell-reports-sigabrt"),
    pytest.param(143, 0, 3, False, False, 143, id="shell-reports-sigterm-is-an-exit"),
    pytest.param(-40, 0, 3, False, False, 168, id="unnamed-realtime-signal"),
]


@pytest.mark.parametrize("returncode, restarts_done, max_restarts, stop_requested, restart, exit_code", DECISIONS)
def test_restart_decision_table(returncode, restarts_done, max_restarts, stop_requested, restart, exit_code):
    decision = restart_decision(returncode=returncode, restarts_done=restarts_done, max_restarts=max_restarts,
                                stop_requested=stop_requested)
    assert decision.restart is restart
    assert decision.exit_code == exit_code
    assert decision.reason


def test_reasons_say_why():
    spent = restart_decision(returncode=-9, restarts_done=2, max_restarts=2, stop_requested=False)
    assert spent.reason == "the child died by SIGKILL and all 2 restart(s) are spent"
    again = restart_decision(returncode=-6, restarts_done=0, max_restarts=2, stop_requested=False)
    assert again.reason == "the child died by SIGABRT: restart 1 of 2"
    error = restart_decision(returncode=1, restarts_done=0, max_restarts=2, stop_requested=False)
    assert "exited with code 1" in error.reason and "not restarted" in error.reason


def test_death_signal_of():
    assert death_signal_of(-9).name == "SIGKILL"
    assert death_signal_of(-15).name == "SIGTERM"
    assert death_signal_of(139).name == "SIGSEGV"
    assert death_signal_of(0) is None and death_signal_of(1) is None and death_signal_of(143) is None


def test_report_summary_and_dict():
    runs = (
        ChildRun(attempt=1, returncode=-9, signal_name="SIGKILL", running_micro_batch=32, seconds=4.25, restarted=True),
        ChildRun(attempt=2, returncode=0, signal_name=None, running_micro_batch=None, seconds=9.0, restarted=False),
    )
    report = SupervisorReport(command=("python", "train.py"), exit_code=0, restarts=1, max_restarts=3,
                              reason="the child finished (exit code 0)", runs=runs)
    assert report.signals == ("SIGKILL",)
    text = report.summary()
    assert "exit code 0; 1 restart(s) of at most 3; signals: SIGKILL" in text
    assert "child 1: died by SIGKILL after 4.2 s, micro-batch 32 running, restarted" in text
    assert "child 2: exited with 0 after 9.0 s" in text
    as_dict = json.loads(json.dumps(report.to_dict()))
    assert as_dict["command"] == ["python", "train.py"] and as_dict["signals"] == ["SIGKILL"]


def test_marker_writes_only_on_change_and_reads_back(tmp_path):
    marker = RunningMarker(tmp_path / "ckpt")  # the directory is created on the first note
    assert read_running_micro_batch(tmp_path / "ckpt") is None
    marker.note(32)
    path = tmp_path / "ckpt" / MARKER_FILE
    assert read_running_micro_batch(tmp_path / "ckpt") == 32
    written = path.stat().st_mtime_ns
    os.utime(path, ns=(0, 0))
    marker.note(32)  # unchanged: no write
    assert path.stat().st_mtime_ns == 0 != written
    marker.note(16)
    assert read_running_micro_batch(tmp_path / "ckpt") == 16
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [MARKER_FILE]  # no temporary left
    clear_running_marker(tmp_path / "ckpt")
    clear_running_marker(tmp_path / "ckpt")  # already gone: fine
    assert read_running_micro_batch(tmp_path / "ckpt") is None


def test_a_marker_write_stopped_midway_leaves_no_temporary_and_the_old_marker(tmp_path, monkeypatch):
    marker = RunningMarker(tmp_path)
    marker.note(32)
    stopped_before_renaming_to(tmp_path / MARKER_FILE, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        marker.note(16)
    assert [p.name for p in tmp_path.iterdir()] == [MARKER_FILE]
    assert read_running_micro_batch(tmp_path) == 32


@pytest.mark.parametrize("text", ["", "{", "[]", '{"micro_batch": 0}', '{"micro_batch": "8"}', '{"micro_batch": true}'])
def test_unreadable_marker_is_no_size(tmp_path, text):
    (tmp_path / MARKER_FILE).write_text(text)
    assert read_running_micro_batch(tmp_path) is None


def test_take_hard_failure_once(monkeypatch):
    monkeypatch.setenv(ENV_HARD_FAILURE_MICRO_BATCH, " 24 ")
    assert take_hard_failure_micro_batch() == 24
    assert ENV_HARD_FAILURE_MICRO_BATCH not in os.environ
    assert take_hard_failure_micro_batch() is None


@pytest.mark.parametrize("text", ["0", "-3", "eight", "8.0"])
def test_take_hard_failure_refuses_malformed(monkeypatch, text):
    monkeypatch.setenv(ENV_HARD_FAILURE_MICRO_BATCH, text)
    with pytest.raises(UsageError, match=f"EDGEBATCH_HARD_FAILURE_MICRO_BATCH .*got {text!r}"):
        take_hard_failure_micro_batch()
