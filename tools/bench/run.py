"""Run every benchmark and rewrite BENCHMARKS.md, tools/bench/results/results.json and the PNG plots.

    python tools/bench/run.py [--quick] [--only probe,governor,retracing,training,neighbour]

Sections: 1. probe accuracy and cost (probe_bench.py, probe_truth.py), 2. governor cost
(governor_bench.py), 3. training throughput with and without pressure (training_bench.py,
pressure_child.py), 4. retracing (retracing.py), 5. a neighbour takes memory and gives it back
(neighbour_bench.py, neighbour_child.py). `--quick` keeps the whole run under 5 minutes on
2 cores: each section gets a share of the time and skips (and reports) what would overrun, so a
loaded machine gives a shorter report, not a longer run. Full mode aims at under an hour for what
sections 1-4 measured before issue 10, plus EXTRA_SECONDS (27 minutes) for what came later: the
training and neighbour sections of issue 10, and section 1's binsearch_checked baseline (its runs took
the methods' time before mlp's turn in the 7da295f run, 3393 s with `--budget-seconds 5000`).
Benchmarks report; nothing asserts a timing. With `--only`, the sections not run are carried over
from the results.json already there, and the report names the commit and date each was measured at.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import FULL, QUICK, RESULTS_DIR, ROOT, Deadline, environment, load_average, log, write_json  # noqa: E402

SECTIONS = ("probe", "governor", "retracing", "training", "neighbour")
# Time on top of the allowance the sections share, in full mode, for what issue 10 added: the
# neighbour section's pairs (~4 min each) and the supervised third run of each pressure pair, so
# adding them did not cut the others' time. Quick mode adds nothing (its 5 minutes hold), so there
# the neighbour section runs only with --only neighbour (or when the others left time).
EXTRA_SECONDS = {"quick": {}, "full": {"probe": 600.0, "training": 240.0, "neighbour": 780.0}}
# Where each section must stop, as fractions of the run's allowance (probe: methods, then truth).
QUICK_ENDS = {"probe_methods": 0.53, "probe": 0.70, "governor": 0.75, "retracing": 0.77, "training": 0.98}
FULL_ENDS = {"probe_methods": 0.50, "probe": 0.68, "governor": 0.76, "retracing": 0.81, "training": 0.98}
NOTES = [
    "## How these numbers are made",
    "",
    "- Probe: every method runs on edgebatch's own trial runner (a scout worker process, a fresh worker whenever "
    "the search steps down, `run_search.run_search`); only the finder it is given differs (`tools/bench/finders.py` "
    "holds edgebatch's search and the peers' finders: Lightning's binsearch and power; Accelerate's shrink-on-OOM "
    "from 128 by x0.9 and x0.5, never growing; a DeepSpeed-style "
    "one-shot estimate from a batch-1 step over the worker's baseline memory, checking 0.95/1.0/1.05 x). "
    "'trials' counts trials that ran; 'failed' those that ran out of memory, died or measured over the budget; "
    "'workers' the processes started: fresh ones fork from a fork server that imported TensorFlow once, as `edgebatch "
    "probe` starts them, where the budget leaves room for one (the resident-budget and capped scenarios), else each "
    "costs a TensorFlow import. found/true is the answer over the largest "
    "batch that ran in a fresh process (tests/support/fresh_step.py: its own step, 10 steps); 'unsafe' counts answers "
    "that failed in a fresh process or lie at or above a fresh failure. 'binsearch -5% margin' is Lightning's "
    "binsearch as it hands its answer back (less a 5% margin), derived from the same binsearch runs. "
    "'binsearch_checked' is binsearch held to slow_start's rule for the answer (read in 3 fresh workers, the "
    "first forked, the others new processes; a failed reading makes the answer a failure and the bisection goes on "
    "below it; `tools/bench/finders.py`): 'trials / checked' and 'wall / checked' compare against it, so the "
    "price of that rule drops out of the comparison. Costs to keep "
    "in mind: a worker started as a new process imports TensorFlow (8-20 s here), and a real OOM takes ~10 s to surface on CPU "
    "(TensorFlow's allocator retries before it gives up); a measured over-budget trial costs only its steps.",
    "- Why slow_start misses issue 9's cost targets (trials <= 0.5x and wall <= 0.6x binsearch's) by construction: "
    "its answer rule alone is three readings at the answer (the trial that found it, then two new processes) and a "
    "fresh failure just above it, and its line needs three readings before it may jump. A search that jumped straight "
    "onto the edge would still take 3 + 1 + 1 + 2 = 7 trials, more than half of binsearch's count wherever binsearch "
    "takes fewer than 14. Its wall time would hold the answer's two new processes (a TensorFlow import each; side by "
    "side they took 13.1 s for dense_wide on the AMD host; docs/probe-evidence.md, \"What a probe costs, and why\"), "
    "over 0.6x of a binsearch run "
    "shorter than 22 s (dense_wide's took 16 s). 'trials / checked' and 'wall / checked' take the rule's price out.",
    "- Every process under an address-space cap (probe workers, truth runs, pressure runs) runs with "
    "MALLOC_ARENA_MAX=2: glibc's per-thread arenas reserve 64 MiB of address space each and moved capped "
    "boundaries by ~15% between processes.",
    "- Quick mode runs each probe method once on one scenario; the truth is bracketed as far as its time share "
    "allows, and the tables say how far that was.",
    "- Governor: `Governor.observe` and `PressureReader.read(force=True)` timed by tools/bench/governor_cost.py's "
    "functions, next to the training step of the probe's TrialRunner at the knee batch, in the same repeat.",
    "- Training: samples/s after the first update (which traces), the same timestamps for both loops; "
    "the governed runs use the default PressureReader, so their sensor reads are in the figure. Under pressure, "
    "the static and governed runs of a pair run side by side in two processes (the static one crashes within "
    "~20 s, mostly while the governed one is still importing or meeting its own OOMs); samples/s (all) counts "
    "the whole run including the ~10 s OOMs, 'after last OOM' the pace the governor settled at.",
    "- Retracing: one micro-step body, three wrappings; compile seconds = first call at a new size minus an "
    "immediate second call.",
    "- Neighbour: each run gets its own cgroup v1 memory cgroup (made by the bench, as root) with a 2 GiB limit; the "
    "training (and the governed run's supervisor) and the neighbour are its only processes, so the limit is shared "
    "by exactly those two jobs and an excess is a kernel SIGKILL, as on a device. The neighbour is sized on the "
    "cgroup's own peak charge, not on RSS: a TensorFlow process's RSS includes ~290 MiB of shared library pages "
    "charged elsewhere (VmHWM 1269 MiB against a cgroup peak of 982 MiB at micro-batch 256). Samples/s count an "
    "update lost with a killed child (run again after the restart) once, at its second run.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish in under 5 minutes (fewer repeats and models)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    parser.add_argument("--markdown", default=str(ROOT / "BENCHMARKS.md"), help="where to write the report")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR), help="where to write results.json and the plots")
    parser.add_argument("--budget-seconds", type=float, default=None,
                        help="override the run's time allowance (to try full mode's code paths briefly)")
    parser.add_argument("--render-only", action="store_true", help="redo BENCHMARKS.md and the plots from results.json")
    args = parser.parse_args(argv)
    if args.render_only:
        render(Path(args.results_dir), Path(args.markdown))
        return 0
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown!r}: choose from {', '.join(SECTIONS)}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    mode = QUICK if args.quick else FULL
    if args.budget_seconds is not None:
        mode = harness.Mode(mode.name, mode.repeats, args.budget_seconds)
    ends = _ends(QUICK_ENDS if args.quick else FULL_ENDS, mode.budget_seconds,
                 {name: s for name, s in EXTRA_SECONDS[mode.name].items() if name in only})
    mode = harness.Mode(mode.name, mode.repeats, mode.budget_seconds * ends.pop("total_over_base"))
    deadline = Deadline(mode.budget_seconds)
    command = " ".join(["python tools/bench/run.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    results: dict = {"mode": {"name": mode.name, "repeats": mode.repeats, "budget_seconds": mode.budget_seconds},
                     "command": command, "environment": environment(), "sections": {}, "errors": {},
                     "section_seconds": {}}
    runners = {
        "probe": lambda: _section("probe_bench").run(mode, deadline, ends["probe_methods"], ends["probe"]),
        "governor": lambda: _section("governor_bench").run(mode, deadline, ends["governor"]),
        "retracing": lambda: _section("retracing").run(mode, deadline, ends["retracing"]),
        "training": lambda: _section("training_bench").run(mode, deadline, ends["training"]),
        "neighbour": lambda: _section("neighbour_bench").run(mode, deadline, ends["neighbour"]),
    }
    for name in SECTIONS:
        if name not in only:
            continue
        log(f"section {name} ({deadline.elapsed():.0f} s into the run)")
        started = time.perf_counter()
        try:
            results["sections"][name] = runners[name]()
        except Exception:  # noqa: BLE001 - one broken section should not cost the others' numbers
            results["errors"][name] = traceback.format_exc()
            log(f"section {name} failed:\n{results['errors'][name]}")
        results["section_seconds"][name] = round(time.perf_counter() - started, 1)
    results["environment"]["load_average_at_end"] = load_average()
    results["seconds"] = deadline.elapsed()
    results["notes"] = NOTES
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    _carry_over(results, out / "results.json", only)
    write_json(out / "results.json", results)
    render(out, Path(args.markdown))
    log(f"wrote {args.markdown} and {out}/ in {deadline.elapsed():.0f} s")
    return 0


def _ends(shares: dict[str, float], base_seconds: float, extra_seconds: dict[str, float]) -> dict[str, float]:
    """Each section's end as a fraction of the whole allowance (base + extras): its share of the base
    plus the extra time of the sections up to it; the neighbour section (no share) ends 1% before
    the whole. Also `total_over_base`, the factor for the allowance."""
    total = base_seconds + sum(extra_seconds.values())
    ends = {}
    for name, share in shares.items():
        section = "probe" if name == "probe_methods" else name
        before = sum(s for other, s in extra_seconds.items() if SECTIONS.index(other) <= SECTIONS.index(section))
        ends[name] = (share * base_seconds + before) / total
    ends["neighbour"] = (total - 0.01 * base_seconds) / total
    ends["total_over_base"] = total / base_seconds
    return ends


def _carry_over(results: dict, previous_path: Path, only: list[str]) -> None:
    """With --only, the sections not run now are kept from the previous results.json, each with the
    commit, date and command it was measured with (report.py names them), so one section can be
    rerun alone."""
    if set(only) >= set(SECTIONS) or not previous_path.exists():
        return
    previous = json.loads(previous_path.read_text())
    env = previous.get("environment", {})
    for name in SECTIONS:
        if name in only or not previous.get("sections", {}).get(name):
            continue
        results["sections"][name] = previous["sections"][name]
        results.setdefault("carried", {})[name] = previous.get("carried", {}).get(name) or {
            "git_commit": env.get("git_commit"), "date_utc": env.get("date_utc"),
            "mode": previous.get("mode", {}).get("name"), "command": previous.get("command"), "cpu": env.get("cpu"),
        }


def render(out: Path, markdown: Path) -> None:
    """BENCHMARKS.md and the plots from results.json (so a report can be redone without a rerun)."""
    results = json.loads((out / "results.json").read_text())
    report = _section("report")
    try:
        report.write_plots(results, out)
    except Exception:  # noqa: BLE001 - the tables are still worth writing
        results["errors"]["plots"] = traceback.format_exc()
        log(f"plots failed:\n{results['errors']['plots']}")
        write_json(out / "results.json", results)
    report.write_markdown(results, markdown, out)


def _section(module: str):
    import importlib

    return importlib.import_module(module)


if __name__ == "__main__":
    raise SystemExit(main())
