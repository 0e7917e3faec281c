"""BENCHMARKS.md and the PNG plots from one run's results (the dict run.py also writes as JSON).

Pure formatting and matplotlib (Agg backend); no TensorFlow. Every figure is shown as
`median [min-max]` over the repeats it says, and every target is judged on the numbers as measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness import MIB, RESULTS_DIR, Stat, stat_of

PLOTS = {
    "memory": "memory_vs_batch.png",
    "throughput": "throughput_vs_batch.png",
    "pressure": "batch_over_time.png",
}
# The sections run.py writes, in the file's order, with their headings.
TITLES = {
    "probe": "1. Probe accuracy and cost",
    "governor": "2. Governor cost",
    "training": "3. Training throughput",
    "retracing": "4. Retracing as the micro-batch changes",
    "neighbour": "5. A neighbour takes memory mid-run, then leaves",
}
# The sections other benches write, each between its `<!-- NAME:start -->` and `<!-- NAME:end -->`
# markers (write_markdown keeps them as they stand), by NAME: the results file the bench writes,
# whose `environment` names the commit and date of the run, and the command that reproduces the
# section where that file records none (`{key}` takes the file's value of key).
KEPT_SOURCES = {
    "fleet_plan_bench": ("fleet_plan.json", "python tools/bench/fleet_plan_bench.py --benchmarks-md BENCHMARKS.md"),
    "adapt_eval": ("adapt_eval.json", "python tools/bench/adapt_eval.py --benchmarks-md BENCHMARKS.md"),
    "seq_len_bench": ("seq_lens.json", "python tools/bench/seq_len_bench.py --trial-seconds {trial_seconds:g} "
                      "--benchmarks-md BENCHMARKS.md"),
    "edge_models_bench": ("edge_models.json", "python tools/bench/edge_models_bench.py --benchmarks-md BENCHMARKS.md"),
    "multi_worker_bench": ("multi_worker.json", "python tools/bench/multi_worker_bench.py --benchmarks-md BENCHMARKS.md"),
    "padding_bench": ("padding.json", "python tools/bench/padding_bench.py --benchmarks-md BENCHMARKS.md"),
    "length_ceilings_bench": ("length_ceilings.json",
                              "python tools/bench/length_ceilings_bench.py --benchmarks-md BENCHMARKS.md"),
    "spare_check": ("spare_check.json", "python tools/bench/spare_check.py --case small_cnn:324 --case text_cnn:700 "
                    "--rounds {rounds} --benchmarks-md BENCHMARKS.md"),
    "answer_failures": ("answer_failures.json", "python tools/bench/answer_failures.py {results} --truth --methods "
                        "slow_start,slow_start:safe,binsearch,binsearch_checked --benchmarks-md BENCHMARKS.md"),
    "end_to_end_bench": ("end_to_end.json",
                         "python tools/bench/end_to_end_bench.py {results} --benchmarks-md BENCHMARKS.md"),
}


def _stat(value) -> Stat | None:
    if value is None:
        return None
    if isinstance(value, Stat):
        return value
    return Stat(**value)


def fmt(value, digits: int = 2, scale: float = 1.0, percent: bool = False) -> str:
    """`median [min-max]` of a Stat (or a bare number), scaled; '-' when absent."""
    stat = _stat(value) if isinstance(value, (dict, Stat)) or value is None else None
    if stat is None and isinstance(value, (int, float)):
        stat = Stat(value, value, value, 1)
    if stat is None:
        return "-"
    factor = 100.0 * scale if percent else scale
    suffix = "%" if percent else ""
    mid, low, high = stat.median * factor, stat.min * factor, stat.max * factor
    if stat.n == 1 or abs(high - low) < 10 ** (-digits) / 2:
        return f"{mid:.{digits}f}{suffix}"
    return f"{mid:.{digits}f}{suffix} [{low:.{digits}f}-{high:.{digits}f}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _verdict(ok: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[ok]


def targets(results: dict) -> list[list[str]]:
    """The issue's targets against what this run measured: the probe's on every scenario with a truth."""
    sections = results.get("sections", {})
    rows = []
    for scenario in (sections.get("probe") or {}).get("scenarios") or []:
        rows += _probe_targets(scenario)
    governor = sections.get("governor") or {}
    share = _stat(governor.get("per_update_share"))
    if governor:
        rows.append(["governor overhead < 1% of the step", f"{fmt(share, 3, percent=True)} of a {governor.get('model')} "
                     f"step at batch {governor.get('knee_batch')}", _verdict(None if share is None else share.max < 0.01)])
    training = sections.get("training") or {}
    ratio = _stat((training.get("no_pressure") or {}).get("governed_vs_oracle"))
    if training:
        rows.append(["governed >= 0.95 x oracle samples/s, no pressure", fmt(ratio, 3),
                     _verdict(None if ratio is None else ratio.median >= 0.95)])
        pressure = (training.get("pressure") or {}).get("summary") or {}

        def kind_of(label: str, s: dict) -> str:  # results before the supervised arm have no "kind"
            return s.get("kind") or label.split(",")[0]

        def done_of(kind: str) -> tuple[int, int]:
            chosen = [s for label, s in pressure.items() if kind_of(label, s) == kind and s["runs"]]
            return sum(s["completed_runs"] for s in chosen), sum(s["runs"] for s in chosen)

        governed, supervised, static = done_of("governed"), done_of("supervised"), done_of("static")
        judged = supervised if supervised[1] else governed
        if judged[1] and static[1]:
            ok = judged[0] == judged[1] and static[0] < static[1]
            measured = f"governed completed {governed[0]}/{governed[1]}, static {static[0]}/{static[1]}"
            if supervised[1]:
                measured = (f"governed + supervisor completed {supervised[0]}/{supervised[1]}, " + measured
                            + " (verdict on the supervised runs)")
            rows.append(["completes where a static batch at the ceiling fails", measured, _verdict(ok)])
        else:
            rows.append(["completes where a static batch at the ceiling fails", "-", _verdict(None)])
    rows += neighbour_targets(sections.get("neighbour") or {})
    return rows


def neighbour_targets(n: dict) -> list[list[str]]:
    """Issue 10 (b): a neighbour takes memory and leaves; the governed run follows it down and back up."""
    summary = n.get("summary") or {}
    governed, static = summary.get("governed") or {}, summary.get("static") or {}
    if not governed.get("runs"):
        return [["a neighbour takes memory and leaves: governed completes, recovers >= 0.9x samples/s",
                 n.get("unavailable") or "-", _verdict(None)]] if n else []
    done, runs = governed["completed_runs"], governed["runs"]
    filled = governed.get("pressure_runs", runs)
    measured = (f"neighbour filled in {filled}/{runs} runs; governed completed {done}/{runs} (static {static.get('completed_runs', 0)}/{static.get('runs', 0)}); "
                f"OOMs per pressure event {fmt(governed['ooms_in_pressure_event'], 0)}; recovered in "
                f"{governed['recovered_runs']}/{runs} runs, {fmt(governed['recovered_seconds'], 1)} s after the release")
    ok = done == runs and governed["recovered_runs"] == runs if filled == runs else None
    return [["a neighbour takes memory and leaves: governed completes, recovers >= 0.9x samples/s", measured, _verdict(ok)]]


def _probe_targets(scenario: dict) -> list[list[str]]:
    """slow_start's accuracy on one scenario, and its cost against binsearch where both ran."""
    slow = scenario["summary"].get("slow_start")
    name, truth = scenario["scenario"]["name"], scenario["truth"]
    if not slow:
        return []
    rows = []
    ratio = _stat(slow["found_over_true"])
    if ratio is not None:
        ok = ratio.min >= 0.97 and slow["unsafe_runs"] == 0
        if ok and not truth["narrowed_to_resolution"]:
            ok = None  # the ratio is only an upper bound
        measured = f"{fmt(ratio, 3)}; unsafe runs {slow['unsafe_runs']}/{slow['runs']}"
        edge = _stat(slow.get("found_over_edge"))
        if edge is not None:
            measured += (f"; {fmt(edge, 3)} of the edge below the first fresh failure "
                         f"({truth['edge_below_first_failure']}; {truth['failures_below_ceiling'][0]} fails)")
        rows.append([f"found/true >= 0.97, no unsafe answer: {name}", measured, _verdict(ok)])
    for counted in scenario.get("answer_failures") or []:
        if counted["processes"]:
            rows.append([f"new processes over the budget at {_counted_what(counted['answer_of'])} (no target): {name}", f"{counted['over']} of {counted['processes']} at {counted['batch']} "
                         f"(share at most {counted['share_upper']:.0%} at 95%)", "for reference"])
    # Issue 9's cost targets: median trials <= 0.5x and median wall time <= 0.6x binsearch's.
    for key, label, target in (("trials_vs_binsearch", "trials", 0.5), ("wall_vs_binsearch", "wall seconds", 0.6)):
        value = _stat(slow.get(key))
        if value is not None:
            rows.append([f"{label} <= {target} x binsearch's: {name}", fmt(value, 2), _verdict(value.median <= target)])
    # No target: the same costs against binsearch held to slow_start's answer rule (the price of
    # the search, with the price of that rule taken out of the comparison).
    trials, wall = _stat(slow.get("trials_vs_checked")), _stat(slow.get("wall_vs_checked"))
    if trials is not None and wall is not None:
        rows.append([f"cost against binsearch_checked (no target): {name}",
                     f"trials {fmt(trials, 2)}; wall {fmt(wall, 2)}", "for reference"])
    return rows


