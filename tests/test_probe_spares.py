"""Workers started ahead of need (probing/spares.py): how many the room allows, and how they are
handed over, replaced and stopped. Pure and stand-in tests; tests/test_probe_spares_real.py runs them."""

import os
import subprocess
import sys
import time

import pytest

from edgebatch.probing import spares
from edgebatch.probing.spares import MAX_SPARES, SPARE_SIZE_FACTOR, SpareWorkers, spare_count
from edgebatch.probing.worker import WorkerSetup

MIB = 1024**2
GIB = 1024**3
BASELINE = 400 * MIB
RESERVE = 512 * MIB


def room_for(spare_bytes_count, budget=GIB, cores=2):
    return cores * budget + RESERVE + int(spare_bytes_count * BASELINE * SPARE_SIZE_FACTOR)


@pytest.mark.parametrize(("room", "baseline", "cores", "count"), [
    (room_for(2), BASELINE, 2, 2),
    (room_for(5), BASELINE, 2, MAX_SPARES),
    (room_for(1.5), BASELINE, 2, 1),
    (room_for(0.9), BASELINE, 2, 0),
    (room_for(2, cores=1), BASELINE, 1, 1),  # one per core
    (None, BASELINE, 2, 0),  # room unknown
    (24 * GIB, None, 2, 0),  # size unknown
])
def test_spares_start_only_where_the_room_holds_the_trials_the_fork_server_and_them(room, baseline, cores, count):
    assert spare_count(room, GIB, RESERVE, baseline, cores) == count


def test_spares_start_only_when_turned_on(monkeypatch):
    monkeypatch.delenv(spares.ENV_ENABLE, raising=False)
    assert not spares.wanted()
    monkeypatch.setenv(spares.ENV_ENABLE, "1")
    assert spares.wanted()
    monkeypatch.setenv(spares.ENV_ENABLE, "0")
    assert not spares.wanted()


class Process:
    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode


class Spawned:
    def __init__(self, setup):
        self.setup, self.process, self.closed, self.started_ahead = setup, Process(), None, False

    def close(self, at_once=False):
        self.closed = at_once


SETUP = WorkerSetup(model_spec="mlp", steps_per_trial=14)


NICENESS = {}


def pool(monkeypatch, count=2):
    spawned, lines = [], []

    def spawn(setup):
        spawned.append(Spawned(setup))
        spawned[-1].process.pid = len(spawned)
        return spawned[-1]

    monkeypatch.setattr(spares, "await_ready", lambda worker: worker)
    NICENESS.clear()
    return SpareWorkers(SETUP, count, lines.append, spawn=spawn, renice=NICENESS.__setitem__), spawned, lines


def test_nothing_starts_before_the_first_fill_and_a_fill_tops_up_to_the_count(monkeypatch):
    workers, spawned, _ = pool(monkeypatch)
    assert spawned == [] and workers.take(SETUP) is None
    workers.fill()
    assert len(spawned) == 2 and all(w.setup == SETUP for w in spawned)
    assert NICENESS == {1: spares.SPARE_NICENESS, 2: spares.SPARE_NICENESS}, "spares import at the lowest priority"
    taken = workers.take(SETUP)
    assert taken is spawned[0] and taken.started_ahead
    assert NICENESS[1] == os.getpriority(os.PRIO_PROCESS, 0), "a spare taken for a trial runs at the probe's priority"
    assert len(spawned) == 2, "the place is filled after the trial, not beside it"
    workers.fill()
    assert len(spawned) == 3 and len(workers.idle) == 2


def test_a_spare_of_another_setup_is_not_handed_over(monkeypatch):
    workers, spawned, _ = pool(monkeypatch)
    workers.fill()
    assert workers.take(WorkerSetup(model_spec="mlp", steps_per_trial=3)) is None
    assert len(workers.idle) == 2


def test_a_spare_that_ended_is_replaced_by_the_slow_way_and_said_in_one_line(monkeypatch):
    workers, spawned, lines = pool(monkeypatch)
    workers.fill()
    spawned[0].process.returncode = -9
    assert workers.take(SETUP) is None and spawned[0].closed is True
    assert lines == ["  a worker started ahead had ended before its trial; a new process reads instead"]
    spawned[1].process.returncode = 1
    assert workers.take(SETUP, ready=False) is None and len(lines) == 2


def test_a_spare_that_fails_to_get_ready_is_said_and_the_slow_way_goes_on(monkeypatch):
    from edgebatch.errors import ProbeError

    workers, spawned, lines = pool(monkeypatch)

    def fail(worker):
        raise ProbeError("probe worker failed to start (worker exited with code 1): boom")

    monkeypatch.setattr(spares, "await_ready", fail)
    workers.fill()
    assert workers.take(SETUP) is None
    assert lines == ["  a worker started ahead failed (probe worker failed to start (worker exited with code 1): "
                     "boom); a new process reads instead"]


def test_close_kills_every_idle_spare_and_starts_no_more(monkeypatch):
    workers, spawned, _ = pool(monkeypatch)
    workers.fill()
    workers.close()
    assert [w.closed for w in spawned] == [True, True] and workers.idle == []
    workers.fill()
    assert len(spawned) == 2


def test_without_room_the_probe_says_so_in_one_line():
    line = spares.no_room_line(3 * GIB, GIB)
    assert "\n" not in line and "no workers started ahead (3.00 GiB of room for a 1.00 GiB budget)" in line
    assert "an unknown room" in spares.no_room_line(None, GIB)


def test_niceness_is_set_on_every_thread_and_a_gone_process_is_no_error():
    child = subprocess.Popen([sys.executable, "-c", "import threading, time; "
                              "[threading.Thread(target=time.sleep, args=(30,), daemon=True).start() for _ in range(3)]; "
                              "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spares.set_niceness(child.pid, 19)
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) >= 4 and all(os.getpriority(os.PRIO_PROCESS, tid) == 19 for tid in tids)
    finally:
        child.kill()
        child.wait()
    assert spares.set_niceness(child.pid, 0) is False


@pytest.mark.parametrize(("setting", "room", "started", "said"), [
    (None, 24 * GIB, False, None),  # off by default: nothing starts and nothing is said
    ("1", 24 * GIB, True, "2 new-process worker(s) will be started ahead"),
    ("1", 2 * GIB, False, "no workers started ahead (2.00 GiB of room for a 1.00 GiB budget)"),
])
def test_the_probe_starts_spares_only_when_asked_and_where_they_fit(monkeypatch, setting, room, started, said):
    from edgebatch.probing import fresh_workers

    if setting is None:
        monkeypatch.delenv(spares.ENV_ENABLE, raising=False)
    else:
        monkeypatch.setenv(spares.ENV_ENABLE, setting)
    lines = []
    fresh = fresh_workers.FreshWorkers.__new__(fresh_workers.FreshWorkers)
    fresh.server, fresh.spares, fresh._progress = None, None, lines.append
    fresh._room_bytes, fresh._budget_bytes = room, GIB
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    fresh.start_spares(SETUP, BASELINE)
    assert (fresh.spares is not None) == started
    assert (lines == []) if said is None else (len(lines) == 1 and said in lines[0])
    if fresh.spares is not None:
        assert fresh.spares.idle == [], "none is spawned before the search reads fresh"
