"""Section 1: probe accuracy and cost, slow_start against the peers' finders on the same trial runner.

Every method runs through edgebatch's own runner (a scout worker, fresh workers whenever the search
steps down, run_search.run_search's loop); only its `finder` differs (finders.py: edgebatch's search
and the peers'), so the comparison is between decisions, not implementations. Methods are
interleaved within each repeat so that the machine's noise falls on all of them alike, and each
repeat's trials and seconds are divided by binsearch's of the same repeat. The truth comes
afterwards from fresh processes (probe_truth.py). Run alone, `python tools/bench/probe_bench.py
--finder NAME --model MODEL` probes one model with one finder through api.run_probe (main).

Budgets: a scenario either caps the workers' address space (`headroom_bytes`: real OOMs, clean
ResourceExhaustedError for dense kernels, segfaults for some others, both counted as failures), or
sets a plain resident budget (`budget_bytes`) under which a trial fails when its measured peak is
over it. Under a cap the search is told the room the cap leaves (the scout's resident baseline +
headroom), as a probe of a device of that size would be (on CPU its default budget is the RAM and
cgroup room it reads), or, with `search_knows_cap=False`, only the machine's RAM, so that no method
knows where the limit is. The truth follows the physical rule: under a cap, whether a fresh process
runs; under a budget, whether its peak fits. A batch fits the truth only when it fits in
probe_truth.TRUTH_READINGS new processes one after another, twice as many where their peaks differ
by more than the noise (peaks differ between processes on some hosts: docs/probe-evidence.md,
"Peaks that differ between processes"). Since a sample of three cannot say how often a batch
goes over, slow_start's largest answer, its largest safe_batch (what the profile gives training:
under the budget less the default 10% headroom) and the truth's ceiling are then run in
probe_truth.ANSWER_PROCESSES more new processes each, one after another, and the report gives how
many went over with a 95% bound on the share that would (probe_truth.answer_failures).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass

from harness import MIB, ROOT, Deadline, Mode, capped_malloc_arenas, log, ratio_stat, stat_of
from answer_failures import batches_to_count, profile_safe_batch
from finders import FINDERS
from probe_truth import ANSWER_PROCESSES, answer_failures, judge, measure_truth, truth_seconds_left

# (finder, start batch), by finders.FINDERS' names. Accelerate's finder starts at its default 128 and
# only shrinks; the one-shot estimate calibrates at 1; the rest start where the probe does.
METHODS = (
    ("slow_start", 8),
    ("binsearch", 8),
    # binsearch held to slow_start's answer rule (search.py): what that rule costs apart from the search.
    ("binsearch_checked", 8),
    ("power", 8),
    ("one_shot_estimate", 1),
    ("shrink_x0.9", 128),
    ("shrink_x0.5", 128),
)
# What section 1 counts in probe_truth.ANSWER_PROCESSES more new processes, besides the truth's
# ceiling (answer_failures.batches_to_count): slow_start's largest answer, and its largest safe_batch,
# the batch the profile gives training.
COUNTED = ("slow_start", "slow_start:safe")
# A method's first run is assumed to cost this much (later runs: what its last run took); the
# cheap baselines take 8-20 s here, slow_start and binsearch 35-100 s.
FIRST_RUN_GUESS_SECONDS = 15.0
BINSEARCH_MARGIN = "binsearch -5% margin"
LIGHTNING_MARGIN = 0.05


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str  # a model spec: built-in name or FILE.py:FUNCTION
    max_batch_limit: int  # the largest batch a method may try
    headroom_bytes: int | None = None  # address-space cap over the worker's size after setup
    budget_bytes: int | None = None  # plain resident budget (scenarios without a cap)
    search_knows_cap: bool = True  # with a cap: the search's budget is baseline + headroom, else the RAM
    steps_per_trial: int = 3
    # Repeats in full mode (None: the mode's); quick mode runs every method once.
    full_repeats: int | None = None


# dense_wide (tests/models/dense_wide.py: dense kernels only, few weights, ~2.1 MiB per sample).
# Measured in fresh processes here: peak 1230 MiB at batch 256, 1502 MiB at 384, so 1400 MiB puts
# the ceiling near 335. Quick mode uses this plain budget: its failures cost a measurement, while a
# real OOM costs ~10 s (TensorFlow's allocator retries before it gives up) and quick mode has no
# time for many. Under address-space caps the boundary moves in steps (the allocator reserves
# regions by doubling): dense_wide ran 128 and failed at 129-130 under both 300 and 400 MiB caps,
# and mlp's boundary under 128 MiB moved between 16k and 21k from one fresh process to the next.
DENSE_WIDE = f"{ROOT / 'tests' / 'models' / 'dense_wide.py'}:build"
QUICK_SCENARIOS = (Scenario("dense_wide, 1.37 GiB resident budget", DENSE_WIDE, 4096, budget_bytes=1400 * MIB),)
# Full mode: the first two scenarios get the mode's repeats; the others one run per method (coverage,
# said so in the report): an hour on 2 shared cores holds no more.
FULL_SCENARIOS = QUICK_SCENARIOS + (
    # tests/test_probe_real.py's budget: ceiling near 340 at ~2.5 MiB per sample.
    Scenario("small_cnn, 1.5 GiB resident budget", "small_cnn", 4096, budget_bytes=1536 * MIB),
    # Real OOMs: the search is told the room the cap leaves, then only the RAM.
    Scenario("dense_wide, 300 MiB address-space cap", DENSE_WIDE, 4096, headroom_bytes=300 * MIB, full_repeats=1),
    Scenario("dense_wide, 300 MiB cap, search told only the RAM", DENSE_WIDE, 4096, headroom_bytes=300 * MIB,
             search_knows_cap=False, full_repeats=1),
    # docs/tensorflow-memory.md: 849 MiB + 11.6 MiB per sample, so a ceiling near 60: under 128, where the
    # shrink-from-128 finders have something to find.
    Scenario("mobilenet_v2 96px, 1.5 GiB resident budget", "mobilenet_v2", 4096, budget_bytes=1536 * MIB,
             full_repeats=1),
    # Measured here: 785 MiB at batch 64, 1025 MiB at 512 (fresh process), so a ceiling near 1000.
    Scenario("text_cnn, 1.25 GiB resident budget", "text_cnn", 8192, budget_bytes=1280 * MIB, full_repeats=1),
    # A built-in model under a cap (mlp: ~10 KiB per sample; a noisy boundary, see above).
    Scenario("mlp, 256 MiB address-space cap", "mlp", 65536, headroom_bytes=256 * MIB, full_repeats=1),
)

class _CountingList(list):
    """The probe's worker list, counting every worker put in (fresh_workers.worker_for also takes closed ones out)."""

    appended = 0

    def append(self, item) -> None:
        self.appended += 1
        super().append(item)


