"""Does the fresh worker's prewarm still earn its keep with one inter-op thread?

The probe's fresh workers run a few steps at a small batch before their trial (api.PREWARM_STEPS at
batch 8), because with TensorFlow's inter-op pool the resident peak climbed over the first steps.
With one inter-op thread the peak is final in the first step (docs/tensorflow-memory.md, "Inter-op
threads"), and the prewarm lifts the reading over a process without one. This runs, for each case,
REPEATS of these arms, alternating: a fork-server worker after a prewarm at each batch of
--prewarm-batches (0: none; the probe's is 8, its start batch), and an independent fresh process
(tests/support/fresh_step.py, the probe tests' truth), all with one inter-op thread and the probe's
trial (worker.py). Prints each peak, the medians and each arm's median against the fresh process's.

    python tools/prewarm_check.py                                   # the cases below, 3 repeats
    python tools/prewarm_check.py --case small_cnn:320 --repeats 5 --out prewarm.json
    python tools/prewarm_check.py --case text_cnn:688 --prewarm-batches 0,4,8
    python tools/prewarm_check.py --case text_cnn:799 --new-process --repeats 8

--new-process starts each worker as a new Python process instead of forking it from the fork server
(how the answer's repeats and a default-budget probe's workers start).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FRESH_STEP = ROOT / "tests" / "support" / "fresh_step.py"
MIB = 2**20
DEFAULT_CASES = ("small_cnn:320", "tests/models/dense_wide.py:build:250", "transformer_tiny:87:256")
TRUTH_STEPS = 10


def parse_case(case: str) -> tuple[str, int, int | None]:
    """MODEL:BATCH[:TOKENS], where MODEL may itself be path.py:function."""
    parts = case.split(":")
    if parts[0].endswith(".py"):
        model, rest = ":".join(parts[:2]), parts[2:]
    else:
        model, rest = parts[0], parts[1:]
    return model, int(rest[0]), int(rest[1]) if len(rest) > 1 else None


def fresh_peak(model: str, batch: int, tokens: int | None) -> int | None:
    args = [sys.executable, str(FRESH_STEP), model, str(batch), str(TRUTH_STEPS), "--inter-op-threads=1"]
    if tokens:
        args.append(f"--seq-len={tokens}")
    done = subprocess.run(args, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]).get("peak_bytes") if lines else None


def worker_peak(server, model: str, batch: int, tokens: int | None, prewarm_batch: int) -> int | None:
    from edgebatch.probing.api import PREWARM_STEPS
    from edgebatch.probing.worker import WorkerSetup, start_worker

    setup = WorkerSetup(model_spec=model, sequence_length=tokens, inter_op_threads=1,
                        prewarm_batch=min(prewarm_batch, batch // 2) or None,
                        prewarm_steps=PREWARM_STEPS if prewarm_batch else 0)
    worker = start_worker(setup, server=server)
    try:
        reply = worker.run_trial(batch)
    finally:
        worker.close()
    return reply.get("process_peak_bytes") if reply.get("ok") else None


def main() -> None:
    from edgebatch.probing.api import PREWARM_STEPS
    from edgebatch.probing.forkserver import ForkServer
    from edgebatch.probing.worker import worker_environment

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="MODEL:BATCH[:TOKENS]; repeatable")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prewarm-batches", default="0,8", help="comma-separated prewarm batches, 0: no prewarm")
    parser.add_argument("--new-process", action="store_true", help="start workers as new processes, not fork-server children")
    parser.add_argument("--out", help="write the readings as JSON here")
    args = parser.parse_args()
    server = None if args.new_process else ForkServer(worker_environment("CPU:0"))
    results = []
    try:
        for case in args.case or DEFAULT_CASES:
            model, batch, tokens = parse_case(case)
            prewarms = [int(text) for text in args.prewarm_batches.split(",")]
            arms: dict[str, list[int]] = {f"prewarm_{p}": [] for p in prewarms} | {"fresh": []}
            for _ in range(args.repeats):
                for arm in arms:
                    peak = (fresh_peak(model, batch, tokens) if arm == "fresh"
                            else worker_peak(server, model, batch, tokens, int(arm.split("_")[1])))
                    if peak is not None:
                        arms[arm].append(peak)
                    print(f"{case} {arm:>10}: {'-' if peak is None else f'{peak / MIB:.1f} MiB'}", flush=True)
            medians = {arm: statistics.median(peaks) for arm, peaks in arms.items() if peaks}
            for arm, median in medians.items():
                ratio = median / medians["fresh"] if "fresh" in medians else float("nan")
                print(f"{case} {arm:>10} median {median / MIB:.1f} MiB  x{ratio:.4f} of fresh", flush=True)
            results.append({"case": case, "peaks_bytes": arms})
    finally:
        if server is not None:
            server.close()
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"inter_op_threads": 1, "prewarm_steps": PREWARM_STEPS,
                                                      "new_process": args.new_process, "cases": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
