"""How often does training at a benchmark's answer go over the budget? Count it in new processes.

The probe benchmark's truth (tools/bench/probe_truth.py) calls a batch safe when it fits in three
new processes, six where their peaks differ. On hosts where each new process draws one of a few
peak levels (docs/probe-evidence.md, "Peaks that differ between processes") that is a sample,
not a rate: a level drawn one time in three passes three processes 30% of the time. This tool
reads a results file of `tools/bench/run.py --only probe`, and for each scenario runs N new
processes (tests/support/fresh_step.py, the truth's own step, 10 steps each, one after another) at
each chosen method's largest answer (METHOD:safe: its largest safe_batch, the batch a profile gives
training) and, with `--truth`, at the truth's ceiling, and counts those
that go over the budget (under an address-space cap: those that fail to run). It logs one line per
process, writes the measurement as JSON (`--out`, by default
tools/bench/results/answer_failures.json), and prints its BENCHMARKS.md section: the count and the
95% upper bound on the share of processes that go over (probe_truth.failure_share_upper);
`--benchmarks-md BENCHMARKS.md` puts the section there, `--from-json` renders a kept measurement again
(given more than once, the merge of several, written to `--out`: counts of one batch add up).
`--explain-safe` runs nothing: it prints, per scenario, the budget, the memory line and the readings
that set slow_start's safe_batch (summary.anchor_bounds).
`--trial-log` runs nothing either: it prints every slow_start run's trials, in order, with each
reading and where it was read.

    python tools/bench/answer_failures.py tools/bench/results/results.json --truth --benchmarks-md BENCHMARKS.md

It runs what the benchmark ran: the scenario's model, budget or cap (capped scenarios with two
malloc arenas, as probe_bench.run_scenario starts them) and one inter-op thread. A process costs a
TensorFlow import, 10-30 s here. Run it on the machine kind the results came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path

from harness import MIB, RESULTS_DIR, ROOT, capped_malloc_arenas, environment, log, publish_section, write_json
from probe_truth import ANSWER_PROCESSES, SHARE_CONFIDENCE, answer_failures, failure_share_upper

SECTION_START = "<!-- answer_failures:start -->"
SECTION_END = "<!-- answer_failures:end -->"


def batches_to_count(scenario: dict, methods: list[str], with_truth: bool) -> dict[int, list[str]]:
    """Batch -> what it is, largest batch first: for each of `methods`, the largest answer of its runs
    ("slow_start") or, with ":safe", the largest safe_batch ("slow_start:safe", safe_batch_of_run),
    with ":safe_now" the largest the current rule reads from its trial log (profile_safe_batch,
    whatever the run recorded); with `with_truth`, the truth's ceiling ("truth")."""
    named: dict[int, list[str]] = {}
    for method in methods:
        name, _, part = method.partition(":")
        runs = scenario["runs"].get(name, [])
        batches = [_batch_of(run, part) for run in runs]
        batches = [b for b in batches if b]
        if batches:
            named.setdefault(max(batches), []).append(method)
    ceiling = scenario["truth"].get("ceiling")
    if with_truth and ceiling:
        named.setdefault(ceiling, []).append("truth")
    return dict(sorted(named.items(), reverse=True))


def _batch_of(run: dict, part: str) -> int | None:
    if part == "safe":
        return safe_batch_of_run(run)
    if part == "safe_now":
        return safe_batch_of_run({key: value for key, value in run.items() if key != "safe_batch"})
    return run.get("found")


def safe_batch_of_run(run: dict) -> int | None:
    """The safe_batch a profile of this benchmark run would record: what the run recorded
    (probe_bench.run_method, since 2026-12-07), else profile_safe_batch of its trial log. None for
    a run without an answer or without a trial log."""
    if "safe_batch" in run:
        return run["safe_batch"]
    if not run.get("found") or not run.get("trial_log") or not run.get("budget_bytes"):
        return None
    return profile_safe_batch(trials_of_run(run), fit_budget_of_run(run), run["found"])


def profile_safe_batch(trials, fit_budget_bytes: int, found: int) -> int | None:
    """build_profile.build_profile's safe_batch of these trials: summary.safe_batch_of at the default
    headroom, multiple 1, with the trials' own memory model."""
    from edgebatch.probing import api, summary

    return summary.safe_batch_of(trials, fit_budget_bytes, api.ProbeRequest().headroom, 1,
                                 summary.memory_model_of(trials), found)