def run_method(scenario: Scenario, strategy: str, start_batch: int) -> dict:
    """One probe by the finder named `strategy` (finders.FINDERS) on edgebatch's trial runner; what it
    found and what it cost."""
    from edgebatch.errors import EdgebatchError
    from edgebatch.probing import fresh_workers, margins, run_search
    from edgebatch.probing.search import SearchConfig
    from edgebatch.probing.worker import WorkerSetup, start_worker
    from edgebatch.models.zoo import parse_model_spec

    setup = WorkerSetup(
        model_spec=parse_model_spec(scenario.model).text,
        device="CPU:0",
        steps_per_trial=scenario.steps_per_trial,
        address_space_headroom_bytes=scenario.headroom_bytes,
    )
    workers = _CountingList()
    trials, found, safe, error, baseline, budget, fork, forked = [], None, None, None, None, scenario.budget_bytes, None, False
    started = time.perf_counter()
    try:
        scout = start_worker(setup)
        workers.append(scout)
        baseline = scout.facts.get("baseline_process_bytes")
        if budget is None and scenario.search_knows_cap:
            budget = baseline + scenario.headroom_bytes
        elif budget is None:
            from edgebatch.sensors import read_host_memory

            budget = read_host_memory().total_bytes
        # What api.run_probe passes on CPU: a trial fits under the budget less the measurement
        # margin (margins.fit_budget_bytes), for every method alike.
        config = SearchConfig(
            budget_bytes=margins.fit_budget_bytes(budget, setup.inter_op_threads), start_batch=start_batch,
            max_batch_limit=scenario.max_batch_limit, refuse_predicted_over_budget=True,
            baseline_bytes=baseline, bump_edge_fraction=margins.bump_edge_fraction(setup.inter_op_threads),
        )
        # Fresh workers as `edgebatch probe` starts them: forked from a fork server where the device
        # has room for one beside the budget (fresh_workers.FreshWorkers), else new processes. Every method
        # gets the same runner.
        fork = fresh_workers.FreshWorkers("CPU:0", budget, lambda line: None)
        trials, final = run_search.run_search(config, setup, workers, "process_peak", lambda line: None, fork,
                                              finder=FINDERS[strategy])
        found = final.max_batch
        # The batch the profile would give training (the governor's ceiling): build_profile.build_profile's
        # reading of the same trials, at the default headroom, multiple 1.
        if found:
            safe = profile_safe_batch(trials, config.budget_bytes, found)
        forked = fork.server is not None
    except EdgebatchError as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        for worker in workers:
            worker.close()
        if fork is not None:
            fork.close()  # after its children: they die with it
    seconds = time.perf_counter() - started
    measured = [t for t in trials if t.measured]
    return {
        "strategy": strategy,
        "start_batch": start_batch,
        "found": found,
        "safe_batch": safe,
        "error": error,
        "wall_seconds": round(seconds, 2),
        "trials": len(measured),
        "failed_trials": sum(not t.ok for t in measured),
        "oom_trials": sum(t.error in ("oom", "worker_killed") for t in measured),
        "skipped": len(trials) - len(measured),
        "workers_started": workers.appended,
        "fork_server": forked,
        # TensorFlow inter-op threads in the workers; the truth's fresh processes run the same (probe_truth.py).
        "inter_op_threads": setup.inter_op_threads,
        "baseline_bytes": baseline,
        "budget_bytes": budget,
        "trial_log": [
            {"batch": t.batch, "ok": t.ok, "error": t.error, "peak_bytes": t.peak_bytes, "measured": t.measured,
             "samples_per_second": t.samples_per_second, "fresh": t.fresh, "forked": t.forked}
            for t in trials
        ],
    }