def _error_text(error: str) -> str:
    """One line for a table: a crashed child's last words, not the first warning on its stderr."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if error.startswith("child exit") and len(lines) > 1:
        return f"{lines[0].split(':')[0]}: {' '.join(lines[-2:])}"[:160]
    return " ".join(lines)[:120]


def _worker_kind_lines(summary: dict) -> list[str]:
    """One line: per method, where its trials ran (median per run), from probe_bench.trials_by_worker;
    nothing for results from before the trial log recorded it."""
    parts = []
    for name, s in summary.items():
        kinds = s.get("trials_by_worker")
        if kinds:
            parts.append(f"{name} " + " / ".join(fmt(count, 0) for count in kinds.values()))
    if not parts:
        return []
    return ["", "Where the trials ran, median per run (in workers that ran earlier trials / in fork-server children / "
                "in new processes; a new process costs a TensorFlow import, a child a model build and trace, a reused "
                "worker only its steps): " + "; ".join(parts) + "."]


def _counted_what(answer_of: list[str]) -> str:
    """What a counted batch is: ["slow_start", "truth"] -> "slow_start's answer and the truth's ceiling";
    "slow_start:safe" is slow_start's safe_batch (answer_failures.batches_to_count)."""
    def one(name: str) -> str:
        if name == "truth":
            return "the truth's ceiling"
        method, _, part = name.partition(":")
        return f"{method}'s safe_batch" if part == "safe" else f"{method}'s answer"

    return " and ".join(one(name) for name in answer_of)


