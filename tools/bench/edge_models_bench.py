"""Ceilings of mobilenet_v2 prepared for the edge (float32, mixed_bfloat16, QAT, pruned) at one CPU budget, against fresh processes.

Issue 15, item 4. For each variant this runs the real probe as a user would, in its own process:

    edgebatch probe --model mobilenet_v2 --device CPU:0 --memory-budget BUDGET
                    [--precision mixed_bfloat16 | --optimize qat | --optimize prune]
                    --profiles-dir TMP --no-save --force --json

(every other setting at its default: start 8, headroom 0.1, 3 steps per trial, --trial-seconds 10;
a temporary profiles directory and --no-save, so nothing lands in device_profiles/), and reads from
its profile: max_batch, safe_batch, the trials that ran (measured ones; `predicted_over_budget`
entries are not counted), how many of them failed and how many ran in a fresh worker, the probe's
own wall seconds (`probe_seconds`), and the memory model's `fixed_bytes` and `per_sample_bytes`
(the line the search steered by: resident peak = fixed + per_sample x batch).

Then it searches the fresh-process truth around that answer with tools/bench/probe_truth.py's
measure_truth: tests/support/fresh_step.py (its own step, loss and data, apart from the probe's
code) in a new process per batch, 10 steps at that batch under the same precision and TFMOT
wrapping (--precision=, --optimize=; for prune the wrappers' pruning step starts at 0 as
UpdatePruningStep would set it), its resident peak (VmHWM) compared with the budget. A batch fits
when it ran and its peak is <= the budget; the answer is checked first, then the failure above it
(the probe's failed trials, else 1.08 x the answer), then bisection between the largest fresh fit
and the smallest fresh failure above it to 1% (at most 14 checks and `--truth-seconds` per
variant, two checks at a time). Reported per variant: the truth ceiling (the largest fresh fit),
the first fresh failure above it and whether the two were narrowed to 1%, found/true (max_batch
over the truth ceiling), and whether max_batch and safe_batch were safe: `yes` when the answer
fitted in a fresh process or lies at or under a fresh fit, `NO` when it failed fresh or lies at or
above a fresh failure (probe_truth.judge). The fresh peak at max_batch is given as a share of the
budget: the probe's own limit is the budget less its measurement margin (0.99 x budget with one
inter-op thread, the default; 0.975 in results made with TensorFlow's pool), so an answer a little
under the truth is by design. The same checks are also read against that limit: the largest checked
batch whose fresh peak is under it, below the smallest checked batch over it (shown in
brackets). No check is run for it, so it is only as fine as the checks the truth search chose.

The budget: 1.5 GiB resident by default. On this machine kind a fresh mobilenet_v2 process holds
about 1.0-1.4 GiB at batch 8 (float32 1,110 MB, mixed_bfloat16 1,090 MB, QAT 1,229 MB, pruned
1,396 MB, one fresh process each, 3 steps), so at 1.5 GiB every variant's ceiling lands at a few
dozen examples: each truth check trains 10 steps of a small batch and stays under a minute or two
even on a shared 2-core machine, and the same budget is the one section 1 probed float32
mobilenet_v2 at (its answer there was never checked against fresh processes).

`--jobs N` runs N variants at the same time (probe, then truth, per variant); memory readings do
not depend on it (each process's resident peak is its own), but the probe's wall seconds and how
many steps fit in --trial-seconds do, so the section says what was used. `--repeats` probes each
variant that many times (the truth is searched once, around every repeat's answers).

Writes tools/bench/results/edge_models.json and, with --benchmarks-md, its own section of
BENCHMARKS.md between the markers below (harness.write_section).

    python tools/bench/edge_models_bench.py --benchmarks-md BENCHMARKS.md        # 30-60 minutes on 2 shared cores
    python tools/bench/edge_models_bench.py --from-json tools/bench/results/edge_models.json --benchmarks-md BENCHMARKS.md
    python tools/bench/edge_models_bench.py --from-json tools/bench/results/edge_models.json --narrow --jobs 2

--narrow continues, from the checks already in the results file, the truths that time cut short
(the probes are not run again; the section says which checks came from that later run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_truth
from harness import (
    RESULTS_DIR,
    ROOT,
    child_env,
    environment,
    load_average,
    log,
    write_json,
    publish_section,
)

from edgebatch.probing.margins import measurement_margin
from edgebatch.probing.worker import DEFAULT_INTER_OP_THREADS
from edgebatch.units import parse_size_bytes

SECTION_START = "<!-- edge_models_bench:start -->"
SECTION_END = "<!-- edge_models_bench:end -->"
RESULTS_FILE = RESULTS_DIR / "edge_models.json"
# name -> (precision, optimize)
VARIANTS = {
    "float32": ("float32", "none"),
    "mixed_bfloat16": ("mixed_bfloat16", "none"),
    "qat": ("float32", "qat"),
    "prune": ("float32", "prune"),
}
PROBE_TIMEOUT_SECONDS = 1800
# max_batch's peak must fit this share of the budget (margins.measurement_margin): 0.99 with the
# probe's default one inter-op thread. A results file without `fit_limit_fraction` was made with
# TensorFlow's pool, where it was 0.975.
FIT_MARGIN = 1 - measurement_margin(DEFAULT_INTER_OP_THREADS)
UNRECORDED_FIT_MARGIN = 0.975
MIB = 1024**2


def probe_command(model: str, budget_bytes: int, precision: str, optimize: str, profiles_dir: str) -> list[str]:
    """The CLI line of one variant's probe (module form of the `edgebatch` entry point)."""
    command = [sys.executable, "-m", "edgebatch", "probe", "--model", model, "--device", "CPU:0",
               "--memory-budget", str(budget_bytes), "--profiles-dir", profiles_dir, "--no-save", "--force", "--json"]
    if precision != "float32":
        command += ["--precision", precision]
    if optimize != "none":
        command += ["--optimize", optimize]
    return command


