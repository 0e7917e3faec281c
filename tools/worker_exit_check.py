"""How long a probe worker takes to end once the probe closes it (Worker.close, graceful).

    python tools/worker_exit_check.py [MODEL_SPEC] [BATCH] [--repeats N]

Each worker runs one trial at BATCH, then is closed the way a probe closes it before a fresh
trial: its input is closed and the probe waits for it to exit. Three kinds are timed:

- `new process`: `python -m edgebatch.probing.worker`, which ends with
  worker.run_and_exit (os._exit after a flush);
- `new process, interpreter shutdown`: the same worker_main run through `sys.exit`, which is how
  workers ended before (Python's shutdown, TensorFlow's teardown included);
- `fork-server child`: forked from a fork server, which ends with os._exit.

Prints the median and range of each in seconds. Default: tests/models/dense_wide.py:build at 240.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgebatch.probing.forkserver import ForkServer  # noqa: E402
from edgebatch.probing.worker import WorkerSetup, start_worker, worker_environment  # noqa: E402

INTERPRETER_SHUTDOWN = [sys.executable, "-c", "import sys; from edgebatch.probing.worker import worker_main; sys.exit(worker_main())"]


def close_seconds(setup: WorkerSetup, batch: int, command=None, server=None) -> float:
    worker = start_worker(setup, command=command, server=server)
    reply = worker.run_trial(batch)
    if not reply.get("ok"):
        raise SystemExit(f"the trial at {batch} did not fit: {reply}")
    started = time.perf_counter()
    worker.close()
    seconds = time.perf_counter() - started
    if worker.process.returncode != 0:
        raise SystemExit(f"the worker ended with {worker.process.returncode}, not 0")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(ROOT / "tests" / "models" / "dense_wide.py") + ":build")
    parser.add_argument("batch", nargs="?", type=int, default=240)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    setup = WorkerSetup(model_spec=args.model, precision="float32", optimizer="adam", device="CPU:0",
                        steps_per_trial=3, trial_seconds=10.0)
    server = ForkServer(worker_environment("CPU:0"))
    server.wait_ready()
    try:
        kinds = {
            "new process": lambda: close_seconds(setup, args.batch),
            "new process, interpreter shutdown": lambda: close_seconds(setup, args.batch, command=INTERPRETER_SHUTDOWN),
            "fork-server child": lambda: close_seconds(setup, args.batch, server=server),
        }
        for name, measure in kinds.items():
            seconds = [measure() for _ in range(args.repeats)]
            print(f"{name:<36} close {statistics.median(seconds):.2f} s [{min(seconds):.2f}-{max(seconds):.2f}]"
                  f" over {args.repeats} workers", flush=True)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
