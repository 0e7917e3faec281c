"""How long `edgebatch probe` takes to stop after Ctrl-C or SIGTERM, sent at a chosen point of its search.

Starts `edgebatch probe --model MODEL --memory-budget BUDGET --device CPU:0` with SIGINT and SIGTERM at
their defaults (as at a terminal), waits for the Nth progress line that reports a fitted trial, sleeps
a delay (fixed, or drawn from 0..DELAY for each repeat), sends the signal, and prints one line per
repeat: the seconds until the probe exited and its exit code, the processes it left behind (found by
a marker in their environment), what it wrote to its profiles directory, and the last progress line
before the signal. A probe that has not exited 120 s after the signal is killed and reported as HUNG.

    # SIGTERM during the answer's side-by-side repeats: small_cnn under 3 GiB fits 8, 16 and 32 in
    # the scout, then its last fork-server child (the 7th fit) just before the repeats on the 2-core
    # hosts here; the probe exited 19.0 s after the signal before 3b9af8b, 0.4 s after
    python tools/stop_timing.py --after-fits 7 --delay 8
    # the test's moment (the first fitted trial), at random delays up to 12 s, 25 times
    python tools/stop_timing.py --after-fits 1 --delay 12 --random --repeats 25
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import psutil

MARKER = "EDGEBATCH_STOP_TIMING_MARK"


def _defaults_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _marked(value: str) -> list[int]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARKER) == value:
                found.append(process.pid)
        except (psutil.Error, OSError):
            pass
    return found


def one_stop(args: argparse.Namespace, delay_seconds: float) -> str:
    profiles_dir = tempfile.mkdtemp(prefix="edgebatch-stop-")
    mark = str(uuid.uuid4())
    command = [sys.executable, "-m", "edgebatch", "probe", "--model", args.model, "--memory-budget", args.budget,
               "--device", "CPU:0", "--profiles-dir", profiles_dir]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, MARKER: mark}, preexec_fn=_defaults_as_at_a_terminal)
    fits = threading.Semaphore(0)
    last = [""]

    def read() -> None:
        for line in process.stderr:
            last[0] = line.strip()
            if " ok " in line and "batch" in line:
                fits.release()

    threading.Thread(target=read, daemon=True).start()
    for _ in range(args.after_fits):
        if not fits.acquire(timeout=600):
            process.kill()
            return f"no fitted trial number {args.after_fits} within 600 s"
    time.sleep(delay_seconds)
    signalled = time.monotonic()
    before = last[0]
    process.send_signal(args.signal)
    try:
        code = process.wait(timeout=120)
        outcome = f"exited {code} after {time.monotonic() - signalled:.1f} s"
    except subprocess.TimeoutExpired:
        process.kill()
        outcome = "HUNG: still running 120 s after the signal"
    time.sleep(1)
    written = os.listdir(profiles_dir)
    return (f"signal {delay_seconds:.1f} s after fit {args.after_fits}: {outcome}; left {_marked(mark)}; "
            f"wrote {written}; last line before it: {before!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small_cnn", help="built-in model or FILE.py:FUNCTION (default small_cnn)")
    parser.add_argument("--budget", default="3GiB", help="--memory-budget for the probe (default 3GiB)")
    parser.add_argument("--after-fits", type=int, default=1, help="send the signal after this many fitted trials")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait after that trial (default 0)")
    parser.add_argument("--random", action="store_true", help="draw each repeat's delay from 0..--delay")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--signal", type=lambda name: signal.Signals[name], default=signal.SIGTERM,
                        help="SIGTERM (default) or SIGINT")
    parser.add_argument("--seed", type=int, default=1, help="seed for --random")
    args = parser.parse_args()
    draw = random.Random(args.seed)
    for repeat in range(args.repeats):
        delay = draw.uniform(0, args.delay) if args.random else args.delay
        print(f"{repeat}: {one_stop(args, delay)}", flush=True)


if __name__ == "__main__":
    main()