def trials_of_run(run: dict) -> list:
    """A benchmark run's trial log as the probe's Trial records (what the log keeps of them)."""
    from edgebatch.profiles.model import Trial

    return [Trial(batch=t["batch"], ok=t["ok"], error=t["error"], peak_bytes=t["peak_bytes"],
                  process_peak_bytes=t["peak_bytes"], allocator_peak_bytes=None, step_seconds=None,
                  samples_per_second=t.get("samples_per_second"), measured=t["measured"],
                  fresh=bool(t.get("fresh")), forked=t.get("forked"))
            for t in run["trial_log"]]


def fit_budget_of_run(run: dict) -> int:
    """The budget a run's trials were judged by: its budget less the measurement margin."""
    from edgebatch.probing import margins

    return margins.fit_budget_bytes(run["budget_bytes"], run.get("inter_op_threads") or 1)


def explain_safe(scenario: dict, method: str = "slow_start", shown: int = 3) -> list[str]:
    """Why the largest answer's run of `method` has the safe_batch it has: its budget before and
    after the spread lowered it, its memory line, and of the levels that decide it (those at or
    above it and the nearest below: summary.line_safe_batch), the `shown` that allow least
    (summary.level_bounds)."""
    from edgebatch.probing import api, summary

    runs = [run for run in scenario["runs"].get(method, []) if run.get("found") and run.get("trial_log")]
    if not runs:
        return [f"{scenario['scenario']['name']}: no {method} run with a trial log"]
    run = max(runs, key=lambda r: r["found"])
    trials, budget = trials_of_run(run), fit_budget_of_run(run)
    model = summary.memory_model_of(trials)
    lines = [f"{scenario['scenario']['name']}: {method} answered {run['found']}, safe_batch "
             f"{profile_safe_batch(trials, budget, run['found'])}; budget {budget / MIB:,.1f} MiB, judged "
             f"{summary.judged_budget_bytes(trials, budget) / MIB:,.1f} MiB"]
    if model is None or model.per_sample_bytes <= 0:
        return lines + ["  no trusted memory line: the largest fit under the reduced budget"]
    lines.append(f"  line {model.fixed_bytes / MIB:,.1f} MiB + {model.per_sample_bytes / MIB:.4f} MiB per sample")
    safe = profile_safe_batch(trials, budget, run["found"])
    bounds = summary.level_bounds(trials, budget * (1 - api.ProbeRequest().headroom), model.per_sample_bytes,
                                  run["found"])
    below = [pair for pair in bounds if pair[1].batch < safe]
    deciding = [pair for pair in bounds if pair[1].batch >= safe] + sorted(below, key=lambda p: p[1].batch)[-1:]
    for bound, trial in sorted(deciding, key=lambda pair: pair[0])[:shown]:
        lines.append(f"  allows {bound}: {trial.batch} read at {trial.peak_bytes / MIB:,.1f} MiB in a {_where(trial)} "
                     f"({(trial.peak_bytes - model.predict_bytes(trial.batch)) / MIB:+,.1f} MiB from the line)")
    return lines


def trial_log_lines(scenario: dict, method: str = "slow_start") -> list[str]:
    """Every run of `method` in a scenario, trial by trial in the order they ran: batch, outcome,
    the reading in MiB and where it was read (the figures docs/probe-evidence.md quotes from a
    run's trials)."""
    lines = [f"{scenario['scenario']['name']}:"]
    for number, run in enumerate(scenario["runs"].get(method, []), 1):
        lines.append(f"  {method} run {number}: answered {run.get('found')}")
        for trial in trials_of_run(run) if run.get("trial_log") else []:
            outcome = "fits" if trial.ok else (trial.error or "failed")
            reading = "-" if trial.peak_bytes is None else f"{trial.peak_bytes / MIB:,.1f} MiB"
            where = _where(trial) if trial.measured else "predicted, not run"
            lines.append(f"    {trial.batch} {outcome}: {reading} ({where})")
    return lines


def _where(trial) -> str:
    """Where a trial was read: a reused worker, a fork-server child or a new process."""
    return "reused worker" if not trial.fresh else ("fork-server child" if trial.forked else "new process")


def local_model_spec(spec: str) -> str:
    """`spec` with a model file from another checkout (the benchmark may run in a worktree, and
    records the file's absolute path) moved to this one's: /tmp/bw/tests/models/x.py:build ->
    ROOT/tests/models/x.py:build. Built-in names and files that exist are kept."""
    path, colon, function = spec.rpartition(":")
    if not colon or not path.endswith(".py") or Path(path).exists() or "/tests/" not in path:
        return spec
    return f"{ROOT / 'tests' / path.rsplit('/tests/', 1)[1]}:{function}"