def profile_facts(profile: dict) -> dict:
    """What the table reports from one probe's profile JSON."""
    measured = [t for t in profile["trials"] if t.get("measured", True) and t.get("error") != "predicted_over_budget"]
    model = profile.get("memory_model") or {}
    max_batch = profile["max_batch"]
    return {
        "max_batch": max_batch,
        "safe_batch": profile["safe_batch"],
        "trials": len(measured),
        "failed_trials": sum(1 for t in measured if not t["ok"]),
        "fresh_trials": sum(1 for t in measured if t.get("fresh")),
        "probe_seconds": profile["probe_seconds"],
        "fixed_bytes": model.get("fixed_bytes"),
        "per_sample_bytes": model.get("per_sample_bytes"),
        "memory_model_r2": model.get("r2"),
        "memory_model_points": model.get("points"),
        "predicted_ceiling": profile.get("predicted_ceiling"),
        "model_key": profile["model"]["key"],
        "parameters": profile["model"].get("parameters"),
        "keras_flavor": profile["model"].get("keras_flavor"),
        "failed_batches_above": sorted({t["batch"] for t in measured
                                        if not t["ok"] and max_batch is not None and t["batch"] > max_batch}),
        "trial_batches": [[t["batch"], t["ok"], t.get("peak_bytes"), bool(t.get("fresh"))] for t in measured],
    }


def run_probe(name: str, model: str, budget_bytes: int) -> dict:
    precision, optimize = VARIANTS[name]
    profiles_dir = tempfile.mkdtemp(prefix=f"edge_models_{name}_")
    command = probe_command(model, budget_bytes, precision, optimize, profiles_dir)
    log(f"{name}: probing ({' '.join(command[3:])})")
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_SECONDS,
                              env=child_env(), cwd=ROOT, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"probe ran past {PROBE_TIMEOUT_SECONDS} s", "wall_seconds": time.monotonic() - started}
    finally:
        left = list(Path(profiles_dir).glob("*.json"))
        shutil.rmtree(profiles_dir, ignore_errors=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-2:])[-300:]
        return {"error": f"exit {done.returncode}: {tail}", "wall_seconds": wall}
    facts = profile_facts(json.loads(done.stdout))
    facts["wall_seconds"] = round(wall, 1)
    facts["profiles_written"] = len(left)
    log(f"{name}: max_batch {facts['max_batch']}, safe_batch {facts['safe_batch']}, {facts['trials']} trials, "
        f"{facts['probe_seconds']:.0f} s, per sample {(facts['per_sample_bytes'] or 0) / MIB:.2f} MiB")
    return facts