def _answer_failure_lines(counts: list[dict] | None, info: dict) -> list[str]:
    """One line: how many new processes went over at slow_start's answer and at the truth's ceiling
    (probe_truth.answer_failures); nothing for results from before they were counted."""
    over = "failed to run under the cap" if info.get("headroom_bytes") else "went over the budget"
    parts = []
    for counted in counts or []:
        if not counted["processes"]:
            continue
        peaks = [p for p in counted["peaks"] if p is not None]
        span = f"peaks {min(peaks) / MIB:,.1f}-{max(peaks) / MIB:,.1f} MiB" if peaks else "no peak read"
        parts.append(f"{counted['batch']} ({_counted_what(counted['answer_of'])}): {counted['over']} of "
                     f"{counted['processes']} {over} ({span}; the share that would is at most "
                     f"{counted['share_upper']:.0%} at 95% confidence)")
    if not parts:
        return []
    return ["", "Counted in more new processes, one after another (probe_truth.answer_failures): " + "; ".join(parts)
            + "."]


def probe_lines(section: dict) -> list[str]:
    lines = []
    for scenario in section.get("scenarios", []):
        info, truth = scenario["scenario"], scenario["truth"]
        lines += ["", f"### {info['name']}", ""]
        if info.get("headroom_bytes"):
            told = ("the room the cap leaves (the scout's resident baseline + the headroom)"
                    if info.get("search_knows_cap", True) else "only the machine's RAM")
            lines.append(f"Address-space cap: worker size after setup + {info['headroom_bytes'] / MIB:.0f} MiB; the search "
                         f"is told {told}. A trial fails when it raises an OOM, its worker dies, or its peak is over "
                         "the budget it was told; the truth is whether a fresh process runs under the same cap.")
        else:
            lines.append(f"Resident budget {info['budget_bytes'] / MIB:.0f} MiB, told to every method; a trial fails "
                         "when its measured peak is over it.")
        if not truth["checks"]:
            bracket = None
        elif truth["first_failure_above"] is None:
            bracket = "no fresh failure above it was run, so found/true is an upper bound (time budget)"
        elif truth["narrowed_to_resolution"]:
            bracket = f"{truth['first_failure_above']} fails: the truth is known to {truth['resolution']:.0%}"
        else:
            bracket = f"{truth['first_failure_above']} fails: NOT narrowed to {truth['resolution']:.0%} (time budget)"
        forked = {run.get("fork_server") for method in scenario["runs"].values() for run in method} - {None}
        if forked:
            lines.append({frozenset({True}): "Fresh workers forked from a fork server, as `edgebatch probe` starts them "
                                              "with this budget.",
                          frozenset({False}): "Fresh workers started as new processes, as `edgebatch probe` starts them "
                                               "with this budget (no room for a fork server beside it)."}
                         .get(frozenset(forked), "Fresh workers: some runs forked them from a fork server, some did not."))
        threads = {run.get("inter_op_threads") for method in scenario["runs"].values() for run in method}
        if threads == {None}:
            lines.append("Workers and truth ran TensorFlow's own inter-op pool (results from before the setting existed).")
        elif len(threads) == 1:
            (count,) = threads
            lines.append(f"Workers and the truth's fresh processes ran {count or 'the pool of'} TensorFlow inter-op "
                         f"thread{'s' if count != 1 else ''} (`--inter-op-threads {count}`).")
        planned = f"{scenario.get('repeats', '-')} run(s) per method planned."
        if bracket is None:
            lines.append(f"{planned} True ceiling: not measured (no time left for fresh processes).")
        elif truth["ceiling"] is None:
            lines.append(f"{planned} True ceiling: no batch tried in a fresh process fitted ({len(truth['checks'])} checks).")
        else:
            fit_readings = {len(c.get("peaks") or [None]) for c in truth["checks"] if c.get("fits")}
            readings = max((len(c.get("peaks") or [None]) for c in truth["checks"]), default=1)
            each = f", a fit read in {readings} new processes" if readings > 1 else ""
            if len(fit_readings) > 1:  # probe_truth.repeated_check reads again where levels differ
                each = (f", a fit read in {min(fit_readings)} new processes, {max(fit_readings)} where their "
                        "peaks differed by more than 1%")
            lines.append(f"{planned} True ceiling (fresh processes, {len(truth['checks'])} checks{each}, "
                         f"{truth['seconds']:.0f} s of child time): **{truth['ceiling']}** fits; {bracket}.")
        if truth.get("failures_below_ceiling"):
            lines.append(f"Fresh failures below the ceiling: {truth['failures_below_ceiling']}: the boundary is fuzzy, "
                         "or memory is not monotone in batch at this scale, so the largest fit is not the only "
                         "fair reference.")
            if truth.get("edge_below_first_failure"):
                edges = ", ".join(f"{name} {fmt(s.get('found_over_edge'), 3)}" for name, s in scenario["summary"].items()
                                  if s.get("found_over_edge"))
                lines.append(f"The edge below the first of them (the largest fresh fit under it) is "
                             f"{truth['edge_below_first_failure']}; found/edge: {edges}.")
        rows = []
        for name, s in scenario["summary"].items():
            rows.append([name, str(s["runs"]), fmt(s["trials"], 0), fmt(s["failed_trials"], 0),
                         fmt(s["workers_started"], 0), fmt(s["wall_seconds"], 0), fmt(s["found"], 0),
                         fmt(s["found_over_true"], 3), f"{s['unsafe_runs']}" + (f" ({s['unchecked_runs']} unchecked)" if s["unchecked_runs"] else ""),
                         fmt(s["trials_vs_binsearch"], 2), fmt(s["wall_vs_binsearch"], 2),
                         fmt(s.get("trials_vs_checked"), 2), fmt(s.get("wall_vs_checked"), 2)])
        if rows:
            lines += [""] + _table(["method", "runs", "trials", "failed", "workers", "wall s", "found", "found/true",
                                    "unsafe", "trials / binsearch", "wall / binsearch", "trials / checked",
                                    "wall / checked"], rows)
        else:
            lines += ["", "No method ran in the time budget."]
        lines += _worker_kind_lines(scenario["summary"])
        lines += _answer_failure_lines(scenario.get("answer_failures"), scenario["scenario"])
        if scenario.get("skipped"):
            counts: dict[str, int] = {}
            for entry in scenario["skipped"]:
                name = entry.split(" repeat ")[0]
                counts[name] = counts.get(name, 0) + 1
            lines += ["", "Skipped for time: " + ", ".join(f"{name} x{n}" for name, n in counts.items()) + "."]
    return lines


