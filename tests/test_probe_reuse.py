"""A cached profile is reused only where it answers the request; budgets are checked where they enter.

The reuse rules and budget checks are pure and tested by table; one real probe (a tiny MLP, one
worker) shows the probe says in one line why it reused or probed again.
"""

import json

import pytest

from edgebatch.errors import UsageError
from edgebatch.probing.api import ProbeRequest
from edgebatch.probing.budget import (
    DeviceFacts,
    device_facts,
    explicit_budget_bytes,
    overcommit_problem,
    resolve_budget,
)
from edgebatch.probing.reuse import BUDGET_TOLERANCE_FRACTION, answered_from_readings, reuse_problem, safe_rule_matches
from edgebatch.profiles.schema import SCHEMA_VERSION
from edgebatch.sensors.cgroup import CgroupMemory
from edgebatch.sensors.host import HostMemory
from probe_stand_ins import StandInWorker, start_stand_ins

GIB = 1024**3
MIB = 1024**2
SEARCH = ProbeRequest().search_settings()


def problem(search=None, headroom=0.10, budget=GIB, **requested):
    requested_search = {**SEARCH, **{k: v for k, v in requested.items() if k in SEARCH}}
    return reuse_problem(
        cached_search=SEARCH if search is None else search,
        cached_headroom=0.10,
        cached_budget_bytes=GIB,
        requested_search=requested_search,
        requested_headroom=headroom,
        requested_budget_bytes=budget,
    )


def test_the_same_request_reuses():
    assert problem() is None


def test_another_start_reuses_it_moves_the_path_not_the_answer():
    assert problem(start=32) is None


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"max_batch_limit": 48}, "--max-batch-limit 4096, this probe asks for 48"),
        ({"multiple": 16}, "--multiple 1, this probe asks for 16"),
        ({"strategy": "binsearch"}, "--strategy slow_start"),
        ({"steps_per_trial": 10}, "--steps-per-trial 3"),
        ({"trial_seconds": 30.0}, "--trial-seconds 10.0"),
        ({"inter_op_threads": 0}, "--inter-op-threads 1, this probe asks for 0"),
        ({"answer_readings": 1}, "--answer-readings 3, this probe asks for 1"),
        ({"tolerance": 0.05}, "--tolerance 0.02, this probe asks for 0.05"),
    ],
)
def test_a_setting_that_changes_the_answer_probes_again(change, fragment):
    reason = problem(**change)
    assert reason is not None and fragment in reason


def test_another_headroom_or_an_older_safe_rule_is_answered_from_the_readings_except_per_length():
    # safe_batch is a pure function of the readings (budget_answer.py reads it again).
    assert problem(headroom=0.5) is None
    assert answered_from_readings(GIB, GIB, same_safe_rule=safe_rule_matches(SCHEMA_VERSION, 0.10, 0.5))
    assert answered_from_readings(GIB, GIB, same_safe_rule=safe_rule_matches(2, 0.03, 0.03))
    assert not answered_from_readings(GIB, GIB, same_safe_rule=safe_rule_matches(SCHEMA_VERSION, 0.03, 0.03))
    per_length = reuse_problem(cached_search=SEARCH, cached_headroom=0.10, cached_budget_bytes=GIB,
                               requested_search=SEARCH, requested_headroom=0.5, requested_budget_bytes=GIB,
                               cached_per_length=True)
    assert "--headroom 0.1, this probe asks for 0.5, and a probe per length answers only its own" in per_length
    assert not answered_from_readings(GIB, GIB, cached_per_length=True, same_safe_rule=False)


