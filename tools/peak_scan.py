"""Is the resident peak monotone in batch? One fresh process per batch, on a grid (docs/probe-evidence.md, "Bumps").

For each batch in the grid, starts a new process (tests/support/fresh_step.py, the probe tests' independent
truth: its own step, loss and data) that trains STEPS steps and reports its resident peak (VmHWM). With
TensorFlow's inter-op pool the peak of one batch differs between processes and climbs over many steps, so a
scan under the pool shows "bumps" (a batch reading higher than a larger one). With one inter-op thread (what
`edgebatch probe` runs by default) the scan says whether bumps remain: a drop of more than NOISE_MIB from one
batch to a larger one is printed as non-monotone.

    python tools/peak_scan.py small_cnn 280:420:10
    python tools/peak_scan.py tests/models/dense_wide.py:build 200:360:10 --inter-op-threads 0 --out scan.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

MIB = 2**20
NOISE_MIB = 2.0  # fresh processes with one inter-op thread read the same batch within 0.05% (about 1 MiB here)
FRESH_STEP = pathlib.Path(__file__).resolve().parents[1] / "tests" / "support" / "fresh_step.py"


def grid(text: str) -> list[int]:
    start, stop, step = (int(part) for part in text.split(":"))
    return list(range(start, stop + 1, step))


def fresh_peak_bytes(model: str, batch: int, steps: int, threads: int) -> int | None:
    args = [sys.executable, str(FRESH_STEP), model, str(batch), str(steps), f"--inter-op-threads={threads}"]
    if threads == 0:
        args = args[:-1]  # fresh_step.py leaves TensorFlow's pool in place without the option
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return None
    return json.loads(lines[-1]).get("peak_bytes")


def drops(peaks: list[tuple[int, int]]) -> list[tuple[int, int, float]]:
    """(smaller batch, larger batch, MiB the larger one reads lower) for every drop over NOISE_MIB."""
    found = []
    for index, (batch, peak) in enumerate(peaks):
        for later_batch, later_peak in peaks[index + 1:]:
            if (peak - later_peak) / MIB > NOISE_MIB:
                found.append((batch, later_batch, (peak - later_peak) / MIB))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="zoo name or path/to/file.py:function")
    parser.add_argument("batches", type=grid, help="START:STOP:STEP (inclusive)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--inter-op-threads", type=int, default=1, help="0: TensorFlow's own pool")
    parser.add_argument("--out", help="write the scan as JSON here")
    args = parser.parse_args()
    peaks = []
    for batch in args.batches:
        peak = fresh_peak_bytes(args.model, batch, args.steps, args.inter_op_threads)
        if peak is None:
            print(f"batch {batch:>5}: no reading", flush=True)
            continue
        step_mib = (peak - peaks[-1][1]) / MIB if peaks else 0.0
        print(f"batch {batch:>5}: {peak / MIB:9.1f} MiB  ({step_mib:+.1f})", flush=True)
        peaks.append((batch, peak))
    found = drops(peaks)
    for batch, later, mib in found:
        print(f"non-monotone: {later} reads {mib:.1f} MiB below {batch}")
    if not found:
        print(f"monotone within {NOISE_MIB} MiB over {len(peaks)} batches")
    if args.out:
        record = {"model": args.model, "steps": args.steps, "inter_op_threads": args.inter_op_threads,
                  "peaks": [{"batch": b, "peak_bytes": p} for b, p in peaks],
                  "drops": [{"batch": b, "larger_batch": later, "mib": round(mib, 1)} for b, later, mib in found]}
        pathlib.Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
