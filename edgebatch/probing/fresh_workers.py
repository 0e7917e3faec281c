"""Fresh workers for the search: how each is set up, and where it comes from.

A fresh worker's first trial reads a batch in a process that ran nothing bigger. It is forked from
a fork server (forkserver.py) where the device has room for one beside the budget, else started as
a new process, ahead of need where spares are on (spares.py). A repeat of a batch always runs in a
new process, as training does, and the answer's repeats run side by side where room and cores allow.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from edgebatch.probing.outcomes import SearchConfig
from edgebatch.probing.readings import Progress, trial_from_reply
from edgebatch.probing.spares import SpareWorkers, no_room_line, spare_count
from edgebatch.probing.spares import wanted as spares_wanted
from edgebatch.probing.trial import MAX_STEPS_PER_TRIAL
from edgebatch.probing.worker import (
    DEFAULT_INTER_OP_THREADS,
    Worker,
    WorkerSetup,
    await_ready,
    spawn_worker,
    start_worker,
)
from edgebatch.profiles import Trial

# Fresh workers run this many steps at the start batch (at most half the trial's) before their
# trial, where prewarm_of gives one: with TensorFlow's inter-op pool the resident peak climbs over
# the first steps, and children read unsteadily without it (docs/probe-rules.md, "fresh_workers.PREWARM_STEPS").
PREWARM_STEPS = 5


def prewarm_of(batch: int, start_batch: int, capped: bool, *, new_process: bool,
               inter_op_threads: int = DEFAULT_INTER_OP_THREADS) -> tuple[int | None, int]:
    """(prewarm batch, prewarm steps) for a fresh worker whose first trial runs `batch`.

    None under an address-space cap, and none for a new process with one inter-op thread: each then
    runs what the training (and the benchmark's truth) runs, the step traced at batch 1 and then the
    batch, where a prewarm moved the edge or lifted the reading by one allocator region
    (docs/probe-rules.md, "fresh_workers.prewarm_of"). Fork-server children keep it.
    """
    if capped:
        return None, 0
    if new_process and inter_op_threads == 1:
        return None, 0
    return max(1, min(start_batch, batch // 2)), PREWARM_STEPS


# A repeat (a batch a fresh worker already read, read again in a new process) stands for training,
# and a process's peak can jump as late as step 7, after the settle rule stops waiting: so a repeat
# runs this many timed steps, within --trial-seconds (docs/probe-rules.md, "fresh_workers.REPEAT_STEPS").
REPEAT_STEPS = MAX_STEPS_PER_TRIAL


def fresh_setup(setup: WorkerSetup, batch: int, start_batch: int, *, new_process: bool,
                repeat: bool = False) -> WorkerSetup:
    """`setup` with the prewarm a fresh worker whose first trial runs `batch` gets (prewarm_of),
    and for a `repeat` at least REPEAT_STEPS steps."""
    prewarm, steps = prewarm_of(batch, start_batch, capped=bool(setup.address_space_headroom_bytes),
                                new_process=new_process, inter_op_threads=setup.inter_op_threads)
    steps_per_trial = max(setup.steps_per_trial, REPEAT_STEPS) if repeat else setup.steps_per_trial
    return WorkerSetup(**{**setup.__dict__, "prewarm_batch": prewarm, "prewarm_steps": steps,
                          "steps_per_trial": steps_per_trial})


def spare_setup(setup: WorkerSetup, config: SearchConfig, fork: FreshWorkers) -> WorkerSetup:
    """The setup of the new-process workers the search will ask for: repeats where a fork server
    serves first readings, first readings as well where none does. With one inter-op thread it
    does not depend on the batch (prewarm_of); with the pool it does only below twice the start."""
    return fresh_setup(setup, config.max_batch_limit, config.start_batch, new_process=True,
                       repeat=fork.server is not None)


# What the fork server keeps to itself: 286 MiB anonymous memory after importing TensorFlow and
# Keras (docs/probe-evidence.md, "Fresh workers from a fork server"), rounded up. Children share it copy-on-write.
FORK_SERVER_RESERVE_BYTES = 512 * 1024**2


def fits_side_by_side(count: int, room_bytes: int | None, budget_bytes: int, cores: int) -> bool:
    """Whether `count` trials of `budget_bytes` may run at once on a device with `room_bytes` free:
    room for all of them and the fork server's reserve, and at most one per core. Pure."""
    return room_bytes is not None and count <= cores and room_bytes - count * budget_bytes >= FORK_SERVER_RESERVE_BYTES


class FreshWorkers:
    """Starts fresh workers: forked from a fork server (forkserver.py) where one may run, else as new processes.

    The server holds memory of its own beside every trial, so it runs only where the device has
    FORK_SERVER_RESERVE_BYTES of room beyond the budget: with an explicit budget under what the
    machine has, not with the default budget (all of the available RAM). It starts in the
    background when the probe begins searching, while the scout runs its trials.
    """

    def __init__(self, device: str, budget_bytes: int, progress: Progress) -> None:
        from edgebatch.probing.budget import device_room_bytes
        from edgebatch.probing.forkserver import ForkServer, fork_server_wanted
        from edgebatch.probing.worker import worker_environment

        self._progress = progress
        self.server = None
        self.spares: SpareWorkers | None = None
        self._budget_bytes = budget_bytes
        self._room_bytes = room = device_room_bytes(device) if fork_server_wanted(device) else None
        if room is not None and room - budget_bytes >= FORK_SERVER_RESERVE_BYTES:
            self.server = ForkServer(worker_environment(device))

    def side_by_side(self, count: int) -> bool:
        """Whether `count` fresh workers may run at once (fits_side_by_side), only where a fork server runs."""
        return self.server is not None and fits_side_by_side(count, self._room_bytes, self._budget_bytes,
                                                             os.cpu_count() or 1)

    def start(self, setup_for: Callable[[bool], WorkerSetup]) -> Worker:
        """A fresh worker with the setup `setup_for(new_process)` gives for how it is started."""
        from edgebatch.probing.forkserver import ForkServerError

        if self.server is not None:
            try:
                return start_worker(setup_for(False), server=self.server)
            except ForkServerError as error:
                self._progress(f"  {error}; fresh workers start as new processes")
                self.close_server()
        return self.new_process(setup_for(True))

    def start_spares(self, setup: WorkerSetup, baseline_bytes: int | None) -> None:
        """Where spares are turned on (spares.wanted), start those the room allows ahead of need
        (spares.py), or say there is room for none."""
        if not spares_wanted():
            return
        reserve = FORK_SERVER_RESERVE_BYTES if self.server is not None else 0
        count = spare_count(self._room_bytes, self._budget_bytes, reserve, baseline_bytes, os.cpu_count() or 1)
        if count == 0:
            self._progress(no_room_line(self._room_bytes, self._budget_bytes))
            return
        self.spares = SpareWorkers(setup, count, self._progress)
        self._progress(f"  {count} new-process worker(s) will be started ahead of the fresh readings that need them")

    def refill_spares(self) -> None:
        """Start spares up to their count (after a step that read fresh: see SpareWorkers)."""
        if self.spares is not None:
            self.spares.fill()

    def new_process(self, setup: WorkerSetup) -> Worker:
        """A ready fresh worker started as a new process: a spare where one matches `setup`, else started now."""
        spare = self.spares.take(setup) if self.spares is not None else None
        return spare if spare is not None else start_worker(setup)

    def spawn_new_process(self, setup: WorkerSetup) -> Worker:
        """As new_process, but not waited for (await_ready): a spare may still be starting."""
        spare = self.spares.take(setup, ready=False) if self.spares is not None else None
        return spare if spare is not None else spawn_worker(setup)

    def close(self) -> None:
        if self.spares is not None:
            self.spares.close()
        self.close_server()

    def close_server(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def side_by_side_count(missing: int, fork: FreshWorkers | None) -> int:
    """How many of `missing` repeats run at once: the most the fork server's machine has room and
    cores for (FreshWorkers.side_by_side), 1 where that is none. Six readings on two cores run as
    three pairs, where asking for all six at once ran five of them one by one."""
    if fork is None:
        return 1
    return next((count for count in range(missing, 1, -1) if fork.side_by_side(count)), 1)


def seconds_per_sample_seen(trials: list[Trial]) -> float | None:
    """The slowest step seconds per sample among the trials that ran, or None before any did.

    It foresees a fresh worker's first trial for its reply deadline (Worker.trial_deadline) when the
    worker ran no prewarm to time (prewarm_of). Small batches overstate it, which only lengthens
    the deadline. Pure.
    """
    rates = [trial.step_seconds / trial.batch for trial in trials if trial.step_seconds and trial.batch > 0]
    return max(rates) if rates else None


def repeats_side_by_side(batch: int, count: int, config: SearchConfig, setup: WorkerSetup, measure: str,
                         seconds_per_sample: float | None = None,
                         fork: FreshWorkers | None = None) -> tuple[list[Trial], int]:
    """`count` fresh trials at `batch` at once, each in a new worker process, in the order they were
    started, and how many of those processes were started ahead (fork.spawn_new_process).

    `seconds_per_sample` foresees the trial's step time for its deadline (seconds_per_sample_seen).
    All of them are started before any is waited for, so their TensorFlow imports overlap, and then
    their trials run together. One thread does it all, the one that runs the probe: the workers die
    with it (PR_SET_PDEATHSIG), and Ctrl-C or SIGTERM kills them at once, as it does the search's
    other workers (a thread per worker would make a stop wait for every trial to finish).
    """
    repeat_setup = fresh_setup(setup, batch, config.start_batch, new_process=True, repeat=True)
    started: list[Worker] = []
    stopping = True
    try:
        for _ in range(count):
            started.append(fork.spawn_new_process(repeat_setup) if fork is not None else spawn_worker(repeat_setup))
        for worker in started:
            await_ready(worker)
            if worker.step_seconds_per_sample is None:
                worker.step_seconds_per_sample = seconds_per_sample
        for worker in started:
            worker.begin_trial(batch)
        replies = [worker.finish_trial() for worker in started]
        stopping = False
    finally:
        for worker in started:
            worker.close(at_once=stopping)
    trials = [dataclasses.replace(trial_from_reply(reply, measure, config.budget_bytes), fresh=True, forked=False)
              for reply in replies]
    return trials, sum(1 for worker in started if worker.started_ahead)


def worker_for(batch: int, config: SearchConfig, setup: WorkerSetup, workers: list[Worker], fresh: bool = False,
               fork: FreshWorkers | None = None, repeat: bool = False) -> Worker:
    """The live worker whose readings stay right at `batch`, or a fresh one (see worker.py); a
    fresh one for a `repeat` is a new process (never a fork-server child) and runs REPEAT_STEPS
    steps (fresh_setup).

    Workers that cannot run this trial (all of them when the search asks for a `fresh` one) are
    closed first: a scout that ran a batch above this one may hold most of the budget in resident
    memory (RSS never shrinks: docs/tensorflow-memory.md#resident-memory-never-shrinks), and the next
    trial must not run beside it. The search rarely climbs back above a worker's largest batch
    after stepping below it, so little is lost.
    """
    usable = None if fresh else next((worker for worker in workers if worker.can_run(batch)), None)
    for worker in [w for w in workers if w is not usable]:
        worker.close()
        workers.remove(worker)
    if usable is not None:
        return usable

    def setup_for(new_process: bool) -> WorkerSetup:
        return fresh_setup(setup, batch, config.start_batch, new_process=new_process, repeat=repeat)

    if fork is None:
        fresh = start_worker(setup_for(True))
    else:
        fresh = fork.new_process(setup_for(True)) if repeat else fork.start(setup_for)
    workers.append(fresh)
    return fresh