def _one_line(error: str) -> str:
    """An error for a log line: on one line, cut to 80 characters (TensorFlow's run to many lines)."""
    return " ".join(error.split())[:80]


def _peak_mib(peak: int | None) -> str:
    return "-" if peak is None else f"{peak / MIB:,.1f}"


def read_results(path: Path) -> dict:
    """A probe benchmark results file; ValueError, saying what is wrong, for anything else."""
    try:
        results = json.loads(path.read_text())
        results["sections"]["probe"]["scenarios"][0]["scenario"]["name"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"{path} is not a results file of tools/bench/run.py --only probe "
                         f"({type(exc).__name__}: {exc})") from None
    return results


def count(results: dict, results_path: Path, processes: int, methods: list[str], with_truth: bool,
          wanted: list[str]) -> dict:
    """The measurement: for each scenario of `results` (those whose names contain a part of
    `wanted`, or all), answer_failures at each batch batches_to_count names."""
    scenarios = results["sections"]["probe"]["scenarios"]
    data = {"environment": environment(), "results": str(results_path),
            "results_environment": results.get("environment", {}), "processes": processes, "measured": []}
    for scenario in scenarios:
        facts = scenario["scenario"]
        if wanted and not any(part in facts["name"] for part in wanted):
            continue
        model, budget, headroom = local_model_spec(facts["model"]), facts.get("budget_bytes"), facts.get("headroom_bytes")
        with capped_malloc_arenas() if headroom else nullcontext():
            for batch, names in batches_to_count(scenario, methods, with_truth).items():
                def progress(check, batch=batch):
                    log(f"{facts['name']}: {batch} in a new process: {'fits' if check['fits'] else 'OVER'} "
                        f"({_peak_mib(check['peak_bytes'])} MiB{', ' + _one_line(check['error']) if check['error'] else ''}, "
                        f"{check['seconds']:.0f} s)")

                counted = answer_failures(model, batch, budget, headroom, processes, progress=progress)
                data["measured"].append({"scenario": facts["name"], "budget_bytes": budget,
                                         "headroom_bytes": headroom, "answer_of": names, **counted})
    return data


def merge(kept: list[dict]) -> dict:
    """One measurement of several counts of the same results file: rows of one scenario and batch
    add their processes, failures, peaks and seconds, and name every method they were the answer of;
    scenarios keep the order they first appear in, batches run largest first. The first
    measurement's environment stands for all (each keeps its own under `merged`)."""
    rows: dict[tuple[str, int], dict] = {}
    for data in kept:
        for row in data["measured"]:
            key = (row["scenario"], row["batch"])
            if key not in rows:
                rows[key] = {**row, "answer_of": list(row["answer_of"]), "peaks": list(row["peaks"]),
                             "errors": list(row.get("errors", []))}
                continue
            into = rows[key]
            into["answer_of"] += [name for name in row["answer_of"] if name not in into["answer_of"]]
            into["peaks"] += row["peaks"]
            into["errors"] = sorted(set(into["errors"]) | set(row.get("errors", [])))
            into["processes"] += row["processes"]
            into["over"] += row["over"]
            into["seconds"] = round(into["seconds"] + row["seconds"], 1)
    for row in rows.values():
        row["share_upper"] = failure_share_upper(row["over"], row["processes"]) if row["processes"] else None
    order = list(dict.fromkeys(scenario for scenario, _ in rows))
    measured = sorted(rows.values(), key=lambda row: (order.index(row["scenario"]), -row["batch"]))
    first = kept[0]
    merged = {**first, "measured": measured}
    if len(kept) > 1:
        merged["merged"] = [{key: data.get(key) for key in ("environment", "processes")} for data in kept]
    return merged


