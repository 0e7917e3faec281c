"""How TensorFlow's inter-op thread pool moves the resident peak of a training step (docs/probe-evidence.md, "Bumps").

For each case (model, batch, tokens) and each inter-op setting, starts REPEATS new processes. Each
builds the model with the probe's own `TrialRunner`, traces at batch 1, runs the probe's prewarm
(5 steps at batch 8), then STEPS steps at the case's batch, reading the process's resident peak
(VmHWM) after every step. Settings: `default` (TensorFlow's own inter-op pool) and `1` (one
inter-op thread: `tf.config.threading.set_inter_op_parallelism_threads(1)`, what `edgebatch probe`
sets by default).

Prints a table and, with --out, writes JSON: per process, the peak after every step and the median
step time. Read it for: the peak after step 1, 3, 10 and the last; the step of the last rise of
more than 5 MiB; and the spread of the last peak between processes. tests/test_probe_real.py runs
one of its processes (`--child`).

    python tests/support/op_schedule_check.py               # the cases below, 3 processes each, 30 steps
    python tests/support/op_schedule_check.py --case small_cnn:300 --case transformer_tiny:87:256 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MIB = 2**20
DEFAULT_CASES = ("small_cnn:300", "small_cnn:320", "transformer_tiny:87:256", "transformer_tiny:24:512")
SETTINGS = ("default", "1")
JUMP_MIB = 5


def child(case: str, setting: str, steps: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    import tensorflow as tf

    if setting != "default":
        tf.config.threading.set_inter_op_parallelism_threads(int(setting))
    from edgebatch.probing.trial import TrialRunner
    from edgebatch.sensors import process_peak_rss_bytes
    from edgebatch.models.zoo import build_model, parse_model_spec

    name, batch, tokens = parse_case(case)
    runner = TrialRunner(build_model(parse_model_spec(name)), sequence_length=tokens)
    runner.run_steps(1, 1)
    runner.run_steps(8, 5)
    x, y = runner.make_batch(batch)
    peaks, seconds = [], []
    for _ in range(steps):
        started = time.perf_counter()
        runner._step(x, y).numpy()
        seconds.append(time.perf_counter() - started)
        peaks.append(process_peak_rss_bytes())
    print(json.dumps({"peaks_mib": [round(p / MIB, 1) for p in peaks], "step_seconds": statistics.median(seconds[1:])}))


def parse_case(case: str) -> tuple[str, int, int | None]:
    parts = case.split(":")
    if len(parts) not in (2, 3):
        raise SystemExit(f"--case {case!r}: write MODEL:BATCH or MODEL:BATCH:TOKENS")
    return parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else None


def last_rise_step(peaks: list[float]) -> int:
    """The 1-based step after which the peak last rose by more than JUMP_MIB (1: it never did after the first)."""
    return max((i + 1 for i in range(1, len(peaks)) if peaks[i] - peaks[i - 1] > JUMP_MIB), default=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="MODEL:BATCH[:TOKENS]; repeatable")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", help="write every process's readings here as JSON")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "SETTING"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.steps)
        return
    cases = args.case or list(DEFAULT_CASES)
    runs = []
    print(f"{'case':<26} {'inter-op':>8} {'step1':>7} {'step3':>7} {'step10':>7} {'last':>7} {'last rise':>9} {'step s':>6}")
    for case in cases:
        parse_case(case)
        for repeat in range(args.repeats):
            for setting in SETTINGS:  # taking turns, so load drifts hit both settings alike
                done = subprocess.run(
                    [sys.executable, __file__, "--steps", str(args.steps), "--child", case, setting],
                    capture_output=True, text=True, check=False,
                )
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode != 0 or not lines:
                    raise SystemExit(f"{case} ({setting}) failed: {done.stderr.strip().splitlines()[-1:]}")
                run = {"case": case, "inter_op": setting, "repeat": repeat, **json.loads(lines[-1])}
                runs.append(run)
                p = run["peaks_mib"]
                print(f"{case:<26} {setting:>8} {p[0]:>7.0f} {p[2]:>7.0f} {p[min(9, len(p) - 1)]:>7.0f} {p[-1]:>7.0f} "
                      f"{last_rise_step(p):>9} {run['step_seconds']:>6.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"steps": args.steps, "repeats": args.repeats, "runs": runs, "load_average": os.getloadavg()},
                      handle, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
