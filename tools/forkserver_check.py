"""Would a fork server make fresh probe workers cheaper without changing what they measure?

A fresh worker costs a TensorFlow import (8-20 s on 2 busy cores) before it builds the model. A
fork server would import TensorFlow once and fork each worker from it. That only helps if a forked
child's resident peak matches a fresh process's within the measurement margin, and if it runs at
all (TensorFlow's import leaves threads behind, and fork copies only the calling thread).

This runs the same training (tests/support/fresh_step.py: build, trace, STEPS steps at BATCH,
report VmHWM) REPEATS times in each of three arms, alternating: a fresh `python` process; a child
forked from a process that has imported TensorFlow and Keras and run nothing; and such a child
that first re-reads every file-backed page its parent had resident (fork does not copy the page
table entries of file-backed mappings, so a plain forked child's resident set leaves out the
libraries until it touches them again). Prints each peak and wall time, the medians, and the
ratios to the fresh arm.

usage: python tools/forkserver_check.py [MODEL] [BATCH] [STEPS] [REPEATS]   (default small_cnn 128 12 3)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRESH_STEP = ROOT / "tests" / "support" / "fresh_step.py"


def fresh(model: str, batch: int, steps: int) -> tuple[dict, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(FRESH_STEP), model, str(batch), str(steps)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = [text for text in done.stdout.splitlines() if text.startswith("{")]
    if done.returncode != 0 or not line:
        return {"ok": False, "error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}, 0.0
    return json.loads(line[-1]), time.monotonic() - started


def anonymous_bytes() -> int:
    """This process's anonymous memory (smaps_rollup): what a fork server holds beside every trial."""
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    return 0


def forked(model: str, batch: int, steps: int, touch=None) -> tuple[dict, float]:
    """Fork from this process (TensorFlow imported, nothing run) and run fresh_step's main in the child."""
    read_end, write_end = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: fresh_step prints its JSON line to stdout, which the pipe now is
        os.close(read_end)
        if touch is not None:
            touch_pages(touch)
        os.dup2(write_end, 1)
        sys.argv = [str(FRESH_STEP), model, str(batch), str(steps)]
        try:
            fresh_step.main()
            sys.stdout.flush()
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        output = reader.read()
    _, status = os.waitpid(pid, 0)
    line = [text for text in output.splitlines() if text.startswith("{")]
    if status != 0 or not line:
        return {"ok": False, "error": f"child status {status}"}, 0.0
    return json.loads(line[-1]), time.monotonic() - started


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "small_cnn"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    touch = resident_file_pages()
    print(f"fork server: {len(touch)} resident file-backed pages to retouch in each child; "
          f"{anonymous_bytes() / 2**20:.0f} MiB anonymous memory of its own", flush=True)
    results: dict[str, list[tuple[dict, float]]] = {"fresh": [], "forked": [], "retouched": []}
    arms = (("fresh", fresh), ("forked", forked),
            ("retouched", lambda model, batch, steps: forked(model, batch, steps, touch)))
    for repeat in range(repeats):
        for kind, run in arms:
            reply, seconds = run(model, batch, steps)
            results[kind].append((reply, seconds))
            peak = reply.get("peak_bytes")
            print(f"{kind:>6} #{repeat + 1}: peak {peak / 2**20 if peak else float('nan'):8.1f} MiB  {seconds:6.1f} s"
                  + ("" if reply.get("ok") else f"  FAILED {reply.get('error')}"), flush=True)
    medians = {}
    for kind, rows in results.items():
        peaks = [reply["peak_bytes"] for reply, _ in rows if reply.get("ok")]
        walls = [seconds for reply, seconds in rows if reply.get("ok")]
        if peaks:
            medians[kind] = (statistics.median(peaks), statistics.median(walls))
            print(f"{kind:>6} median: peak {medians[kind][0] / 2**20:8.1f} MiB [{min(peaks) / 2**20:.1f}-"
                  f"{max(peaks) / 2**20:.1f}], wall {medians[kind][1]:.1f} s")
    for kind in ("forked", "retouched"):
        if kind in medians and "fresh" in medians:
            print(f"{kind}/fresh: peak {medians[kind][0] / medians['fresh'][0]:.4f}, "
                  f"wall {medians[kind][1] / medians['fresh'][1]:.3f}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(FRESH_STEP.parent))
    import fresh_step  # noqa: E402  (the same routine in both arms)
    import keras  # noqa: E402,F401  (imported and nothing run: what a fork server would hold)
    import tensorflow  # noqa: E402,F401

    import edgebatch.zoo  # noqa: E402,F401
    # The fork server's own page reading (edgebatch/probing/forkserver.py), so this measures what it does.
    from edgebatch.probing.forkserver import resident_file_pages, touch_pages  # noqa: E402

    main()