def governor_lines(g: dict) -> list[str]:
    rows = [
        ["Governor.observe", fmt(g.get("observe_us"), 1), fmt(g.get("observe_share"), 4, percent=True)],
        ["PressureReader.read (forced)", fmt(g.get("read_us"), 1), fmt(g.get("read_share_every_update"), 4, percent=True)],
        ["read, amortised (1 per 10 updates and 0.5 s)", "-", fmt(g.get("read_share_amortised"), 4, percent=True)],
        ["per update in training (observe + amortised read)", "-", fmt(g.get("per_update_share"), 4, percent=True)],
    ]
    return [
        f"Model {g['model']}, knee batch {g['knee_batch']} (smallest batch within 5% of the best samples/s of the "
        f"sweep below); training step there {fmt(g.get('step_us'), 0, scale=1e-3)} ms; {g['repeats']} repeats; sensor "
        f"sources: {', '.join(g.get('sensor_sources') or [])}.", "",
        *_table(["cost", "microseconds per call", "share of the step"], rows), "",
        *_table(["batch", "step ms", "samples/s"], [
            [str(r["batch"]), fmt(r["step_seconds"], 1, scale=1e3), fmt(r["samples_per_second"], 0)]
            for r in g["sweep"]["rows"]
        ]),
    ]


def training_lines(t: dict) -> list[str]:
    lines = []
    n = t.get("no_pressure")
    if n:
        sweep = ", ".join(f"{b}: {s:.0f}" for b, s in n["static_sweep_samples_per_second"].items() if s)
        decisions = sum(f["decisions"] for f in n["governed_facts"])
        lines += [f"No pressure: {n['model']}, static sweep (samples/s) {sweep}; oracle batch {n['oracle_batch']}; "
                  f"{n['updates_timed']} timed updates per run, {n['repeats']} repeats; governor decisions during "
                  f"these runs: {decisions}.", ""]
        rows = [
            [f"static, batch {n['oracle_batch']} (oracle)", fmt(n["static_samples_per_second"], 0), "1"],
            [f"fit, effective {n['oracle_batch']}, ceiling {n['oracle_batch']}", fmt(n["governed_samples_per_second"], 0),
             fmt(n["governed_vs_oracle"], 3)],
        ]
        if n.get("governed_accumulating_samples_per_second"):
            rows.append([f"fit, effective {2 * n['oracle_batch']} as 2 x {n['oracle_batch']} (accumulating)",
                         fmt(n["governed_accumulating_samples_per_second"], 0), fmt(n["governed_accumulating_vs_oracle"], 3)])
        lines += _table(["run", "samples/s", "vs oracle (same repeat)"], rows)
    p = t.get("pressure")
    if p:
        lines += ["", f"Pressure: {p['model']} under an address-space cap (MiB over the process's size after setup); "
                  f"the static loop runs at the ceiling {p['ceiling_batch']}; the governed run starts at that ceiling with "
                  f"effective batch {p['ceiling_batch']}; {p['updates_planned']} updates planned; {p['repeats']} "
                  "repeat(s) per row. 'governed + supervisor' is the governed run under `edgebatch supervise` with a "
                  "checkpoint every 2 updates: a child killed by a signal (oneDNN's `dnnl::error` abort) is restarted "
                  "from its checkpoint, its governor told the micro-batch that was running; it runs beside the other two.",
                  ""]
        rows = []
        for label, s in p["summary"].items():
            if s["runs"]:
                restarts = f" ({s['restarts']} restart(s))" if s.get("restarts") else ""
                rows.append([label, f"{s['completed_runs']}/{s['runs']}{restarts}", fmt(s["updates_done"], 0),
                             fmt(s["oom_events"], 0),
                             fmt(s["samples_per_second"], 0), fmt(s["steady_samples_per_second"], 0),
                             "; ".join(_error_text(e) for e in s.get("errors", [])) or "-"])
        if rows:
            lines += _table(["run", "completed", "updates", "OOM events", "samples/s (all)",
                             "samples/s (after last OOM)", "error"], rows)
        else:
            lines.append("No pressure run fitted in the time budget.")
        if p.get("skipped"):
            lines += ["", "Skipped: " + "; ".join(p["skipped"]) + "."]
    return lines


