"""Does a capped probe worker see the same out-of-memory edge as a fresh process? Count it.

Each run is a new process that builds the model with the probe's own TrialRunner, traces at batch
1, caps its address space (RLIMIT_AS) at its size + HEADROOM, and runs 3 steps at one batch. The
`--order` says where the probe's prewarm (5 steps at batch 8) goes:

  cap-then-prewarm   the probe's first order
  prewarm-then-cap   the probe's order until 2026-12-04 (edgebatch/probing/worker.py)
  no-prewarm         what tests/support/fresh_step.py, the benchmark's truth, does, and what
                     capped fresh workers do now (api.prewarm_of)

Example (dense_wide, 300 MiB: the benchmark's capped scenario):

    python tools/capped_edge.py tests/models/dense_wide.py:build --headroom-mib 300 \\
        --batches 110,128,129 --runs 4

prints, per order and batch, how many runs finished, and how the others ended (a clean
ResourceExhaustedError, or an abort such as std::bad_alloc). Runs with MALLOC_ARENA_MAX=2 and
CUDA hidden, as the probe's capped workers and the truth processes do, and with one TensorFlow
inter-op thread unless --inter-op-threads says otherwise (0: TensorFlow's own pool). Imports no
TensorFlow itself.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDERS = ("cap-then-prewarm", "prewarm-then-cap", "no-prewarm")
PREWARM_BATCH, PREWARM_STEPS, TRIAL_STEPS = 8, 5, 3

CHILD = """
import resource, sys
spec, batch, order, headroom = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
import tensorflow as tf
from edgebatch.probing.trial import TrialRunner
from edgebatch.sensors import process_virtual_bytes
from edgebatch.zoo import build_model, parse_model_spec

runner = TrialRunner(build_model(parse_model_spec(spec)), device="CPU:0")
runner.run_steps(1, 1)

def cap():
    resource.setrlimit(resource.RLIMIT_AS, (process_virtual_bytes() + headroom, resource.RLIM_INFINITY))

if order == "cap-then-prewarm":
    cap()
    runner.run_steps(%(prewarm_batch)d, %(prewarm_steps)d)
elif order == "prewarm-then-cap":
    runner.run_steps(%(prewarm_batch)d, %(prewarm_steps)d)
    cap()
else:
    cap()
try:
    runner.run_steps(batch, %(trial_steps)d)
except tf.errors.ResourceExhaustedError:
    print("RESULT oom", flush=True)
    sys.exit(0)
print("RESULT ok", flush=True)
""" % {"prewarm_batch": PREWARM_BATCH, "prewarm_steps": PREWARM_STEPS, "trial_steps": TRIAL_STEPS}


def run_once(spec: str, batch: int, order: str, headroom_bytes: int, inter_op_threads: int = 1) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), MALLOC_ARENA_MAX="2", CUDA_VISIBLE_DEVICES="-1",
               TF_CPP_MIN_LOG_LEVEL="2")
    if inter_op_threads:
        env["TF_NUM_INTEROP_THREADS"] = str(inter_op_threads)
    done = subprocess.run([sys.executable, "-c", CHILD, spec, str(batch), order, str(headroom_bytes)],
                          env=env, capture_output=True, text=True, timeout=600)
    results = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if results:
        return results[-1]
    last = [line.strip() for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
    return f"exit {done.returncode} ({last[0][:60]})"


def positive_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes like 110,128, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="model spec, e.g. tests/models/dense_wide.py:build or a zoo name")
    parser.add_argument("--headroom-mib", type=int, default=300, help="address space allowed over the size at the cap")
    parser.add_argument("--batches", type=positive_ints, default=[110, 128, 129], help="comma-separated batches")
    parser.add_argument("--runs", type=int, default=4, help="processes per order and batch")
    parser.add_argument("--inter-op-threads", type=int, default=1, help="TensorFlow's inter-op threads (0: its own pool)")
    parser.add_argument("--orders", default=",".join(ORDERS), help=f"comma-separated of {', '.join(ORDERS)}")
    args = parser.parse_args(argv)
    orders = [order.strip() for order in args.orders.split(",") if order.strip()]
    unknown = sorted(set(orders) - set(ORDERS))
    if unknown:
        parser.error(f"unknown orders {unknown!r}: choose from {', '.join(ORDERS)}")
    if args.runs < 1 or args.headroom_mib < 1:
        parser.error("--runs and --headroom-mib must be at least 1")
    for order in orders:
        for batch in args.batches:
            outcomes = collections.Counter(
                run_once(args.model, batch, order, args.headroom_mib * 2**20, args.inter_op_threads) for _ in range(args.runs)
            )
            rest = ", ".join(f"{what} x{count}" for what, count in sorted(outcomes.items()) if what != "ok")
            print(f"{order:<17} batch {batch:>6}: ok {outcomes['ok']}/{args.runs}" + (f"; {rest}" if rest else ""),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
