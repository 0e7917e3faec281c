"""What a reused probe worker reads against a fresh one (docs/probe-evidence.md, "Bumps").

Runs, in this one process, what a fresh probe worker started as a new process does (build the
model, trace at batch 1, the prewarm steps of probing/api.py) and then a trial at each batch of BATCHES in turn, with the probe's own
`TrialRunner.run_trial` (VmHWM reset before each). Prints one JSON line: for each trial, the
resident size before it and its peak, in MiB. Run it once with only the last batch (a fresh
worker's reading) and once with smaller batches before it (a reused worker's) and compare.

    python tools/reused_worker_check.py small_cnn 300
    python tools/reused_worker_check.py small_cnn 8,16,32,300
    python tools/reused_worker_check.py tests/models/dense_wide.py:build 8,16,32,300 --trim
    python tools/reused_worker_check.py small_cnn 310 --prewarm-batch 1   # 0: no prewarm
    python tools/reused_worker_check.py small_cnn 310,320 --inter-op-threads 0   # TensorFlow's pool

It runs one inter-op thread by default, as the probe's workers do (--inter-op-threads).

`--trim` calls glibc's malloc_trim(0) before each trial (it gave nothing back when measured).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

MIB = 2**20
PREWARM_BATCH = 8  # what a fresh worker's prewarm runs at with the default start batch (probing/api.py)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a built-in name or FILE.py:FUNCTION")
    parser.add_argument("batches", help="comma-separated trial batches, run in this order")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before each trial")
    parser.add_argument("--prewarm-batch", type=int, default=PREWARM_BATCH,
                        help=f"the prewarm's batch (default {PREWARM_BATCH}, the probe's start batch); 0: no prewarm")
    parser.add_argument("--inter-op-threads", type=int, default=1,
                        help="TensorFlow's inter-op threads, as the probe's --inter-op-threads (0: its own pool)")
    args = parser.parse_args()
    batches = [int(batch) for batch in args.batches.split(",")]

    from edgebatch.threads import set_inter_op_threads

    set_inter_op_threads(args.inter_op_threads)

    from edgebatch.probing.api import PREWARM_STEPS
    from edgebatch.probing.trial import TrialRunner
    from edgebatch.sensors.host import process_rss_bytes
    from edgebatch.zoo import build_base_model, optimize_model, parse_model_spec

    model = optimize_model(build_base_model(parse_model_spec(args.model), "float32", "none"), "none")
    runner = TrialRunner(model, optimizer="adam", device="CPU:0")
    runner.run_steps(1, 1)
    if args.prewarm_batch:
        runner.run_steps(args.prewarm_batch, PREWARM_STEPS)
    trials = []
    for batch in batches:
        if args.trim:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        before = process_rss_bytes()
        result = runner.run_trial(batch, args.steps, 60.0)
        trials.append({"batch": batch, "resident_before_mib": round(before / MIB, 1),
                       "peak_mib": round(result["process_peak_bytes"] / MIB, 1) if result["ok"] else None,
                       "error": result.get("error")})
    print(json.dumps({"model": args.model, "trim": args.trim, "inter_op_threads": args.inter_op_threads,
                      "trials": trials}))


if __name__ == "__main__":
    main()
