"""safe_batch by the one-margin rule against the older rule, replayed on recorded probe runs.

Reads a results file of `tools/bench/run.py --only probe` (by default the kept
`tools/bench/results/results.json`), rebuilds each slow_start run's trials from its trial log and
summarises them twice: by `summary.safe_batch_of` as it is now (schema 3: each batch at its
highest new-process reading, only readings at or below max_batch) and by the rule before schema 3
(every reading an anchor, replayed here), both at the default 10% headroom. The older rule's replay must give the safe_batch each run
recorded; the script says where it does not. Each row: the scenario's true ceiling (fresh
processes, section 1), max_batch, both safe batches and their shares of the ceiling.

    python tools/bench/safe_margin_replay.py [results.json] [--markdown] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from edgebatch.probing import summary
from edgebatch.probing.margins import DEFAULT_HEADROOM, fit_budget_bytes
from edgebatch.profiles.model import Trial

HERE = Path(__file__).parent
DEFAULT_RESULTS = HERE / "results" / "results.json"
OLD_HEADROOM = 0.10


def trials_of(trial_log: list[dict]) -> list[Trial]:
    """The run's trials as a profile records them (no step timings: the rules read none)."""
    return [Trial(batch=t["batch"], ok=t["ok"], error=t["error"], peak_bytes=t["peak_bytes"], process_peak_bytes=None,
                  allocator_peak_bytes=None, step_seconds=None, samples_per_second=t.get("samples_per_second"),
                  measured=t.get("measured", True), fresh=t.get("fresh", False), forked=t.get("forked"))
            for t in trial_log]


def old_safe_batch(trials: list[Trial], fit_bytes: int, max_batch: int) -> int | None:
    """safe_batch as schema 2 derived it: 10% headroom, every reading an anchor, the same 10% below
    a hidden limit."""
    model = summary.memory_model_of(trials)
    judged = summary.judged_budget_bytes(trials, fit_bytes)
    ceiling = min(summary.edge_of_trials(trials, judged).lo, max_batch)
    if ceiling < 1:
        return None
    if model is None or model.per_sample_bytes <= 0:
        fits = [t for t in summary.fitting_trials(trials, judged) if t.batch <= ceiling]
        safe = max((t.batch for t in fits if t.peak_bytes <= judged * (1 - OLD_HEADROOM)), default=0)
    else:
        safe = summary.anchor_bounds(trials, fit_bytes, OLD_HEADROOM, model.per_sample_bytes)[0][0]
    safe = min(safe, ceiling)
    edge = summary.hidden_limit_edge_of(trials, judged, model)
    if edge is not None:
        safe = min(safe, math.floor(edge * (1 - OLD_HEADROOM)))
    return max(safe, 1)


def replay_run(run: dict) -> dict:
    trials = trials_of(run["trial_log"])
    fit_bytes = fit_budget_bytes(run["budget_bytes"], run.get("inter_op_threads", 1))
    model = summary.memory_model_of(trials)
    new = summary.safe_batch_of(trials, fit_bytes, DEFAULT_HEADROOM, 1, model, run["found"])
    return {"max_batch": run["found"], "recorded_safe": run["safe_batch"],
            "old_safe": old_safe_batch(trials, fit_bytes, run["found"]), "new_safe": new}


def replay(results: dict) -> list[dict]:
    rows = []
    for scenario in results["sections"]["probe"]["scenarios"]:
        truth = scenario["truth"]["ceiling"]
        runs = [replay_run(run) for run in scenario["runs"].get("slow_start", []) if run.get("trial_log")]
        if not runs:
            continue
        rows.append({
            "scenario": scenario["scenario"]["name"], "true_ceiling": truth, "runs": runs,
            "old_over_truth": statistics.median(r["old_safe"] / truth for r in runs),
            "new_over_truth": statistics.median(r["new_safe"] / truth for r in runs),
            "replay_matches_recorded": all(r["old_safe"] == r["recorded_safe"] for r in runs),
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/probe-rules.md)")
    args = parser.parse_args()
    rows = replay(json.loads(args.results.read_text()))
    if args.markdown:
        print("\n".join(markdown(rows)))
        return
    print(f"{'scenario':<45} {'truth':>6} {'max':>12} {'safe v2':>14} {'safe v3':>14}  v2/truth v3/truth")
    for row in rows:
        runs = row["runs"]
        print(f"{row['scenario']:<45} {row['true_ceiling']:>6} {_span(r['max_batch'] for r in runs):>12} "
              f"{_span(r['old_safe'] for r in runs):>14} {_span(r['new_safe'] for r in runs):>14}  "
              f"{row['old_over_truth']:>9.2f} {row['new_over_truth']:>9.2f}"
              + ("" if row["replay_matches_recorded"] else "  (older rule's replay differs from the recorded safe_batch)"))
    if args.json:
        args.json.write_text(json.dumps({"source": str(args.results), "headroom": DEFAULT_HEADROOM, "rows": rows},
                                        indent=1) + "\n")


def markdown(rows: list[dict]) -> list[str]:
    lines = ["| scenario | true ceiling | max_batch | safe_batch, schema 2 | safe_batch, schema 3 | schema 2 / truth "
             "| schema 3 / truth |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        runs = row["runs"]
        lines.append(f"| {row['scenario']} | {row['true_ceiling']} | {_span(r['max_batch'] for r in runs)} | "
                     f"{_span(r['old_safe'] for r in runs)} | {_span(r['new_safe'] for r in runs)} | "
                     f"{row['old_over_truth']:.2f} | {row['new_over_truth']:.2f} |")
    return lines


def _span(values) -> str:
    values = sorted(values)
    return str(values[0]) if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


if __name__ == "__main__":
    main()