def run_scenario(scenario: Scenario, repeats: int, methods_until, truth_until, section_until=None) -> dict:
    with capped_malloc_arenas() if scenario.headroom_bytes else nullcontext():
        return _run_scenario(scenario, repeats, methods_until, truth_until, section_until or truth_until)


def _run_scenario(scenario: Scenario, repeats: int, methods_until, truth_until, section_until) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name, _ in METHODS}
    skipped = []
    cost = {name: FIRST_RUN_GUESS_SECONDS for name, _ in METHODS}
    for repeat in range(repeats):
        for name, start in METHODS:
            if methods_until() < cost[name]:
                skipped.append(f"{name} repeat {repeat + 1}: time budget")
                continue
            run = run_method(scenario, name, start)
            run["repeat"] = repeat
            cost[name] = run["wall_seconds"]
            runs[name].append(run)
            log(f"probe {scenario.model.split('/')[-1]} {name:>18}: found {run['found']} in {run['trials']} trials "
                f"({run['failed_trials']} failed), {run['wall_seconds']:.0f} s {run['error'] or ''}")
    found = [r["found"] for method in runs.values() for r in method]
    hints = [t["batch"] for method in runs.values() for r in method for t in r["trial_log"] if t["measured"] and not t["ok"]]
    truth = measure_truth(
        scenario.model, found, hints,
        budget_bytes=scenario.budget_bytes, headroom_bytes=scenario.headroom_bytes,
        seconds_left=truth_seconds_left(truth_until, section_until),
    )
    # Lightning's binsearch hands back its answer less a 5% margin (margin=0.05, binsearch only); the
    # finder here stops before that step, so the margin is applied to the same runs.
    runs[BINSEARCH_MARGIN] = [
        {**run, "strategy": BINSEARCH_MARGIN, "derived_from": "binsearch", "trial_log": [],
         "found": int(run["found"] * (1 - LIGHTNING_MARGIN)) if run["found"] else None}
        for run in runs["binsearch"]
    ]
    for method in runs.values():
        for run in method:
            run.update(judge(run["found"], truth))
    # How often training at slow_start's largest answer, and at the truth's ceiling, goes over: the
    # truth says whether three (or six) new processes fitted, this counts ANSWER_PROCESSES of them
    # (tools/bench/answer_failures.py does the same for a kept results file). From what is left of
    # the scenario's share.
    counted = []
    for batch, names in batches_to_count({"runs": runs, "truth": truth}, COUNTED, True).items():
        count = answer_failures(scenario.model, batch, scenario.budget_bytes, scenario.headroom_bytes,
                                ANSWER_PROCESSES, seconds_left=truth_until)
        counted.append({"answer_of": names, **count})
        log(f"probe {scenario.model.split('/')[-1]} {' and '.join(names)} {batch}: over in {count['over']} of "
            f"{count['processes']} new processes")
    return {
        "scenario": asdict(scenario),
        "truth": truth,
        "answer_failures": counted,
        "runs": runs,
        "summary": summarise(runs),
        "skipped": skipped,
    }


