"""Where a probe's wall time goes: every trial of one search, stamped with the seconds since start.

Runs the search `edgebatch probe` runs (api._search, with its fork server where the budget leaves
room for one) on one model under an explicit CPU budget, and prints each progress line after the
seconds elapsed, so the cost of a scout start, a fork-server child's trial, a new process's
reread and the side-by-side repeats can be read off the gaps. Nothing is saved.

    python tools/probe_timeline.py tests/models/dense_wide.py:build --budget-mib 1400
    python tools/probe_timeline.py small_cnn --budget-mib 1536 --strategy binsearch_checked
    python tools/probe_timeline.py mobilenet_v2 --budget-mib 20000 --scout-only

`--scout-only` stops once the scout is ready: its two start-up stamps are what a probe that reuses a
cached profile waits for (the model built) and what one that searches waits for (the step traced).
"""

from __future__ import annotations

import argparse
import time

from edgebatch.probing.outcomes import STRATEGIES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a built-in model name or FILE.py:FUNCTION")
    parser.add_argument("--budget-mib", type=int, required=True, help="resident budget in MiB")
    parser.add_argument("--strategy", default="slow_start", choices=STRATEGIES, help="search strategy (default slow_start)")
    parser.add_argument("--scout-only", action="store_true", help="stop once the scout is ready (no search)")
    args = parser.parse_args()

    from edgebatch.probing import api, margins
    from edgebatch.probing.search import SearchConfig
    from edgebatch.probing.worker import WorkerSetup, await_identity, await_ready, spawn_worker
    from edgebatch.zoo import parse_model_spec

    started = time.perf_counter()

    def stamp(line: str) -> None:
        print(f"{time.perf_counter() - started:6.1f} s {line}", flush=True)

    setup = WorkerSetup(model_spec=parse_model_spec(args.model).text, device="CPU:0")
    budget_bytes = args.budget_mib * 1024**2
    workers = [spawn_worker(setup)]
    try:
        await_identity(workers[0])
        stamp("scout built the model (a new process: TensorFlow imported; what a reused profile waits for)")
        await_ready(workers[0])
        stamp("scout ready (step traced)")
    finally:
        if args.scout_only:
            workers[0].close(at_once=True)
    if args.scout_only:
        return
    config = SearchConfig(
        budget_bytes=margins.fit_budget_bytes(budget_bytes, setup.inter_op_threads), strategy=args.strategy,
        baseline_bytes=workers[0].facts.get("baseline_process_bytes"),
        bump_edge_fraction=margins.bump_edge_fraction(setup.inter_op_threads),
    )
    fork = api._FreshWorkers("CPU:0", budget_bytes, stamp)
    try:
        _, final = api._search(config, setup, workers, "process_peak", stamp, fork)
    finally:
        for worker in workers:
            worker.close()
        fork.close()
    stamp(f"answer {final.max_batch}")


if __name__ == "__main__":
    main()