def _neighbour_mib(n: dict) -> str:
    sizes = [run["events"]["neighbour_bytes"] / MIB for runs in (n.get("runs") or {}).values() for run in runs
             if (run.get("events") or {}).get("neighbour_bytes")]
    return fmt(stat_of(sizes), 0) if sizes else "-"


def neighbour_lines(n: dict) -> list[str]:
    if n.get("unavailable"):
        return [f"Not run: {n['unavailable']} (the scenario needs a memory cgroup it may create)."]
    lines = [
        f"{n['model']}, ceiling micro-batch {n['ceiling_batch']} (effective batch {n['ceiling_batch']}). The limit is a "
        f"real cgroup v1 memory limit of {n['limit_bytes'] / MIB:.0f} MiB per run (`memory.limit_in_bytes`, one cgroup "
        "per run), shared by the training (with its supervisor, governed) and a neighbour process; over it the kernel "
        "SIGKILLs the training (it runs with oom_score_adj 500). After "
        f"{n['pre_updates']} timed updates the neighbour takes, at {n['neighbour_rate_bytes_per_second'] / MIB:.0f} MiB/s, "
        f"all but the cgroup's peak so far less {1 - n['room_fraction']:.2f} x the ceiling's per-sample bytes (by the "
        f"training's own warm-up memory model; neighbour {_neighbour_mib(n)} MiB), so the ceiling no longer fits and "
        f"about {n['room_fraction']:.2f} x it does; it holds that {n['hold_seconds']:.0f} s and exits; the run goes on "
        f"{n['after_seconds']:.0f} s. Static: fit at "
        "a fixed micro-batch, no supervisor. Governed: the governor with that memory model, room read every update, a "
        "checkpoint every 2 updates, under `edgebatch supervise` (a kill is restarted from the checkpoint, the governor "
        "told the size that was running). Both run with "
        + ", ".join(f"{k}={v}" for k, v in n["training_env"].items())
        + " (with oneDNN's allocator a process keeps its largest step's memory, so nothing could be given back). "
        f"{n['repeats']} repeat(s) planned; the pair runs side by side.", ""]
    summary = n.get("summary") or {}
    rows = []
    for kind in ("static", "governed"):
        s = summary.get(kind) or {}
        if s.get("runs"):
            rows.append([kind, f"{s['completed_runs']}/{s['runs']}", fmt(s["ooms_in_pressure_event"], 0),
                         fmt(s["pre_samples_per_second"], 0), fmt(s["during_samples_per_second"], 0),
                         fmt(s["after_samples_per_second"], 0),
                         f"{fmt(s['recovered_seconds'], 1)} ({s['recovered_runs']}/{s['runs']} runs)",
                         fmt(s["back_at_ceiling_seconds"], 1), fmt(s.get("smallest_micro_batch_in_pressure"), 0),
                         fmt(s["examples"], 0)])
    if rows:
        lines += _table(["run", "completed", "OOMs per pressure event", "samples/s before", "samples/s during",
                         "samples/s after", f"s to >= {n['recovery_fraction']}x before, after the release",
                         "s to ceiling micro-batch again", "smallest micro-batch beside the neighbour",
                         "examples trained"], rows)
        ratios = n.get("governed_vs_static") or {}
        lines += ["", f"Governed / static in the same pair: samples/s before the neighbour {fmt(ratios.get('pre_samples_per_second'), 3)}; "
                  f"examples trained in the run {fmt(ratios.get('examples'), 2)}. 'During' runs from the neighbour's "
                  "start to its exit (a restart's TensorFlow import included); recovery is the first window of "
                  f"{n['recovery_window']} updates after the release at that pace (a static run that was killed has none)."]
        for run in (n.get("runs") or {}).get("governed", []):
            if run.get("restarts"):
                lines.append(f"Governed run restarts: {run['restarts']} (kernel OOM kills in its cgroup: {run.get('kernel_oom_kills')}).")
    else:
        lines.append("No pair fitted in the time budget.")
    if n.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(n["skipped"]) + "."]
    return lines


def retracing_lines(r: dict) -> list[str]:
    rows = [[name, fmt(v["traces"], 0), fmt(v["compile_seconds"], 2), fmt(v["seconds"], 2), fmt(v["seconds_vs_edgebatch"], 2)]
            for name, v in r["variants"].items()]
    return [f"Model {r['model']}, micro-batch sizes {r['sizes']} in that order, {r['repeats']} repeats.", "",
            *_table(["step", "traces", "compile s", "total s", "total / edgebatch"], rows)]


