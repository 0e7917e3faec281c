"""Two ways to turn a spread between processes into the budget readings are judged by, on recorded runs.

The search lowers the budget by the widest spread between fresh readings of one batch, read as a
fraction of the whole peak: budget / (1 + spread) (`outcomes.effective_budget_bytes`). The levels
seen so far are extra allocator regions sized by the step's tensors (docs/probe-evidence.md,
"Why: a step's peak is decided by the allocator's growth in its first step"), so this prints what
the rule would give if the jump were instead scaled by the step's memory above the worker's
baseline (the model, its optimizer slots and TensorFlow, read before any trial):

    k = (high - low) / (low - baseline), at the batch with the widest such ratio
    a reading r fits when r + k x (r - baseline) <= budget, i.e. r <= (budget + k x baseline) / (1 + k)

For each slow_start run of a probe benchmark's results file (`tools/bench/run.py --only probe`) whose
fresh readings differ by more than the noise, it prints both judged budgets and the largest batch
whose lowest fresh reading in the run fits each, then the benchmark truth's readings. That is what each rule would pass among the
readings the run made, not the answer a search under the other rule would have given: its trials
would have gone elsewhere. It needs trial logs that say which trials ran in fresh workers and how
they were started (`fresh`, `forked`), which the benchmark records since 7170769 (its first full run: 0258707).

    python tools/bench/spread_rules.py tools/bench/results/results.json
"""

from __future__ import annotations

import argparse
import json

from edgebatch.probing.margins import fit_budget_bytes
from edgebatch.probing.outcomes import (
    SPREAD_NOISE_FRACTION,
    Outcome,
    lowered_by_spread,
    peak_spread_fraction,
    repeated_fresh_readings,
)

MIB = 2**20


def outcomes_of(trial_log: list[dict]) -> list[Outcome]:
    return [Outcome(t["batch"], ran=t["ok"] or t["error"] == "over_budget", peak_bytes=t["peak_bytes"] or 0,
                    fresh=bool(t.get("fresh")), forked=t.get("forked"), measured=t["error"] != "predicted_over_budget")
            for t in trial_log]


def fresh_readings_by_batch(outcomes: list[Outcome]) -> dict[int, list[Outcome]]:
    by_batch: dict[int, list[Outcome]] = {}
    for o in outcomes:
        if o.fresh and o.reading and o.peak_bytes > 0:
            by_batch.setdefault(o.batch, []).append(o)
    return by_batch


def widest_jump(outcomes: list[Outcome], baseline_bytes: float) -> tuple[float, int, float]:
    """(k, the batch it was read at, the jump in bytes), from the high and low readings the search's
    spread is taken from (outcomes.repeated_fresh_readings)."""
    return max(((high - low) / (low - baseline_bytes), batch, high - low)
               for batch, (high, low) in repeated_fresh_readings(outcomes).items())


def largest_passing(by_batch: dict[int, list[Outcome]], limit_bytes: float) -> int | None:
    return max((b for b, readings in by_batch.items() if min(o.peak_bytes for o in readings) <= limit_bytes), default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a results file of tools/bench/run.py --only probe")
    args = parser.parse_args()
    with open(args.results) as handle:
        results = json.load(handle)
    section = results["sections"]["probe"] if "sections" in results else results["probe"]  # kept full runs: "probe"
    for scenario in section["scenarios"]:
        truth = (scenario.get("truth") or {}).get("ceiling")
        for run in scenario["runs"].get("slow_start", []):
            log = run.get("trial_log") or []
            if not any("fresh" in trial for trial in log):
                print(f"{scenario['scenario']['name']}, run {run.get('repeat', 0) + 1}: its trial log does not say which "
                      "trials ran in fresh workers (runs of the benchmark before 7170769 did not record it); skipped")
                continue
            outcomes = outcomes_of(log)
            spread = peak_spread_fraction(outcomes)
            if spread <= SPREAD_NOISE_FRACTION or not run.get("baseline_bytes"):
                continue
            budget = fit_budget_bytes(scenario["scenario"]["budget_bytes"] or run["budget_bytes"], 1)  # a cap: the worker's own
            baseline = run["baseline_bytes"]
            by_batch = fresh_readings_by_batch(outcomes)
            k, at_batch, jump = widest_jump(outcomes, baseline)
            whole = lowered_by_spread(budget, spread)
            above_baseline = (budget + k * baseline) / (1 + k)
            print(f"{scenario['scenario']['name']}, run {run['repeat'] + 1}: answered {run['found']}, truth {truth}; "
                  f"spread {spread:.1%}, a {jump / MIB:.1f} MiB jump at {at_batch} over a {baseline / MIB:.0f} MiB baseline\n"
                  f"  budget / (1 + spread):            {whole / MIB:8.1f} MiB; largest recorded batch passing: "
                  f"{largest_passing(by_batch, whole)}\n"
                  f"  jump scaled above the baseline:   {above_baseline / MIB:8.1f} MiB; largest recorded batch passing: "
                  f"{largest_passing(by_batch, above_baseline)}\n"
                  f"  the truth's new processes (MiB):  {truth_readings(scenario.get('truth') or {})}")


def truth_readings(truth: dict) -> str:
    """Each batch the benchmark's truth read, with its fresh processes' peaks, low to high."""
    return "; ".join(f"{check['batch']} {'fits' if check['fits'] else 'fails'} "
                     + ", ".join(f"{peak / MIB:,.1f}" for peak in sorted(peak for peak in check.get("peaks") or [] if peak))
                     for check in sorted(truth.get("checks") or [], key=lambda check: check["batch"]))


if __name__ == "__main__":
    main()