# Where a trial ran, from its trial_log entry: a worker that had run earlier trials (the scout or a
# worker the search kept growing), a fork-server child, or a new process (a fresh trial not forked;
# the scout's first trial too). A new process costs a TensorFlow import (8-20 s here), a child a
# model build and trace, a reused worker only its steps: the kinds price a probe's wall time.
WORKER_KINDS = ("reused", "forked", "new_process")


def worker_kind(trial: dict) -> str | None:
    """WORKER_KINDS' name for a measured trial_log entry; None for an entry from before the log
    recorded `fresh` (results of earlier commits)."""
    if "fresh" not in trial:
        return None
    if not trial["fresh"]:
        return "reused"
    return "forked" if trial.get("forked") else "new_process"


def trials_by_worker(method: list[dict]) -> dict | None:
    """Per worker kind (in WORKER_KINDS' order), the Stat over runs of how many measured trials ran
    there; None when no run recorded it."""
    counts = []
    for run in method:
        kinds = [worker_kind(t) for t in run.get("trial_log", []) if t.get("measured")]
        if kinds and None not in kinds:
            counts.append({kind: kinds.count(kind) for kind in WORKER_KINDS})
    if not counts:
        return None
    return {kind: stat_of([c[kind] for c in counts]) for kind in WORKER_KINDS}


def summarise(runs: dict[str, list[dict]]) -> dict:
    """Per method: Stats of trials, failures, seconds, found, found/true; ratios by repeat to binsearch
    and to binsearch_checked (binsearch held to slow_start's answer rule)."""
    # Repeat i of a method against repeat i of the reference: the same stretch of machine time (a
    # repeat skipped for time on either side leaves the pair out).
    def versus(method: list[dict], key: str, reference_name: str):
        reference = {r["repeat"]: r for r in runs.get(reference_name, [])}
        pairs = [(r[key], reference[r["repeat"]][key]) for r in method if r["repeat"] in reference]
        return ratio_stat([a for a, _ in pairs], [b for _, b in pairs])

    summary = {}
    for name, method in runs.items():
        if not method:
            continue
        summary[name] = {
            "runs": len(method),
            "trials": stat_of([r["trials"] for r in method]),
            "failed_trials": stat_of([r["failed_trials"] for r in method]),
            "wall_seconds": stat_of([r["wall_seconds"] for r in method]),
            "workers_started": stat_of([r["workers_started"] for r in method]),
            "trials_by_worker": trials_by_worker(method),
            "found": stat_of([r["found"] for r in method]),
            "found_over_true": stat_of([r.get("found_over_true") for r in method]),
            "found_over_edge": stat_of([r.get("found_over_edge") for r in method]),
            "unsafe_runs": sum(bool(r.get("unsafe")) for r in method),
            "unchecked_runs": sum(r.get("unsafe") is None for r in method),
            "no_answer_runs": sum(r["found"] is None for r in method),
            "trials_vs_binsearch": versus(method, "trials", "binsearch"),
            "wall_vs_binsearch": versus(method, "wall_seconds", "binsearch"),
            "trials_vs_checked": versus(method, "trials", "binsearch_checked"),
            "wall_vs_checked": versus(method, "wall_seconds", "binsearch_checked"),
        }
    return summary