def write_markdown(results: dict, path: Path, plots_dir: Path) -> None:
    env, mode = results["environment"], results["mode"]
    sections = results.get("sections", {})
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    relative = plots_dir.resolve().relative_to(path.resolve().parent)
    kept = kept_sections(path.read_text() if path.exists() else "")
    lines = [
        "# Benchmarks",
        "",
        *header_lines(results, kept, relative),
        "",
        f"The last run, `{results.get('command') or 'python tools/bench/run.py'}` ({env['date_utc']}, commit "
        f"{env.get('git_commit') or '-'}; raw numbers in `{relative}/results.json`):",
        "",
        f"- Machine: {env['cpu']}, {env['cores']} cores, {env['memory_total_bytes'] / 2**30:.1f} GiB RAM; {env['platform']}",
        f"- Versions: Python {env['python']}, {versions}; commit {env.get('git_commit') or '-'}",
        f"- Mode: {mode['name']} ({mode['repeats']} repeats per figure unless a table says otherwise; the probe "
        f"section: {(sections.get('probe') or {}).get('repeats', '-')} per method); run took {results['seconds']:.0f} s.",
        f"- Load average at start {env.get('load_average_at_start')}, at end {env.get('load_average_at_end')}: the "
        "machine is shared, so figures are `median [min-max]` and comparisons are ratios taken within each repeat.",
        *carried_lines(results.get("carried", {})),
        "",
        "## Targets",
        "",
        *_table(["target", "measured", "verdict"], targets(results)),
    ]
    writers = {"probe": probe_lines, "governor": governor_lines, "training": training_lines, "retracing": retracing_lines,
               "neighbour": neighbour_lines}
    for key, title in TITLES.items():
        lines += ["", f"## {title}", ""]
        if key in results.get("errors", {}):
            lines.append(f"Failed: `{results['errors'][key].strip().splitlines()[-1]}` (traceback in results.json).")
        elif sections.get(key):
            lines += writers[key](sections[key])
        else:
            lines.append("Not run (time budget or --only).")
    lines += ["", "## Plots", ""]
    for name in PLOTS.values():
        if (plots_dir / name).exists():
            lines.append(f"![{name}]({relative}/{name})")
    lines += ["", *results.get("notes", [])]
    path.write_text("\n".join(lines).rstrip() + "\n" + "".join("\n" + block + "\n" for block in kept))


def header_lines(results: dict, kept: list[str], relative: Path) -> list[str]:
    """What each section is, the commit and date it was run at, and the command that reproduces it:
    run.py's sections from results.json (a section --only carried over keeps its own run's), the
    others from the results files their benches write (KEPT_SOURCES, in RESULTS_DIR) and their
    headings in the kept blocks. `relative`: where results.json lies, from the markdown file."""
    rows = [[title.split(". ", 1)[0], title.split(". ", 1)[1], *_run_py_provenance(results, key)]
            for key, title in TITLES.items()]
    first_kept = None
    by_hand = []
    for block in kept:
        name = re.match(r"<!-- ([\w.-]+):start -->", block).group(1)
        heading = re.search(r"^## (?:(\d+)\. )?(.+)$", block, re.M)
        if heading is None:  # a block without a heading of its own: a reading of the section above it
            by_hand.append(rows[-1][0])
            rows[-1][1] += "; the reading under it is written by hand"
            continue
        number, title = heading.group(1) or "-", heading.group(2)
        first_kept = first_kept or number
        rows.append([number, title, *_kept_provenance(name, RESULTS_DIR)])
    return [
        "Each section was measured at its own commit and date, as the table says. `python "
        f"tools/bench/run.py` writes the targets, sections {rows[0][0]}-{rows[len(TITLES) - 1][0]} and the plots "
        f"from `{relative}/results.json`"
        + (f"; sections {first_kept} and on are each written by their own script, between start and end markers "
           "(HTML comments) that run.py keeps as they stand" if first_kept else "")
        + ". Rerun a section's command to refresh it; do not edit by hand."
        + (f" One block is written by hand, and says so: the reading under section {by_hand[0]}." if len(by_hand) == 1
           else f" {len(by_hand)} blocks are written by hand, and say so: the readings under sections "
                f"{', '.join(by_hand[:-1])} and {by_hand[-1]}." if by_hand else ""),
        "",
        *_table(["section", "what", "run at (commit, date)", "command that reproduces it"], rows),
    ]


def _run_py_provenance(results: dict, key: str) -> list[str]:
    """[commit and date, command] of a section run.py writes: this run's, or the earlier run's it was carried from."""
    origin = results.get("carried", {}).get(key)
    if origin is None:
        env = results.get("environment", {})
        origin = {"git_commit": env.get("git_commit"), "date_utc": env.get("date_utc"),
                  "mode": results.get("mode", {}).get("name"), "command": results.get("command")}
    if key not in results.get("sections", {}) or key in results.get("errors", {}):
        return ["not run", f"`python tools/bench/run.py --only {key}`"]
    quick = " --quick" if origin.get("mode") == "quick" else ""
    command = origin.get("command") or f"python tools/bench/run.py{quick} --only {key}"
    return [_run_at(origin.get("git_commit"), origin.get("date_utc")), f"`{command}`"]