def run_variant(name: str, model: str, budget_bytes: int, repeats: int, truth_seconds: float) -> dict:
    precision, optimize = VARIANTS[name]
    started = time.monotonic()
    probes = [run_probe(name, model, budget_bytes) for _ in range(repeats)]
    answers = [p["max_batch"] for p in probes if "error" not in p]
    hints = sorted({b for p in probes if "error" not in p for b in p["failed_batches_above"]})
    truth = None
    if answers:
        deadline = time.monotonic() + truth_seconds
        truth = probe_truth.measure_truth(
            model, answers, hints or [int(max(answers) * 1.08) + 1], budget_bytes=budget_bytes, headroom_bytes=None,
            seconds_left=lambda: deadline - time.monotonic(), check_cost_seconds=60.0,
            precision=precision, optimize=optimize,
        )
        judge_probes({"truth": truth, "probes": probes})
        log(f"{name}: truth {truth['ceiling']} (first failure above {truth['first_failure_above']}, "
            f"narrowed {truth['narrowed_to_resolution']}), answers {answers}")
    return {"variant": name, "precision": precision, "optimize": optimize, "probes": probes, "truth": truth,
            "seconds": round(time.monotonic() - started, 1)}


def judge_probes(row: dict) -> None:
    """Judge every probe of a variant against its truth (probe_truth.judge), in place."""
    truth = row["truth"]
    checks = {c["batch"]: c for c in truth["checks"]}
    for facts in row["probes"]:
        if "error" in facts:
            continue
        facts["judged_max"] = probe_truth.judge(facts["max_batch"], truth)
        facts["judged_safe"] = probe_truth.judge(facts["safe_batch"], truth)
        fresh = checks.get(facts["max_batch"])
        facts["fresh_peak_at_max_bytes"] = fresh["peak_bytes"] if fresh else None


def narrow(data: dict, variants: list[str], truth_seconds: float, jobs: int) -> dict:
    """Continue the truth searches of a results file that were cut short by time, from their checks.

    The probes are not run again; the checks already made are kept as they are, and the new ones are
    listed in `narrowed_later` so the section can say which checks came in a second run.
    """
    def one(row: dict) -> None:
        truth = row["truth"]
        if truth is None or truth["narrowed_to_resolution"] or row["variant"] not in variants:
            return
        answers = [p["max_batch"] for p in row["probes"] if "error" not in p]
        hints = sorted({b for p in row["probes"] if "error" not in p for b in p["failed_batches_above"]})
        deadline = time.monotonic() + truth_seconds
        before = {c["batch"] for c in truth["checks"]}
        row["truth"] = probe_truth.measure_truth(
            data["model"], answers, hints or [int(max(answers) * 1.08) + 1], budget_bytes=data["budget_bytes"],
            headroom_bytes=None, seconds_left=lambda: deadline - time.monotonic(), check_cost_seconds=60.0,
            precision=row["precision"], optimize=row["optimize"], prior_checks=truth["checks"],
        )
        row["truth"]["narrowed_later"] = sorted({c["batch"] for c in row["truth"]["checks"]} - before)
        judge_probes(row)
        log(f"{row['variant']}: truth {row['truth']['ceiling']} (first failure above "
            f"{row['truth']['first_failure_above']}, narrowed {row['truth']['narrowed_to_resolution']})")

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, data["variants"]))
    data["narrow_run"] = {"command": "python tools/bench/edge_models_bench.py " + " ".join(sys.argv[1:]),
                          "seconds": round(time.monotonic() - started, 1),
                          "environment": environment(), "load_average_at_end": load_average()}
    return data


