"""New-process workers started ahead of need, so a fresh reading waits for its batch, not an import.

A reading that stands for training runs in a new process (a fork-server child can read a level
of its own), and a new process costs a TensorFlow import and a model build before its trial.
Spares are spawned while the search runs its other trials: each imports, builds and traces as a
new process does, then waits for its batch, and its trial is its first, as a brand-new process's
is (docs/probe-evidence.md, "Workers started ahead"). They run only when turned on
(EDGEBATCH_SPARES=1: they pay only where the trials leave cores idle) and where the device has room
for them beside the trials and the fork server (spare_count); a spare that died is replaced by a
new process started then, and the probe says so in one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from edgebatch.probing.worker import Worker, WorkerSetup, await_ready, spawn_worker
from edgebatch.units import format_bytes

# Set to 1 to start spares. Off by default: on 2 cores a trial's step already uses every core, so
# a spare's import only moves CPU time around (dense_wide under 1400 MiB: 60-83 s with spares,
# 63-85 s without, three alternated runs each; docs/probe-evidence.md, "Workers started ahead").
ENV_ENABLE = "EDGEBATCH_SPARES"
# At most this many spares: on the 2-core machines this project is built on, one per core.
MAX_SPARES = 2
# A spare starts at the lowest CPU priority, so its import yields to the trials running beside it
# (on two cores an import at full priority cut a child's samples/s from about 1000 to 600:
# docs/probe-evidence.md, "Two ways to cut the new-process wait"); it is raised back when taken.
SPARE_NICENESS = 19
# A spare idles at about the worker's baseline (TensorFlow imported, the model built and traced);
# this share on top covers what differs between processes.
SPARE_SIZE_FACTOR = 1.25


def spare_count(room_bytes: int | None, budget_bytes: int, reserve_bytes: int, baseline_bytes: int | None,
                cores: int) -> int:
    """How many spares the device has room for: room for `cores` trials side by side at the
    budget, the fork server's `reserve_bytes`, and each spare at SPARE_SIZE_FACTOR x the worker's
    baseline. 0 where the room or the baseline is unknown. Pure."""
    if room_bytes is None or not baseline_bytes or cores < 1:
        return 0
    spare_bytes = baseline_bytes * SPARE_SIZE_FACTOR
    left = room_bytes - min(cores, MAX_SPARES) * budget_bytes - reserve_bytes
    return max(0, min(MAX_SPARES, cores, int(left // spare_bytes)))


def wanted() -> bool:
    """Whether the user turned spares on (EDGEBATCH_SPARES=1)."""
    return os.environ.get(ENV_ENABLE, "") == "1"


def no_room_line(room_bytes: int | None, budget_bytes: int) -> str:
    room = "an unknown room" if room_bytes is None else f"{format_bytes(room_bytes)} of room"
    return (f"  no workers started ahead ({room} for a {format_bytes(budget_bytes)} budget): "
            "each fresh reading in a new process waits for its start-up")


class SpareWorkers:
    """Keeps up to `count` spawned, idle new-process workers of one `setup`; `take` hands one over.

    Nothing starts until the first `fill`: the probe fills after every step that read fresh
    (spares started with the scout imported TensorFlow beside the fork server's own start and
    delayed it, and one started beside a trial slows that trial's start).
    """

    def __init__(self, setup: WorkerSetup, count: int, progress: Callable[[str], None],
                 spawn: Callable[[WorkerSetup], Worker] = spawn_worker,
                 renice: Callable[[int, int], bool] | None = None) -> None:
        self.setup = setup
        self.count = count
        self._progress = progress
        self._spawn = spawn
        self._renice = renice or set_niceness
        self.idle: list[Worker] = []

    def fill(self) -> None:
        """Spawn spares up to `count`, at SPARE_NICENESS; each starts at once and is not waited for."""
        while len(self.idle) < self.count:
            worker = self._spawn(self.setup)
            self._renice(worker.process.pid, SPARE_NICENESS)
            self.idle.append(worker)

    def take(self, setup: WorkerSetup, ready: bool = True) -> Worker | None:
        """A spare for `setup`, ready (await_ready) unless `ready` is False, or None where none
        matches or the one waiting died (said in one line). The caller fills the place again once
        the trial it was taken for has run: spawned beside it, a new spare's import would slow the
        trial's start, and the search may be done."""
        if setup != self.setup or not self.idle:
            return None
        worker = self.idle.pop(0)
        worker.started_ahead = True
        self._renice(worker.process.pid, os.getpriority(os.PRIO_PROCESS, 0))
        if ready:
            return self._ready_or_none(worker)
        return self._ended(worker) if worker.process.poll() is not None else worker

    def _ended(self, worker: Worker) -> None:
        worker.close(at_once=True)
        self._progress("  a worker started ahead had ended before its trial; a new process reads instead")

    def _ready_or_none(self, worker: Worker) -> Worker | None:
        if worker.process.poll() is not None:
            return self._ended(worker)
        try:
            return await_ready(worker)
        except Exception as error:  # noqa: BLE001 - any start-up failure: the slow way still works
            self._progress(f"  a worker started ahead failed ({error}); a new process reads instead")
            return None

    def close(self) -> None:
        """Kill the idle spares (none has run a trial, so nothing is lost)."""
        idle, self.idle = self.idle, []
        self.count = 0
        for worker in idle:
            worker.close(at_once=True)


def set_niceness(pid: int, niceness: int) -> bool:
    """Set every thread of `pid` to `niceness` (Linux keeps it per thread; threads started later
    inherit their creator's). False where it cannot: no /proc, the process gone, or raising it back
    needs a privilege this user lacks, in which case the spare's trial runs at the lower priority,
    which changes its speed only while something else wants the cores, not its memory."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    done = True
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except OSError:
            done = False
    return done