def _kept_provenance(name: str, results_dir: Path) -> list[str]:
    """[commit and date, command] of a section another bench writes, from the results file it writes."""
    if name not in KEPT_SOURCES:
        return ["-", "-"]
    file_name, command = KEPT_SOURCES[name]
    try:
        data = json.loads((results_dir / file_name).read_text())
    except (OSError, ValueError):
        return [f"- (no {file_name})", "-"]
    env = data.get("environment") or {}
    try:
        command = data.get("command") or command.format(**data)
    except (KeyError, ValueError):
        command = command.split(" {", 1)[0] + " ..."
    return [_run_at(env.get("git_commit"), env.get("date_utc")), f"`{command}`"]


def _run_at(commit: str | None, date_utc: str | None) -> str:
    return f"{commit or '-'}, {(date_utc or '-')[:10]}"


def carried_lines(carried: dict) -> list[str]:
    """One line per earlier run whose sections run.py --only kept: which sections, at what commit and date
    (and on what CPU, where recorded)."""
    runs: dict[tuple, list[str]] = {}
    for name, origin in carried.items():
        run = (origin.get("mode") or "", origin.get("git_commit") or "-", origin.get("date_utc") or "-", origin.get("cpu"))
        runs.setdefault(run, []).append(name)
    return [f"- Sections {', '.join(names)}: carried over from an earlier {mode} run (commit {commit}, {date}"
            f"{f', {cpu}' if cpu else ''}); the lines above describe this run."
            for (mode, commit, date, cpu), names in runs.items()]


def kept_sections(markdown: str) -> list[str]:
    """Sections other tools write between `<!-- NAME:start -->` and `<!-- NAME:end -->` markers.

    run.py rewrites the file from results.json; a section that another benchmark owns (for example
    tools/bench/fleet_plan_bench.py's) is carried over as it stands instead of being dropped.
    """
    return [match.group(0) for match in re.finditer(r"^<!-- ([\w.-]+):start -->$.*?^<!-- \1:end -->$", markdown,
                                                    re.S | re.M)]


