"""Does a worker started ahead read what a brand-new process reads? Count it, side by side.

The probe reads its answer's repeats in new processes; where the device has room it spawns them
ahead of need (edgebatch/probing/spares.py), so each imports TensorFlow, builds the model and
traces the step while other trials run, and then waits for its batch. This runs both kinds at one
batch, alternating: each round spawns a spare, runs a brand-new process's whole start and trial
while the spare waits beside it (as in the probe), then the spare's trial. Both run what the
probe's repeats run (one inter-op thread, no prewarm, REPEAT_STEPS within --trial-seconds). It
reports each kind's peaks and how long each trial took from the moment it was asked for.

    python tools/bench/spare_check.py --case small_cnn:324 --case text_cnn:700 --rounds 10 \\
        --benchmarks-md BENCHMARKS.md

`--from-json` renders a kept run again. A round costs two TensorFlow imports (10-30 s here).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

from harness import MIB, RESULTS_DIR, ROOT, environment, log, publish_section, write_json

sys.path.insert(0, str(ROOT))

from edgebatch.probing.api import REPEAT_STEPS  # noqa: E402
from edgebatch.probing.worker import WorkerSetup, await_ready, spawn_worker  # noqa: E402

SECTION_START = "<!-- spare_check:start -->"
SECTION_END = "<!-- spare_check:end -->"
KINDS = ("new process", "started ahead")


def setup_of(model: str, trial_seconds: float) -> WorkerSetup:
    return WorkerSetup(model_spec=model, steps_per_trial=REPEAT_STEPS, trial_seconds=trial_seconds,
                       inter_op_threads=1)


def timed_trial(worker, batch: int, asked: float) -> dict:
    """`worker`'s trial at `batch`; seconds from `asked` (when the trial was wanted) to its reply."""
    try:
        await_ready(worker)
        reply = worker.run_trial(batch)
    finally:
        worker.close()
    return {"peak_mib": (reply.get("process_peak_bytes") or 0) / MIB or None, "ok": bool(reply.get("ok")),
            "settled": reply.get("resident_settled"), "seconds_to_reply": round(time.monotonic() - asked, 2)}


def run_round(setup: WorkerSetup, batch: int) -> dict:
    spare = spawn_worker(setup)
    try:
        fresh = timed_trial(spawn_worker(setup), batch, time.monotonic())
        ahead = timed_trial(spare, batch, time.monotonic())
    finally:
        spare.close(at_once=True)
    return {"new process": fresh, "started ahead": ahead}


def measure(cases: list[tuple[str, int]], rounds: int, trial_seconds: float) -> dict:
    results = {"environment": environment(), "rounds": rounds, "trial_seconds": trial_seconds, "cases": []}
    for model, batch in cases:
        setup = setup_of(model, trial_seconds)
        runs = []
        for index in range(rounds):
            runs.append(run_round(setup, batch))
            log(f"{model} at {batch}, round {index + 1}/{rounds}: "
                + ", ".join(f"{kind} {runs[-1][kind]['peak_mib']:.1f} MiB in {runs[-1][kind]['seconds_to_reply']} s"
                            for kind in KINDS))
        results["cases"].append({"model": model, "batch": batch, "runs": runs})
    return results


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):,.1f} [{min(values):,.1f}-{max(values):,.1f}]"


def render(results: dict) -> str:
    env = results["environment"]
    lines = [SECTION_START, "## 14. Fresh readings from workers started ahead", "",
             f"Run at {env.get('git_commit')} on {env.get('date_utc')} ({env.get('cpu')}, {env.get('cores')} cores): "
             f"`python tools/bench/spare_check.py` with {results['rounds']} rounds per case, --trial-seconds "
             f"{results['trial_seconds']:g}. Each round: a spare spawned, a brand-new process started and run while "
             "the spare waits, then the spare's trial; medians [min-max].", "",
             "| case | kind | peak MiB | runs that failed | not settled | seconds from asking to the reply |",
             "|---|---|---|---|---|---|"]
    for case in results["cases"]:
        for kind in KINDS:
            readings = [run[kind] for run in case["runs"]]
            peaks = [r["peak_mib"] for r in readings if r["peak_mib"]]
            lines.append(
                f"| {case['model']} at {case['batch']} | {kind} | {_summary(peaks)} | "
                f"{sum(not r['ok'] for r in readings)} of {len(readings)} | "
                f"{sum(r['settled'] is False for r in readings)} | "
                f"{_summary([r['seconds_to_reply'] for r in readings])} |")
    lines += ["", SECTION_END]
    return "\n".join(lines)


def parse_case(text: str) -> tuple[str, int]:
    model, _, batch = text.rpartition(":")
    if not model or not batch.isdigit():
        raise argparse.ArgumentTypeError(f"a case is MODEL:BATCH, e.g. small_cnn:324, got {text!r}")
    return model, int(batch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", type=parse_case, help="MODEL:BATCH (repeatable)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per case (one process of each kind each)")
    parser.add_argument("--trial-seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "spare_check.json")
    parser.add_argument("--from-json", type=Path, help="render a kept run instead of measuring")
    parser.add_argument("--benchmarks-md", type=Path, help="put the section into this file")
    args = parser.parse_args(argv)
    if args.from_json is not None:
        import json

        results = json.loads(args.from_json.read_text())
    else:
        if not args.case:
            parser.error("give at least one --case MODEL:BATCH, or --from-json")
        if args.rounds < 1:
            parser.error(f"--rounds must be at least 1, got {args.rounds}")
        results = measure(args.case, args.rounds, args.trial_seconds)
        results["command"] = "python tools/bench/spare_check.py " + shlex.join(
            arg for arg in (argv if argv is not None else sys.argv[1:]))
        write_json(args.out, results)
    publish_section(render(results), args.benchmarks_md, SECTION_START, SECTION_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
