"""Workers started ahead (EDGEBATCH_SPARES=1), in a real probe (tiny MLP, real TensorFlow
workers): they read the answer's repeats, and none outlives the probe, ended or interrupted.
Without the setting none starts: tests/test_probe_spares.py."""

import os
import re
import time

import psutil
import pytest

pytestmark = pytest.mark.slow
GIB = 1024**3


def _need_room():
    from edgebatch.probing.budget import device_room_bytes

    room = device_room_bytes("CPU:0")
    if room is None or room < 8 * GIB:
        pytest.skip(f"spares need room for two 1 GiB trials, the fork server and two spares; this host has {room}")


def _workers_left(timeout_seconds=10.0):
    deadline = time.monotonic() + timeout_seconds
    while True:
        left = [p for p in psutil.Process(os.getpid()).children(recursive=True)
                if any("edgebatch.probing" in part for part in _cmdline(p))]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _cmdline(process):
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_the_answers_repeats_run_in_workers_started_ahead_and_none_is_left(tmp_path, monkeypatch):
    from edgebatch import probe

    monkeypatch.setenv("EDGEBATCH_SPARES", "1")
    _need_room()
    lines = []
    profile = probe("mlp", device="CPU:0", memory_budget="1GiB", max_batch_limit=64, profiles_dir=tmp_path,
                    progress=lines.append)
    assert any("will be started ahead" in line for line in lines), lines
    ahead = [line for line in lines if "started ahead)" in line]
    assert ahead, lines
    repeats = [t for t in profile.trials if t.batch == profile.max_batch and t.fresh and t.forked is False]
    assert len(repeats) >= 2 and all(t.ok for t in repeats)
    assert _workers_left() == []


def test_an_interrupt_while_spares_wait_leaves_no_worker(tmp_path, monkeypatch):
    from edgebatch import probe

    monkeypatch.setenv("EDGEBATCH_SPARES", "1")
    _need_room()

    fresh_lines, announced, no_room, alive_at_interrupt = [], [], [], []

    def interrupt_after_the_first_fresh_step(line):
        # The scout's first trial is fresh too; the second fresh line ends a step that started the spares.
        no_room.extend([line] if "no workers started ahead" in line else [])
        announced.extend(re.findall(r"(\d+) new-process worker\(s\) will be started ahead", line))
        if "(fresh worker" in line:
            fresh_lines.append(line)
        if len(fresh_lines) == 2:
            alive_at_interrupt.extend(_cmdline(p) for p in _workers_left(timeout_seconds=0))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        probe("mlp", device="CPU:0", memory_budget="1GiB", max_batch_limit=64, profiles_dir=tmp_path,
              progress=interrupt_after_the_first_fresh_step, save=True)
    # How many spares fit depends on the room at that moment (one, not two, on a busy host); the
    # probe says the count it chose. The step's own worker was a fork-server child (its command
    # line is the server's); the spares are new processes.
    assert _workers_left() == [], "a worker outlived the probe"
    assert list(tmp_path.iterdir()) == [], "an interrupted probe writes nothing"
    if no_room:
        pytest.skip(f"the room had shrunk by the time the probe started: {no_room[0]}")
    assert len(announced) == 1 and int(announced[0]) >= 1, announced
    spares_seen = [cmdline for cmdline in alive_at_interrupt if "edgebatch.probing.worker_main" in cmdline]
    assert len(spares_seen) == int(announced[0]), f"{announced[0]} spare(s) were waiting: {alive_at_interrupt}"