def run(model: str, budget_bytes: int, variants: list[str], repeats: int, truth_seconds: float, jobs: int) -> dict:
    started = time.monotonic()
    data = {
        "command": "python tools/bench/edge_models_bench.py " + " ".join(sys.argv[1:]),
        "model": model,
        "budget_bytes": budget_bytes,
        "fit_limit_fraction": FIT_MARGIN,
        "repeats": repeats,
        "jobs": jobs,
        "truth_seconds": truth_seconds,
        "truth_steps": probe_truth.TRUTH_STEPS,
        "environment": environment(),
    }
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_variant, name, model, budget_bytes, repeats, truth_seconds) for name in variants]
        data["variants"] = [future.result() for future in futures]
    data["seconds"] = round(time.monotonic() - started, 1)
    data["load_average_at_end"] = load_average()
    return data


def _value(values: list, fmt: str = "{}") -> str:
    """One figure, or median [min-max] over repeats."""
    present = sorted(v for v in values if v is not None)
    if not present:
        return "-"
    if len(present) == 1:
        return fmt.format(present[0])
    middle = present[len(present) // 2] if len(present) % 2 else (present[len(present) // 2 - 1] + present[len(present) // 2]) / 2
    return f"{fmt.format(middle)} [{fmt.format(present[0])}-{fmt.format(present[-1])}]"


def fit_limit_truth(checks: list[dict], budget_bytes: int, fraction: float = FIT_MARGIN) -> tuple[int | None, int | None]:
    """From the same fresh checks, judged against the probe's own limit (`fraction` x budget, the
    measurement margin max_batch is defined by): the largest checked batch whose fresh peak is under
    it, below the smallest checked batch that ran over it or failed, and that batch."""
    limit = fraction * budget_bytes
    over = [c["batch"] for c in checks if not c["ran"] or c["peak_bytes"] is None or c["peak_bytes"] > limit]
    first_over = min(over, default=None)
    under = [c["batch"] for c in checks if c["ran"] and c["peak_bytes"] is not None and c["peak_bytes"] <= limit
             and (first_over is None or c["batch"] < first_over)]
    return max(under, default=None), first_over


def _safe(judged: list[dict]) -> str:
    verdicts = [j["unsafe"] for j in judged]
    if any(v is True for v in verdicts):
        return f"**NO** ({sum(1 for v in verdicts if v is True)}/{len(verdicts)})"
    if any(v is None for v in verdicts):
        return "not checked"
    return "yes" if len(verdicts) == 1 else f"yes ({len(verdicts)}/{len(verdicts)})"


def markdown(data: dict) -> str:
    env = data["environment"]
    budget = data["budget_bytes"]
    fraction = data.get("fit_limit_fraction", UNRECORDED_FIT_MARGIN)
    lines = [
        SECTION_START,
        "## 9. Models prepared for the edge (issue 15, item 4): mobilenet_v2 ceilings against fresh processes",
        "",
        (f"`{data['command']}` on {env['date_utc']} (commit {env['git_commit']}, {data['seconds']:.0f} s; "
         f"machine {env['cpu']}, {env['cores']} cores, shared with other sessions: load average at the start "
         f"{env['load_average_at_start']}, at the end {data['load_average_at_end']}). What is measured and how: the "
         "docstring of tools/bench/edge_models_bench.py."),
        "",
        (f"`{data['model']}` (96x96x3, 10 classes, Adam) under a {budget / MIB:.0f} MiB resident budget, each "
         "variant probed with the CLI at its defaults (`edgebatch probe --device CPU:0 --memory-budget ... "
         "[--precision mixed_bfloat16 | --optimize qat|prune]`), then the truth searched around its answer in fresh "
         f"processes (tests/support/fresh_step.py, same precision and wrapping, {data['truth_steps']} steps, a batch "
         f"fits when its resident peak is <= the budget). {data['repeats']} probe(s) per variant; {data['jobs']} "
         "variant(s) at a time, so probe seconds include sharing the 2 cores."),
        "",
        ("| variant | max_batch | safe_batch | trials (failed, fresh) | probe s | per-sample MiB | fixed MiB | "
         f"truth ceiling | first fresh failure | found/true | fresh fit under {fraction:g} x budget (next over) | "
         "fresh peak at max_batch / budget | max_batch safe | safe_batch safe |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in data["variants"]:
        probes = [p for p in row["probes"] if "error" not in p]
        errors = [p["error"] for p in row["probes"] if "error" in p]
        if errors:
            notes.append(f"{row['variant']}: {len(errors)} probe(s) failed: {errors[0]}")
        truth = row["truth"] or {}
        if not probes:
            lines.append(f"| {row['variant']} | - | - | - | - | - | - | - | - | - | - | - | - | - |")
            continue
        ceiling = truth.get("ceiling")
        first = truth.get("first_failure_above")
        narrowed = "" if truth.get("narrowed_to_resolution") else " (not narrowed to 1%)"
        trials = _value([p["trials"] for p in probes])
        failed = _value([p["failed_trials"] for p in probes])
        fresh = _value([p["fresh_trials"] for p in probes])
        under_limit, over_limit = fit_limit_truth(truth.get("checks", []), budget, fraction)
        at_limit = "-" if under_limit is None else f"{under_limit} ({over_limit if over_limit is not None else '-'})"
        peak_share = [p["fresh_peak_at_max_bytes"] / budget if p.get("fresh_peak_at_max_bytes") else None for p in probes]
        lines.append(
            f"| {row['variant']} | {_value([p['max_batch'] for p in probes])} | "
            f"{_value([p['safe_batch'] for p in probes])} | {trials} ({failed}, {fresh}) | "
            f"{_value([p['probe_seconds'] for p in probes], '{:.0f}')} | "
            f"{_value([p['per_sample_bytes'] / MIB if p['per_sample_bytes'] else None for p in probes], '{:.2f}')} | "
            f"{_value([p['fixed_bytes'] / MIB if p['fixed_bytes'] else None for p in probes], '{:.0f}')} | "
            f"{ceiling if ceiling is not None else '-'}{narrowed} | {first if first is not None else '-'} | "
            f"{_value([p['judged_max']['found_over_true'] for p in probes if 'judged_max' in p], '{:.3f}')} | "
            f"{at_limit} | {_value(peak_share, '{:.3f}')} | {_safe([p['judged_max'] for p in probes if 'judged_max' in p])} | "
            f"{_safe([p['judged_safe'] for p in probes if 'judged_safe' in p])} |"
        )
        if truth.get("failures_below_ceiling"):
            notes.append(f"{row['variant']}: fresh failures below the truth ceiling at {truth['failures_below_ceiling']}")
    if data.get("narrow_run"):
        narrow_run = data["narrow_run"]
        lines += ["", (f"Truths cut short by time were continued later from their checks by `{narrow_run['command']}` "
                       f"on {narrow_run['environment']['date_utc']} ({narrow_run['seconds']:.0f} s; load average at the "
                       f"start {narrow_run['environment']['load_average_at_start']}); the probes were not rerun.")]
    lines += ["", "Fresh checks (batch: resident peak MiB, 'over' = over the budget, or why it failed):", ""]
    for row in data["variants"]:
        checks = (row["truth"] or {}).get("checks", [])
        described = "; ".join(
            f"{c['batch']}: {c['peak_bytes'] / MIB:.0f}{'' if c['fits'] else ' over'}" if c["peak_bytes"]
            else f"{c['batch']}: {c['error']}" for c in checks
        )
        seconds = (row["truth"] or {}).get("seconds")
        later = (row["truth"] or {}).get("narrowed_later")
        lines.append(f"- {row['variant']}: {described or 'none'}" + (f" ({seconds:.0f} s of child time)" if seconds else "")
                     + (f"; {', '.join(map(str, later))} checked in the later --narrow run" if later else ""))
    lines += ["", "Probe trials (batch: resident peak MiB, f = fresh worker, x = failed):", ""]
    for row in data["variants"]:
        for index, probe in enumerate(p for p in row["probes"] if "error" not in p):
            trials = ", ".join(
                f"{b}{'f' if fresh else ''}{'' if ok else 'x'}" + (f" {peak / MIB:.0f}" if peak else "")
                for b, ok, peak, fresh in probe["trial_batches"]
            )
            label = row["variant"] if len(row["probes"]) == 1 else f"{row['variant']} #{index + 1}"
            lines.append(f"- {label}: {trials}")
    if notes:
        lines += ["", "Notes: " + "; ".join(notes) + "."]
    lines += ["", *reading(data), "", SECTION_END]
    return "\n".join(lines)


def reading(data: dict) -> list[str]:
    """Plain comparisons against float32, from the numbers above (no judgement beyond them)."""
    fraction = data.get("fit_limit_fraction", UNRECORDED_FIT_MARGIN)
    rows = {row["variant"]: [p for p in row["probes"] if "error" not in p] for row in data["variants"]}
    base = rows.get("float32") or []
    if not base or not base[0].get("per_sample_bytes"):
        return []
    base_sample = base[0]["per_sample_bytes"]
    base_truth = next((row["truth"] or {}).get("ceiling") for row in data["variants"] if row["variant"] == "float32")
    parts = []
    for row in data["variants"]:
        probes = rows[row["variant"]]
        if row["variant"] == "float32" or not probes or not probes[0].get("per_sample_bytes"):
            continue
        truth = (row["truth"] or {}).get("ceiling")
        ceiling_ratio = f", truth ceiling {truth / base_truth:.2f}x float32's" if truth and base_truth else ""
        parts.append(f"{row['variant']}: per-sample bytes {probes[0]['per_sample_bytes'] / base_sample:.2f}x "
                     f"float32's, fixed {(probes[0]['fixed_bytes'] - base[0]['fixed_bytes']) / MIB:+.0f} MiB{ceiling_ratio}")
    lines = ["Against float32 (first probe of each): " + "; ".join(parts) + "."] if parts else []
    same = []
    for row in data["variants"]:
        checks = {c["batch"]: c["peak_bytes"] for c in (row["truth"] or {}).get("checks", []) if c["peak_bytes"]}
        probes = rows[row["variant"]]
        pairs = [(b, peak, checks[b]) for b, ok, peak, fresh in (probes[0]["trial_batches"] if probes else [])
                 if fresh and peak and b in checks]
        if pairs:
            same.append(f"{row['variant']} " + ", ".join(f"{b}: {peak / MIB:.0f} vs {truth / MIB:.0f} MiB "
                                                         f"({(peak - truth) / truth:+.1%})" for b, peak, truth in pairs))
    if same:
        lines += ["", "The same batch in a probe's fresh worker and in the truth's new process (probe vs truth): "
                  + "; ".join(same) + "."]
    at_limit = []
    for row in data["variants"]:
        probes = rows[row["variant"]]
        under, _ = fit_limit_truth((row["truth"] or {}).get("checks", []), data["budget_bytes"], fraction)
        if probes and under:
            at_limit.append(f"{row['variant']} {probes[0]['max_batch']}/{under} = {probes[0]['max_batch'] / under:.3f}")
    if at_limit:
        lines += ["", "How to read found/true: the truth ceiling is judged at the budget, while max_batch is defined "
                  f"at {fraction:g} x budget, and a probe's fresh worker may read a batch higher than a new process does "
                  "(the line above), so an answer below the truth ceiling is the safe side by design. Against the "
                  f"largest checked fresh fit under {fraction:g} x budget instead, max_batch is: " + "; ".join(at_limit) + "."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--budget", default="1.5GiB", help="resident memory budget (default 1.5GiB; see the docstring)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    parser.add_argument("--repeats", type=int, default=1, help="probes per variant")
    parser.add_argument("--truth-seconds", type=float, default=600.0, help="wall time the truth of one variant may take")
    parser.add_argument("--jobs", type=int, default=1, help="variants run at the same time")
    parser.add_argument("--benchmarks-md", type=Path, default=None, help="write this bench's section into this file")
    parser.add_argument("--from-json", type=Path, default=None, help="re-render a results file instead of running")
    parser.add_argument("--narrow", action="store_true",
                        help="with --from-json: continue the truths it did not narrow to 1%% (probes not rerun), save it")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if args.narrow and args.from_json is None:
        parser.error("--narrow continues a results file: give it with --from-json")
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text())
        if args.narrow:
            data = narrow(data, variants, args.truth_seconds, args.jobs)
            write_json(RESULTS_FILE, data)
            log(f"wrote {RESULTS_FILE}")
    else:
        data = run(args.model, parse_size_bytes(args.budget), variants, args.repeats, args.truth_seconds, args.jobs)
        write_json(RESULTS_FILE, data)
        log(f"wrote {RESULTS_FILE}")
    publish_section(markdown(data), args.benchmarks_md, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