def test_a_budget_up_to_the_tolerance_above_the_profiles_or_any_below_is_answered_a_larger_one_probes():
    """Below the profile's budget its readings answer (tests/test_probe_budget_answer.py); above it
    only within the tolerance, where a default budget moves with what else runs."""
    inside = int(GIB * (1 + BUDGET_TOLERANCE_FRACTION * 0.9))
    outside = int(GIB * (1 + BUDGET_TOLERANCE_FRACTION * 1.1))
    assert problem(budget=inside) is None
    assert problem(budget=int(GIB * (1 - BUDGET_TOLERANCE_FRACTION * 1.1))) is None
    assert problem(budget=GIB // 4) is None
    reason = problem(budget=outside)
    assert reason is not None and "budget 1.00 GiB is below" in reason and "3%" in reason
    assert problem(budget=4 * GIB) is not None


def test_a_profile_without_recorded_settings_is_not_reused():
    assert "no search settings" in problem(search={})


def test_the_measurement_margin_is_one_percent_with_one_inter_op_thread_and_2_5_with_the_pool():
    from edgebatch.probing.margins import fit_budget_bytes

    assert fit_budget_bytes(1_000_000) == fit_budget_bytes(1_000_000, 1) == 990_000
    assert fit_budget_bytes(1_000_000, 0) == fit_budget_bytes(1_000_000, 4) == 975_000


def test_fork_server_children_prewarm_at_the_start_batch_and_not_under_an_address_space_cap():
    from edgebatch.probing.fresh_workers import PREWARM_STEPS, prewarm_of

    child = {"new_process": False, "inter_op_threads": 1}
    assert prewarm_of(688, start_batch=8, capped=False, **child) == (8, PREWARM_STEPS)
    assert prewarm_of(6, start_batch=8, capped=False, **child) == (3, PREWARM_STEPS)  # at most half the trial
    assert prewarm_of(1, start_batch=8, capped=False, **child) == (1, PREWARM_STEPS)
    assert prewarm_of(22607, start_batch=8, capped=True, **child) == (None, 0)


def test_new_processes_with_one_inter_op_thread_run_what_training_runs_no_prewarm():
    """A prewarm at 8 lifted text_cnn at 799 by one allocator region (1,265 MiB in 8 of 8 new
    processes, 1,152 MiB in 14 of 15 without it, as training reads); with TensorFlow's pool the
    prewarm stays, for the climb over the first steps."""
    from edgebatch.probing.fresh_workers import PREWARM_STEPS, prewarm_of

    assert prewarm_of(799, start_batch=8, capped=False, new_process=True, inter_op_threads=1) == (None, 0)
    assert prewarm_of(799, start_batch=8, capped=False, new_process=True, inter_op_threads=0) == (8, PREWARM_STEPS)
    assert prewarm_of(799, start_batch=8, capped=False, new_process=False, inter_op_threads=0) == (8, PREWARM_STEPS)
    assert prewarm_of(799, start_batch=8, capped=True, new_process=True, inter_op_threads=0) == (None, 0)


def test_the_probe_gives_new_process_workers_no_prewarm_and_fork_children_one(monkeypatch):
    """Which setup each way of starting a fresh worker gets, read where the worker is started."""
    from edgebatch.probing import fresh_workers
    from edgebatch.probing.search import SearchConfig
    from edgebatch.probing.worker import WorkerSetup

    class StandIn(StandInWorker):
        def begin_trial(self, batch):
            super().begin_trial(batch)
            self.deadline_seconds_per_sample = self.step_seconds_per_sample

        def reply(self, batch):
            return {"batch": batch, "ok": False, "error": "oom"}

    started, workers = [], []

    steps = []

    def start_worker(setup, server=None):
        started.append((setup.prewarm_batch, setup.prewarm_steps, server))
        steps.append(setup.steps_per_trial)
        workers.append(StandIn())
        return workers[-1]

    start_stand_ins(monkeypatch, start_worker)
    setup = WorkerSetup(model_spec="text_cnn")
    config = SearchConfig(budget_bytes=1280 * 2**20)
    fresh_workers.worker_for(799, config, setup, [], fresh=True, fork=None)
    assert started.pop() == (None, 0, None), "a new process, as training starts: no prewarm"
    assert steps.pop() == setup.steps_per_trial == 3, "a first reading settles as any trial does"
    fresh_workers.worker_for(799, config, setup, [], fresh=True, fork=None, repeat=True)
    assert started.pop() == (None, 0, None) and steps.pop() == fresh_workers.REPEAT_STEPS == 14, "a repeat runs longer"
    fresh_workers.repeats_side_by_side(799, 2, config, setup, "process_peak", seconds_per_sample=0.004)
    assert started == [(None, 0, None)] * 2, "the answer's repeats are new processes"
    assert steps == [fresh_workers.REPEAT_STEPS] * 2, "side by side as well"
    steps.clear()
    # With no prewarm to time, the trial's deadline is foreseen from the search's own trials.
    assert [worker.deadline_seconds_per_sample for worker in workers[-2:]] == [0.004, 0.004]
    started.clear()
    fork = fresh_workers.FreshWorkers.__new__(fresh_workers.FreshWorkers)
    fork.server, fork._progress = "a fork server", print
    fresh_workers.worker_for(799, config, setup, [], fresh=True, fork=fork)
    assert started == [(8, fresh_workers.PREWARM_STEPS, "a fork server")], "a fork-server child prewarms at the start batch"
    assert steps == [3]


def test_a_fresh_workers_first_deadline_comes_from_the_slowest_step_per_sample_seen():
    from edgebatch.probing.fresh_workers import seconds_per_sample_seen
    from edgebatch.profiles.model import Trial

    def trial(batch, step_seconds):
        return Trial(batch=batch, ok=step_seconds is not None, error=None if step_seconds else "oom", peak_bytes=None,
                     process_peak_bytes=None, allocator_peak_bytes=None, step_seconds=step_seconds,
                     samples_per_second=None)

    assert seconds_per_sample_seen([]) is None
    assert seconds_per_sample_seen([trial(8, None)]) is None
    # 8 at 0.4 s is 0.05 s a sample, 512 at 12.8 s 0.025: the slower rate, so the deadline errs long.
    assert seconds_per_sample_seen([trial(8, 0.4), trial(512, 12.8), trial(600, None)]) == 0.05


def test_a_profile_from_before_inter_op_threads_were_recorded_counts_as_tensorflows_pool():
    older = {key: value for key, value in SEARCH.items() if key != "inter_op_threads"}
    assert SEARCH["inter_op_threads"] == 1, "the probe's default: one inter-op thread"
    assert "--inter-op-threads 0, this probe asks for 1" in problem(search=older)
    assert problem(search=older, inter_op_threads=0) is None


def test_a_profile_from_before_the_answer_was_repeated_counts_as_one_reading():
    older = {key: value for key, value in SEARCH.items() if key != "answer_readings"}
    assert SEARCH["answer_readings"] == 3, "the probe's default: the answer read in three fresh workers"
    assert "--answer-readings 1, this probe asks for 3" in problem(search=older)
    assert problem(search=older, answer_readings=1) is None


def test_a_profile_from_before_the_tolerance_was_a_setting_counts_as_two_percent():
    """The committed device profiles record no tolerance: the default probe still reuses them."""
    older = {key: value for key, value in SEARCH.items() if key != "tolerance"}
    assert SEARCH["tolerance"] == 0.02
    assert problem(search=older) is None
    assert "--tolerance 0.02, this probe asks for 0.05" in problem(search=older, tolerance=0.05)


@pytest.mark.parametrize("tolerance", [0.0, 1.0, -0.1])
def test_a_tolerance_outside_zero_to_one_is_refused_before_any_trial(tolerance, tmp_path):
    from edgebatch.probing import probe

    with pytest.raises(UsageError, match=r"--tolerance must be in \(0, 1\)"):
        probe("mlp", device="CPU:0", tolerance=tolerance, profiles_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_memory_limit_under_the_total_is_part_of_the_device_fingerprint(monkeypatch):
    """A profile probed on the 24 GiB host must not be found inside a 4 GiB container."""
    import edgebatch.sensors as sensors

    def host(limit):
        cgroup = None if limit is None else CgroupMemory(version=2, limit_bytes=limit, usage_bytes=GIB)
        return lambda: HostMemory(total_bytes=24 * GIB, available_bytes=20 * GIB, process_rss_bytes=GIB,
                                  cgroup=cgroup, psi=None)

    monkeypatch.setattr(sensors, "read_host_memory", host(None))
    bare = device_facts("CPU:0")
    monkeypatch.setattr(sensors, "read_host_memory", host(4 * GIB))
    contained = device_facts("CPU:0")
    monkeypatch.setattr(sensors, "read_host_memory", host(64 * GIB))  # a limit above the total does not bind
    loose = device_facts("CPU:0")
    assert bare.memory_limit_bytes is None and loose.memory_limit_bytes is None
    assert contained.memory_limit_bytes == 4 * GIB
    assert contained.fingerprint != bare.fingerprint and "-lim4gib-" in contained.fingerprint
    assert loose.fingerprint == bare.fingerprint


def test_facts_without_a_limit_keep_the_committed_profiles_fingerprint():
    facts = DeviceFacts(kind="CPU", index=0, description="AMD EPYC", cores=2, memory_total_bytes=24 * GIB)
    assert facts.fingerprint == "cpu-amd-epyc-2c-24gib-fdd90336"


@pytest.mark.parametrize("budget", ["100", 100, "1048575", " 512 "])
def test_a_unitless_budget_under_1_mib_is_refused_with_a_hint(budget):
    with pytest.raises(UsageError, match=r"too small to train anything: write a unit, e\.g\. \d+MiB"):
        explicit_budget_bytes(budget)


@pytest.mark.parametrize(("budget", "expected"), [("1048576", MIB), (2 * GIB, 2 * GIB), ("100MiB", 100 * MIB),
                                                  ("512KiB", 512 * 1024)])
def test_budgets_with_a_unit_or_of_1_mib_and_more_are_taken(budget, expected):
    assert explicit_budget_bytes(budget) == expected


def test_a_budget_above_the_room_is_refused_unless_the_room_is_unknown():
    assert overcommit_problem("CPU:0", GIB, 2 * GIB) is None
    assert overcommit_problem("GPU:0", 80 * GIB, None) is None
    message = overcommit_problem("CPU:0", 30 * GIB, 20 * GIB)
    assert "30.00 GiB is more than CPU:0 can give now (20.00 GiB)" in message
    assert "--allow-overcommit" in message


def test_resolve_budget_on_this_machine():
    with pytest.raises(UsageError, match="--allow-overcommit"):
        resolve_budget("CPU:0", "64TiB", allow_overcommit=False)
    assert resolve_budget("CPU:0", "64TiB", allow_overcommit=True) == (64 * 1024 * GIB, "cli")
    assert resolve_budget("CPU:0", "1GiB", allow_overcommit=False) == (GIB, "cli")
    default_bytes, source = resolve_budget("CPU:0", None, allow_overcommit=False)
    assert default_bytes > GIB and source in ("available_ram", "cgroup_limit")


def test_bad_request_fields_are_refused_before_any_worker_starts(tmp_path):
    from edgebatch import probe

    with pytest.raises(UsageError, match="--max-batch-limit must be at least --multiple"):
        probe("mlp", max_batch_limit=4, multiple=8, profiles_dir=tmp_path)
    with pytest.raises(UsageError, match="unknown probe option"):
        probe("mlp", max_batch=64, profiles_dir=tmp_path)
    for threads in (-1, 1.5, True):
        with pytest.raises(UsageError, match=r"--inter-op-threads must be a whole number >= 0"):
            probe("mlp", inter_op_threads=threads, profiles_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


class _Stop(Exception):
    """Raised by the test's progress callback once the probe has said what it decided."""


def _probe_until_decided(directory, **options):
    from edgebatch import probe

    lines = []

    def progress(line):
        lines.append(line)
        if line.startswith(("not reusing", "no cached profile")):
            raise _Stop(line)

    try:
        profile = probe("mlp", device="CPU:0", profiles_dir=directory, progress=progress, answer_readings=1, **options)
    except _Stop as stop:
        return None, str(stop)
    return profile, next(line for line in lines if line.startswith("reusing"))


@pytest.mark.slow
def test_the_probe_says_why_it_reused_or_probed_again(tmp_path):
    from edgebatch import probe

    # One reading of the answer throughout (the same setting, so reuse is still decided by the others).
    first = probe("mlp", device="CPU:0", memory_budget="4GiB", max_batch_limit=32, profiles_dir=tmp_path,
                  answer_readings=1)
    saved = sorted(tmp_path.iterdir())
    again, line = _probe_until_decided(tmp_path, memory_budget="4GiB", max_batch_limit=32)
    assert again is not None and again.max_batch == first.max_batch and "budget within 3%" in line
    _, line = _probe_until_decided(tmp_path, memory_budget="4GiB", max_batch_limit=16)
    assert "not reusing" in line and "--max-batch-limit 32, this probe asks for 16" in line
    _, line = _probe_until_decided(tmp_path, memory_budget="8GiB", max_batch_limit=32, allow_overcommit=True)
    assert "budget 4.00 GiB is below this probe's 8.00 GiB" in line
    below, line = _probe_until_decided(tmp_path, memory_budget="2GiB", max_batch_limit=32)
    assert "its readings answer this smaller budget" in line and below.budget_bytes == 2 * 1024**3
    assert below.max_batch == first.max_batch and below.created_at == first.created_at
    wider, line = _probe_until_decided(tmp_path, memory_budget="4GiB", max_batch_limit=32, headroom=0.5)
    assert "it was probed with --headroom 10%, its readings answer this probe's 50%" in line
    assert wider.headroom == 0.5 and wider.max_batch == first.max_batch and wider.safe_batch <= first.safe_batch
    assert sorted(tmp_path.iterdir()) == saved, "a stopped probe writes nothing"
    _reuse_with_a_scout_that_never_gets_ready(tmp_path, first)


# A scout that says what the model is and then stays busy, as a real one does while it traces.
_BUSY_SCOUT = '''
import json, sys, time
sys.stdin.readline()
print("@@edgebatch " + json.dumps({"identity": True, **json.loads(sys.argv[1])}), flush=True)
time.sleep(600)
'''


def _reuse_with_a_scout_that_never_gets_ready(directory, first):
    """Reuse is decided on the scout's identity message alone: the probe answers from the cache and
    stops the scout without waiting for its trace (the step a reused profile never runs)."""
    import sys

    from edgebatch import probe
    from edgebatch.probing import api, worker

    identity = {"name": first.model["name"], "config_hash": first.model["config_hash"],
                "inputs": first.model["inputs"], "tensorflow": first.versions["tensorflow"], "gpu": None}
    scouts = []

    def spawn_busy_scout(setup):
        scouts.append(worker.spawn_worker(setup, command=[sys.executable, "-c", _BUSY_SCOUT, json.dumps(identity)]))
        return scouts[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "spawn_worker", spawn_busy_scout)
        again = probe("mlp", device="CPU:0", memory_budget="4GiB", max_batch_limit=32, profiles_dir=directory,
                      answer_readings=1, progress=lambda line: None)
    assert again.created_at == first.created_at
    assert len(scouts) == 1 and scouts[0].process.poll() is not None, "the busy scout was stopped"


@pytest.mark.slow
def test_a_budget_below_the_workers_baseline_is_refused_before_any_trial(tmp_path):
    from edgebatch import probe

    lines = []
    with pytest.raises(UsageError, match="below what a worker holds on CPU:0 before any batch"):
        probe("mlp", device="CPU:0", memory_budget="50MiB", profiles_dir=tmp_path, progress=lines.append)
    assert not any("batch " in line and "peak" in line for line in lines), lines
    assert list(tmp_path.iterdir()) == []


def test_repeats_of_the_answer_run_side_by_side_only_with_room_for_each_and_a_core_each():
    from edgebatch.probing.fresh_workers import FORK_SERVER_RESERVE_BYTES, fits_side_by_side

    assert fits_side_by_side(2, 24 * GIB, 1536 * MIB, cores=2)
    assert not fits_side_by_side(3, 24 * GIB, 1536 * MIB, cores=2)
    assert not fits_side_by_side(2, 2 * GIB + FORK_SERVER_RESERVE_BYTES - 1, GIB, cores=2)
    assert fits_side_by_side(2, 2 * GIB + FORK_SERVER_RESERVE_BYTES, GIB, cores=2)
    assert not fits_side_by_side(2, None, GIB, cores=2)


def test_the_search_starts_as_many_new_processes_as_a_repeat_asks_for(monkeypatch):
    """A children-only bump is read again by one new process, the answer's missing repeats by
    several side by side (search.Run.readings); counted where run_search starts workers."""
    from edgebatch.probing import fresh_workers, run_search
    from edgebatch.probing.search import Done, Finder, Run, SearchConfig
    from edgebatch.probing.worker import WorkerSetup

    class StandIn(StandInWorker):
        def reply(self, batch):
            return {"batch": batch, "ok": True, "process_peak_bytes": 100 * 2**20, "step_seconds": 0.1,
                    "samples_per_second": 10.0}

    started = []

    def start_worker(setup, server=None):
        started.append(server)
        worker = StandIn()
        worker.forked = server is not None
        return worker

    class Fork:
        server = "a fork server"

        def side_by_side(self, count):
            return True

        def start(self, setup_for):
            return start_worker(setup_for(False), server=self.server)

        def new_process(self, setup):  # no workers started ahead here (tests/test_probe_spares.py has them)
            return fresh_workers.start_worker(setup)

        spawn_new_process = new_process

        def refill_spares(self):
            pass

    script = iter([Run(300, fresh=True), Run(300, fresh=True, readings=1), Run(300, fresh=True, readings=2),
                   Done(300)])
    start_stand_ins(monkeypatch, start_worker)
    # The search's steps are the script's, given as run_search's finder.
    scripted = Finder(name="scripted", next_step=lambda config, outcomes: next(script), checks_answer=True)
    config = SearchConfig(budget_bytes=1280 * 2**20)
    trials, done = run_search.run_search(config, WorkerSetup(model_spec="small_cnn"), [], "process_peak",
                                         lambda line: None, fork=Fork(), finder=scripted)
    assert done == Done(300)
    # A child first, then one new process for readings=1, then two side by side for readings=2.
    assert started == ["a fork server", None, None, None]
    assert [trial.forked for trial in trials] == [True, False, False, False]

    # Five missing on a machine with room and cores for two at a time: two side by side, and the
    # search (here its script) asks again for what is left.
    Fork.side_by_side = lambda self, count: count <= 2
    started.clear()
    lines = []
    script = iter([Run(300, fresh=True), Run(300, fresh=True, readings=5), Run(300, fresh=True, readings=3),
                   Run(300, fresh=True, readings=1), Done(300)])
    trials, done = run_search.run_search(config, WorkerSetup(model_spec="small_cnn"), [], "process_peak",
                                         lines.append, fork=Fork(), finder=scripted)
    assert started == ["a fork server"] + [None] * 5
    assert sum("2 side by side" in line for line in lines) == 4, lines

    # A first reading asked of a new process (search._fresh_endgame) is one, with a repeat's steps,
    # where the fork server would give a child; without one, a plain fresh worker.
    steps = []
    monkeypatch.setattr(fresh_workers, "start_worker", lambda setup, server=None: steps.append(setup.steps_per_trial)
                        or start_worker(setup, server))
    for fork, wanted_steps, note in ((Fork(), fresh_workers.REPEAT_STEPS, "(fresh worker, a new process)"),
                                     (None, WorkerSetup(model_spec="small_cnn").steps_per_trial, "(fresh worker)")):
        started.clear()
        steps.clear()
        lines = []
        script = iter([Run(300, fresh=True, new_process=True), Done(300)])
        run_search.run_search(config, WorkerSetup(model_spec="small_cnn"), [], "process_peak", lines.append, fork=fork,
                              finder=scripted)
        trial_lines = [line for line in lines if line.lstrip().startswith("batch ")]
        assert started == [None] and steps == [wanted_steps] and trial_lines[-1].endswith(note), (steps, lines)
        assert lines[-1].startswith("    1 trial, ")  # the time line follows every step


def test_the_malloc_arena_limit_is_read_as_glibc_reads_it():
    from edgebatch.settings.malloc_arenas import malloc_arena_max_in_effect

    assert malloc_arena_max_in_effect({"MALLOC_ARENA_MAX": "1"}) == 1
    assert malloc_arena_max_in_effect({"MALLOC_ARENA_MAX": " 2 "}) == 2
    for ignored in ({}, {"MALLOC_ARENA_MAX": ""}, {"MALLOC_ARENA_MAX": "0"}, {"MALLOC_ARENA_MAX": "two"}):
        assert malloc_arena_max_in_effect(ignored) is None


def test_a_probe_records_the_malloc_arena_limit_it_ran_under_and_reuses_only_under_the_same(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")
    one_arena = ProbeRequest().search_settings()
    assert one_arena["malloc_arena_max"] == 1
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    as_is = ProbeRequest().search_settings()
    assert as_is["malloc_arena_max"] is None
    reason = problem(search=one_arena)
    assert reason == ("it was probed with the malloc arena limit 1 (MALLOC_ARENA_MAX=1), "
                      "this probe asks for glibc's default (MALLOC_ARENA_MAX unset)")
    assert problem(search=one_arena, malloc_arena_max=1) is None


def test_a_profile_from_before_the_arena_limit_was_recorded_counts_as_unset():
    older = {key: value for key, value in SEARCH.items() if key != "malloc_arena_max"}
    assert problem(search=older, malloc_arena_max=None) is None
    assert "probe asks for 1 (MALLOC_ARENA_MAX=1)" in problem(search=older, malloc_arena_max=1)


def test_the_profile_summary_says_which_malloc_arena_limit_its_ceilings_hold_for():
    from profile_factory import make_profile

    from edgebatch.cli.profile_text import format_profile

    recorded = format_profile(make_profile(search={"malloc_arena_max": 1}))
    assert "malloc arenas     1 (MALLOC_ARENA_MAX=1): the ceilings hold for training started with the same" in recorded
    assert "malloc arenas     glibc's default (MALLOC_ARENA_MAX unset)" in format_profile(make_profile())