def run(mode: Mode, deadline: Deadline, methods_end: float, truth_end: float) -> dict:
    """Section 1 of the run. Methods may use the allowance up to `methods_end` (a fraction of the
    whole run's), their truths up to `truth_end`."""
    scenarios = QUICK_SCENARIOS if mode.quick else FULL_SCENARIOS
    # EDGEBATCH_BENCH_SCENARIOS="mobilenet_v2,mlp": only the scenarios whose names contain one of these
    # (a targeted rerun; write it elsewhere with --markdown and --results-dir, not over the full table).
    wanted = [part.strip() for part in os.environ.get("EDGEBATCH_BENCH_SCENARIOS", "").split(",") if part.strip()]
    if wanted:
        scenarios = tuple(s for s in scenarios if any(part in s.name for part in wanted))
    # Quick mode runs each method once: one probe costs 1-6 worker starts of 8-20 s each here, and
    # every real OOM about 10 s more (the allocator retries before it gives up).
    repeats = [1 if mode.quick else (s.full_repeats or mode.repeats) for s in scenarios]
    start = deadline.elapsed() / deadline.seconds
    methods_share = (methods_end - start) / (truth_end - start)
    results = []
    for index, scenario in enumerate(scenarios):
        # The scenarios still to run share what is left in proportion to their repeats; within a
        # share, the methods come first and the truth gets the rest.
        now = deadline.elapsed() / deadline.seconds
        share = (truth_end - now) * repeats[index] / sum(repeats[index:])
        result = run_scenario(
            scenario, repeats[index],
            methods_until=lambda stop=now + share * methods_share: deadline.until(stop),
            truth_until=lambda stop=now + share: deadline.until(stop),
            section_until=lambda: deadline.until(truth_end),
        )
        result["repeats"] = repeats[index]
        results.append(result)
    return {"repeats": max(repeats), "scenarios": results}


def main(argv: list[str] | None = None) -> int:
    """One finder through `edgebatch probe`'s own path (api.run_probe) on one model: its answer and trials."""
    parser = argparse.ArgumentParser(
        description="Probe one model with one batch finder (edgebatch's slow_start or a peer's) on edgebatch's own "
                    "trial runner. `python tools/bench/run.py --only probe` compares them all (BENCHMARKS.md).")
    parser.add_argument("--finder", required=True, choices=list(FINDERS), help="the finder (tools/bench/finders.py)")
    parser.add_argument("--model", default="mobilenet_v2", help="a built-in name, FILE.py:FUNCTION or a .keras file")
    parser.add_argument("--memory-budget", default=None, help="e.g. 1.5GiB (default: what the device can give now)")
    parser.add_argument("--device", default=None, help="CPU:0 or GPU:N (default: as edgebatch probe)")
    parser.add_argument("--max-batch-limit", type=int, default=None, help="never try a batch above this")
    parser.add_argument("--start", type=int, default=None, help="first batch (default: the finder's, METHODS)")
    args = parser.parse_args(argv)
    from edgebatch.errors import EdgebatchError, UsageError
    from edgebatch.probing.api import ProbeRequest, run_probe

    limit = {} if args.max_batch_limit is None else {"max_batch_limit": args.max_batch_limit}
    request = ProbeRequest(model=args.model, device=args.device, memory_budget=args.memory_budget,
                           start=args.start or dict(METHODS)[args.finder], **limit)
    try:
        # Never cached: a profile is an answer for training, and a peer's is there to be compared.
        profile = run_probe(request, finder=FINDERS[args.finder], force=True, save=False, progress=print)
    except EdgebatchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    trials = sum(t.measured for t in profile.trials)
    print(f"{args.finder}: max_batch {profile.max_batch}, safe_batch {profile.safe_batch}, {trials} trials")
    return 0


if __name__ == "__main__":
    sys.exit(main())