def render(data: dict) -> str:
    """The BENCHMARKS.md section of a measurement."""
    env, source = data.get("environment", {}), data.get("results_environment", {})
    dates = [(run.get("environment") or {}).get("date_utc", "-") for run in data.get("merged", [])]
    when = (f"{len(dates)} runs merged, started {', '.join(dates)}" if dates
            else env.get("date_utc", "-"))
    rows = []
    for row in data["measured"]:
        peaks = [p for p in row["peaks"] if p is not None]
        span = f"{_peak_mib(min(peaks))}-{_peak_mib(max(peaks))}" if peaks else "-"
        limit = (f"cap +{row['headroom_bytes'] / MIB:.0f} MiB" if row.get("headroom_bytes")
                 else f"{row['budget_bytes'] / MIB:,.0f} MiB")
        what = ", ".join(name.replace(":safe_now", " safe_batch (schema 3 rule)").replace(":safe", " safe_batch")
                         for name in row["answer_of"])
        rows.append(f"| {row['scenario']} | {limit} | {row['batch']} | {what} | "
                    f"{row['over']} / {row['processes']} | {row['share_upper']:.0%} | {span} |")
    return "\n".join([
        SECTION_START, "",
        "## 13. Over the budget at an answer: a share of new processes, not a yes or no (issue 9)", "",
        f"`python tools/bench/answer_failures.py` (commit {env.get('git_commit') or '-'}, {when}, "
        f"{env.get('cpu', '-')}, {env.get('cores', '-')} cores) on the answers of `{Path(data['results']).name}` "
        f"(section 1's run at commit {source.get('git_commit') or '-'}, {source.get('cpu', '-')}). Each batch ran in "
        f"{data['processes']} more new processes, one after another (tests/support/fresh_step.py, the truth's step, "
        "10 steps). 'over' counts processes whose resident peak went over the budget (under a cap: that failed to "
        f"run); the bound is the one-sided {SHARE_CONFIDENCE:.0%} Clopper-Pearson upper bound on the share of new "
        "processes that would. Section 1's truth calls a batch safe when three new processes (six where their "
        "peaks differ) all fit; this counts how often one does not. A safe_batch row is the batch a profile of "
        "the run would give training, as summary.safe_batch_of at the commit named here reads its trials. "
        "How it is made: the docstring of "
        "tools/bench/answer_failures.py; what it says: docs/probe-evidence.md, \"Counted: how often an "
        "answer goes over\".", "",
        "| scenario | budget | batch | answer of | over / processes | share over, 95% bound | peaks, MiB |",
        "|---|---|---|---|---|---|---|",
        *rows, "",
        SECTION_END,
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="?", help="a results file of tools/bench/run.py --only probe")
    parser.add_argument("--processes", type=int, default=ANSWER_PROCESSES,
                        help=f"new processes per batch (default {ANSWER_PROCESSES})")
    parser.add_argument("--methods", default="slow_start,slow_start:safe",
                        help="comma-separated methods whose largest answer is counted; METHOD:safe counts its "
                             "largest safe_batch, the batch the profile gives training, METHOD:safe_now the one "
                             "this edgebatch's rule reads from the run's trials (default %(default)s)")
    parser.add_argument("--truth", action="store_true", help="count the truth's ceiling too")
    parser.add_argument("--scenarios", default="",
                        help="comma-separated parts of scenario names to keep (default: every scenario)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "answer_failures.json",
                        help="where the measurement is written as JSON (default %(default)s)")
    parser.add_argument("--benchmarks-md", type=Path, help="put the section in this file (BENCHMARKS.md)")
    parser.add_argument("--explain-safe", action="store_true",
                        help="print why each scenario's slow_start safe_batch is what it is (no processes run)")
    parser.add_argument("--trial-log", action="store_true",
                        help="print every slow_start run's trials with their readings (no processes run)")
    parser.add_argument("--from-json", type=Path, action="append",
                        help="render a kept measurement instead of running one; more than once: their merge, "
                             "written to --out")
    args = parser.parse_args()
    if args.explain_safe or args.trial_log:
        if args.results is None:
            parser.error(f"{'--explain-safe' if args.explain_safe else '--trial-log'} needs a results file")
        try:
            results = read_results(args.results)
        except ValueError as exc:
            parser.error(str(exc))
        for scenario in results["sections"]["probe"]["scenarios"]:
            print("\n".join(explain_safe(scenario) if args.explain_safe else trial_log_lines(scenario)))
        return 0
    if args.from_json:
        kept = []
        for path in args.from_json:
            try:
                kept.append(json.loads(path.read_text()))
                kept[-1]["measured"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                parser.error(f"cannot read a measurement from {path} ({type(exc).__name__}: {exc})")
        data = merge(kept)
        if len(kept) > 1:
            write_json(args.out, data)
    else:
        if args.results is None:
            parser.error("give a results file, or --from-json")
        if args.processes < 1:
            parser.error(f"--processes must be at least 1, not {args.processes}")
        methods = [part.strip() for part in args.methods.split(",") if part.strip()]
        wanted = [part.strip() for part in args.scenarios.split(",") if part.strip()]
        try:
            results = read_results(args.results)
        except ValueError as exc:
            parser.error(str(exc))
        data = count(results, args.results, args.processes, methods, args.truth, wanted)
        write_json(args.out, data)  # whole or nothing: harness.write_json writes beside it, then moves it
    publish_section(render(data), args.benchmarks_md, SECTION_START, SECTION_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
