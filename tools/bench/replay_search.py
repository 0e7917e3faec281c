"""Replay a probe benchmark's slow_start runs against the search as it is now, and say where it departs.

Reads a results file of `tools/bench/run.py --only probe` (`tools/bench/results/results.json`, or a
kept one such as `probe_mobilenet_v2_targeted_e3f0f9d.json`) and, for each slow_start run, feeds its
trial log to `edgebatch.probing.search.next_step` one
trial at a time. It prints the answer the run gave and the first trial where the search now asks
for something else; after that point the run's readings no longer answer the search's questions,
so the replay stops judging.

The trial log does not say which worker read each trial, so it is inferred from the order, as the
api starts them: the first trial is the scout's first (fresh, a new process); a trial the search
asks to run fresh is a fork-server child the first time its batch is read fresh and a new process
after that; other trials are the scout's reused ones. The budget is the scenario's less the 1%
measurement margin, with one inter-op thread (no bump edge fraction), as the benchmark ran; under
an address-space cap it is the run's own (its worker's size after setup plus the cap).

    git show 2122726:tools/bench/results/results.json > /tmp/results_2e04e3d.json
    python tools/bench/replay_search.py /tmp/results_2e04e3d.json
"""

from __future__ import annotations

import argparse
import json

from edgebatch.probing.margins import bump_edge_fraction, fit_budget_bytes
from edgebatch.probing.search import Done, Outcome, Run, SearchConfig, Skip, next_step


def replay(trial_log: list[dict], budget_bytes: int, max_batch_limit: int) -> tuple[int | None, tuple | None]:
    """(the answer the current search gives at the end of the log, the first departure or None).

    A departure is (index in the log, what the search asked for, what the run did)."""
    config = SearchConfig(budget_bytes=fit_budget_bytes(budget_bytes, 1), bump_edge_fraction=bump_edge_fraction(1),
                          max_batch_limit=max_batch_limit)
    outcomes: list[Outcome] = []
    read_fresh: set[int] = set()
    departure = None
    for index, trial in enumerate(trial_log):
        step = next_step(config, outcomes)
        skipped = trial["error"] == "predicted_over_budget"
        asked = ("done", step.max_batch) if isinstance(step, Done) else (
            "skip" if isinstance(step, Skip) else "run", step.batch)
        if departure is None and asked != ("skip" if skipped else "run", trial["batch"]):
            departure = (index, asked, ("skip" if skipped else "run", trial["batch"]))
        if skipped:
            outcomes.append(Outcome(trial["batch"], ran=False, peak_bytes=trial["peak_bytes"], measured=False))
            continue
        fresh = index == 0 or (isinstance(step, Run) and step.batch == trial["batch"] and step.fresh)
        forked = None if index == 0 or not fresh else trial["batch"] not in read_fresh
        if fresh:
            read_fresh.add(trial["batch"])
        ran = trial["ok"] or trial["error"] == "over_budget"
        outcomes.append(Outcome(trial["batch"], ran=ran, peak_bytes=trial["peak_bytes"], fresh=fresh, forked=forked))
    final = next_step(config, outcomes)
    return (final.max_batch if isinstance(final, Done) else None), departure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a probe benchmark results file")
    args = parser.parse_args()
    data = json.loads(open(args.results).read())
    for scenario in data["sections"]["probe"]["scenarios"]:
        facts = scenario["scenario"]
        for number, run in enumerate(scenario["runs"]["slow_start"], 1):
            budget_bytes = facts["budget_bytes"] or run["budget_bytes"]  # a cap: the worker's own
            answer, departure = replay(run["trial_log"], budget_bytes, facts["max_batch_limit"])
            where = "follows the run to its end" if departure is None else (
                f"departs at trial {departure[0] + 1}: asks {departure[1]}, the run did {departure[2]}")
            print(f"{facts['name']}, run {number}: answered {run['found']}; the search now {where}"
                  + (f" and answers {answer}" if departure is None else ""))


if __name__ == "__main__":
    main()
