"""Memory taken from outside during a probe (probing/squeeze.py): a failure met while the host had
less room than the budget is the host's, and the probe gives no answer from it."""

import os

import pytest

from edgebatch.probing import squeeze
from edgebatch.profiles import Trial
from probe_stand_ins import StandInWorker, start_stand_ins

MIB = 1024**2
GIB = 1024**3


def failed(batch, error="worker_killed"):
    return Trial(batch=batch, ok=False, error=error, peak_bytes=None, process_peak_bytes=None,
                 allocator_peak_bytes=None, step_seconds=None, samples_per_second=None, fresh=True)


def fitted(batch):
    return Trial(batch=batch, ok=True, error=None, peak_bytes=500 * MIB, process_peak_bytes=500 * MIB,
                 allocator_peak_bytes=None, step_seconds=0.1, samples_per_second=80.0, fresh=True)


@pytest.mark.parametrize(("error", "room", "counted"), [
    ("worker_killed", 300 * MIB, True), ("oom", 300 * MIB, True), ("swapped", 300 * MIB, True),
    ("worker_killed", int(0.96 * GIB), False),  # within the drift a default budget has anyway
    ("worker_killed", 2 * GIB, False), ("worker_killed", None, False),
    ("over_budget", 300 * MIB, False),  # a reading is the worker's own peak: nobody else lifts it
])
def test_only_a_device_failure_under_a_squeezed_room_is_the_hosts(error, room, counted):
    assert bool(squeeze.squeezed([(failed(16, error), room)], GIB)) == counted


def test_the_watch_keeps_the_least_room_around_each_failure_and_says_so_in_one_line():
    watch = squeeze.RoomWatch()
    watch.note([fitted(8)], (4 * GIB, 4 * GIB))
    watch.note([failed(16)], (3 * GIB, 200 * MIB))
    watch.note([failed(12, "oom")], (None, 500 * MIB))
    line = watch.problem(GIB)
    assert "\n" not in line
    assert line.startswith("memory was taken from outside during the probe: batch 16 failed (worker killed) "
                           "while the host had 200.00 MiB for a budget of 1.00 GiB")
    assert "not saved" in line and "lower --memory-budget" in line
    assert squeeze.RoomWatch().problem(GIB) is None


def test_a_watch_without_a_sampler_reads_nothing():
    class NoProcess:
        @property
        def process(self):
            raise AssertionError("not sampled")

    assert squeeze.RoomWatch().room([NoProcess()]) is None


def test_the_hosts_room_counts_the_probes_own_workers_as_free(monkeypatch):
    from edgebatch.probing import budget

    monkeypatch.setattr(budget, "device_room_bytes", lambda device: GIB)
    sample = squeeze.host_room_with_workers("CPU:0")
    assert sample([]) == GIB
    assert sample([os.getpid()]) > GIB + 10 * MIB  # this test process holds far more than 10 MiB
    assert squeeze.host_room_with_workers("GPU:0")([os.getpid()]) is None


def test_a_search_whose_failures_met_a_squeezed_host_gives_no_answer(monkeypatch):
    """Through run_search with stand-in workers: 8 fits, everything above is killed while the host
    has 100 MiB of room; the watch says the answer (8) is the host's."""
    from edgebatch.probing import run_search
    from edgebatch.probing.search import SearchConfig
    from edgebatch.probing.worker import WorkerSetup

    class Process:
        pid = os.getpid()

    class StandIn(StandInWorker):
        process = Process()

        def reply(self, batch):
            if batch <= 8:
                return {"batch": batch, "ok": True, "process_peak_bytes": 300 * MIB, "step_seconds": 0.1,
                        "samples_per_second": 80.0}
            return {"batch": batch, "ok": False, "error": "worker_killed"}

        def can_run(self, batch):
            return False

    start_stand_ins(monkeypatch, lambda setup, server=None: StandIn())
    watch = squeeze.RoomWatch(lambda pids: 100 * MIB)
    config = SearchConfig(budget_bytes=GIB, start_batch=8)
    trials, done = run_search.run_search(config, WorkerSetup(model_spec="mlp"), [], "process_peak", lambda line: None,
                                         watch=watch)
    assert done.max_batch == 8 and any(t.error == "worker_killed" for t in trials)
    assert "batch 16 failed (worker killed) while the host had 100.00 MiB" in watch.problem(GIB)
    unsqueezed = squeeze.RoomWatch(lambda pids: 8 * GIB)
    run_search.run_search(config, WorkerSetup(model_spec="mlp"), [], "process_peak", lambda line: None,
                          watch=unsqueezed)
    assert unsqueezed.problem(GIB) is None