def write_plots(results: dict, plots_dir: Path) -> list[str]:
    """The three PNGs; returns the names written (a section that did not run has no plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    written = []
    sections = results.get("sections", {})
    scenarios = (sections.get("probe") or {}).get("scenarios") or []
    if scenarios:
        # A grid, at most 3 panels a row: seven in one row shrank each to a sliver on screen.
        columns = min(3, len(scenarios))
        rows = -(-len(scenarios) // columns)
        fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.5 * rows), squeeze=False)
        for axis, scenario in zip(axes.flat, scenarios):
            _memory_axis(axis, scenario)
        for axis in list(axes.flat)[len(scenarios):]:
            axis.set_visible(False)
        fig.tight_layout()
        fig.savefig(plots_dir / PLOTS["memory"], dpi=110)
        plt.close(fig)
        written.append(PLOTS["memory"])
    governor, training = sections.get("governor"), sections.get("training") or {}
    if governor:
        fig, axis = plt.subplots(figsize=(6.5, 4.5))
        rows = governor["sweep"]["rows"]
        batches = [r["batch"] for r in rows]
        medians = [r["samples_per_second"]["median"] for r in rows]
        errors = [[m - r["samples_per_second"]["min"] for m, r in zip(medians, rows)],
                  [r["samples_per_second"]["max"] - m for m, r in zip(medians, rows)]]
        axis.errorbar(batches, medians, yerr=errors, marker="o", capsize=3, label=f"{governor['model']} training step")
        axis.axvline(governor["knee_batch"], color="grey", linestyle="--", label=f"knee {governor['knee_batch']}")
        sweep = (training.get("no_pressure") or {}).get("static_sweep_samples_per_second") or {}
        if sweep:
            axis.plot([int(b) for b in sweep], list(sweep.values()), "s--", label="small_cnn static loop (training section)")
        axis.set(xscale="log", xlabel="batch", ylabel="samples/s", title="Throughput vs batch (median, min-max)")
        axis.legend()
        fig.tight_layout()
        fig.savefig(plots_dir / PLOTS["throughput"], dpi=110)
        plt.close(fig)
        written.append(PLOTS["throughput"])
    pressure = training.get("pressure") or {}
    by_cap = pressure.get("runs") or {}
    neighbour = sections.get("neighbour") or {}
    neighbour_runs = [run for runs in (neighbour.get("runs") or {}).values() for run in runs if run.get("timeline")]
    has_pressure = any(run for kinds in by_cap.values() for run in kinds.values())
    if has_pressure or neighbour_runs:
        panels = int(has_pressure) + int(bool(neighbour_runs))
        fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
        if neighbour_runs:
            _neighbour_axis(axes[0][-1], neighbour)
        axis = axes[0][0]
    if has_pressure:
        for headroom, kinds in by_cap.items():
            for kind, style in (("governed", "-"), ("supervised", ":"), ("static", "--")):
                for index, run in enumerate(kinds.get(kind, [])):
                    timeline = run.get("timeline") or []
                    name = "governed + supervisor" if kind == "supervised" else kind
                    label = f"{name}, {int(headroom) // MIB} MiB cap" if index == 0 else None
                    if timeline:
                        axis.step([0] + [t["update"] for t in timeline],
                                  [pressure["ceiling_batch"]] + [t["micro_batch"] for t in timeline],
                                  style, where="pre", label=label)
                        ooms = [t for t in timeline if t["oom_events"]]
                        axis.plot([t["update"] for t in ooms], [t["micro_batch"] for t in ooms], "rx")
                    if not run.get("completed"):
                        axis.plot([len(timeline)], [timeline[-1]["micro_batch"] if timeline else pressure["ceiling_batch"]],
                                  "kv", markersize=9, label=(label + ": stopped") if label else None)
        axis.set_yscale("log", base=2)
        axis.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.set(xlabel="optimizer update", ylabel="micro-batch (largest in the update)",
                 title="Micro-batch over time under an address-space cap\n(x: update that met OOMs; v: run stopped)")
        axis.legend(fontsize=7)
    if has_pressure or neighbour_runs:
        fig.tight_layout()
        fig.savefig(plots_dir / PLOTS["pressure"], dpi=110)
        plt.close(fig)
        written.append(PLOTS["pressure"])
    return written


def _neighbour_axis(axis, neighbour: dict) -> None:
    """Micro-batch against seconds in the run; the neighbour's time shaded (first governed run's)."""
    import matplotlib.ticker

    shaded = False
    for kind, style in (("governed", "-"), ("static", "--")):
        for index, run in enumerate((neighbour.get("runs") or {}).get(kind, [])):
            timeline = run.get("timeline") or []
            if not timeline:
                continue
            label = kind if index == 0 else None
            # An update's micro-batch ran up to the update's end, where it is timestamped: "pre".
            lines = axis.step([t["seconds"] for t in timeline], [t["micro_batch"] for t in timeline], style,
                              where="pre", label=label)
            restarts = [t for previous, t in zip(timeline, timeline[1:]) if t["restart"] != previous["restart"]]
            axis.plot([t["seconds"] for t in restarts], [t["micro_batch"] for t in restarts], "rx",
                      label="restarted after a kill" if restarts and not shaded else None)
            if not run.get("completed"):
                axis.plot([timeline[-1]["seconds"]], [timeline[-1]["micro_batch"]], "v", color=lines[0].get_color(),
                          markersize=9, label=f"{kind}: killed" if index == 0 else None)
            events = run.get("events") or {}
            if kind == "governed" and not shaded and events.get("neighbour_start_t") and events.get("neighbour_released_t"):
                axis.axvspan(events["neighbour_start_t"], events["neighbour_released_t"], color="grey", alpha=0.2,
                             label="neighbour holds memory (governed run)")
                shaded = True
    axis.set_yscale("log", base=2)
    axis.set_yticks(sorted({t["micro_batch"] for runs in (neighbour.get("runs") or {}).values() for run in runs
                            for t in run.get("timeline") or []}))
    axis.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axis.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axis.set(xlabel="seconds since the run started", ylabel="micro-batch (largest in the update)",
             title=f"A neighbour takes memory, then leaves\n({neighbour['limit_bytes'] // MIB} MiB cgroup limit, "
                   f"{neighbour['model']})")
    axis.legend(fontsize=7)


def _memory_axis(axis, scenario: dict) -> None:
    markers = iter("os^vD<>")
    top = 0.0
    for name in ("slow_start", "binsearch", "power"):
        for index, run in enumerate(scenario["runs"].get(name, [])[:1]):
            points = [(t["batch"], t["peak_bytes"] / MIB) for t in run["trial_log"] if t["measured"] and t["peak_bytes"]]
            failed = [t["batch"] for t in run["trial_log"] if t["measured"] and not t["ok"]]
            if points:
                top = max(top, max(p for _, p in points))
                axis.plot(*zip(*sorted(points)), marker=next(markers), linestyle="", alpha=0.7, label=f"{name} trials")
            if failed:
                axis.plot(failed, [None] * len(failed))  # keep the x range
                axis.vlines(failed, 0, 1, transform=axis.get_xaxis_transform(), colors="red", alpha=0.25)
    checks = scenario["truth"]["checks"]
    fresh = [(c["batch"], c["peak_bytes"] / MIB) for c in checks if c["peak_bytes"]]
    if fresh:
        axis.plot(*zip(*sorted(fresh)), "k*", markersize=9, label="fresh process (truth)")
    fresh_failures = [c["batch"] for c in checks if not c["fits"]]
    if fresh_failures:
        axis.plot(fresh_failures, [0.02] * len(fresh_failures), "kX", markersize=9,
                  transform=axis.get_xaxis_transform(), label="fresh process failed")
    if scenario["truth"]["ceiling"]:
        axis.axvline(scenario["truth"]["ceiling"], color="black", linestyle=":", label="true ceiling")
    budget = scenario["scenario"].get("budget_bytes")
    if budget:
        axis.axhline(budget / MIB, color="grey", linestyle="--", label="budget")
    axis.set(xscale="log", xlabel="batch", ylabel="peak resident MiB",
             title=f"{scenario['scenario']['name']}\n(red lines: failed trials)")
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=7)
