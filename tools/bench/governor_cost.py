"""Micro-benchmark: what the governor costs per optimizer update.

Times `Governor.observe` (the pure policy plus bookkeeping) and `PressureReader.read(force=True)`
with the real sensors (TF allocator, NVML on a GPU device, host memory with cgroup and PSI), using
timeit. Prints one JSON object on stdout: per-call microseconds, median/min/max over the repeats.
No assertions on timing: the numbers are for the report.

    python tools/bench/governor_cost.py [--repeat 7] [--number 2000] [--device CPU:0] [--no-tensorflow]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgebatch.governor import Governor, GovernorConfig, Observation, PressureReader  # noqa: E402

MiB = 1024 * 1024


def summarise(times_seconds: list[float], number: int) -> dict:
    per_call_us = [t / number * 1e6 for t in times_seconds]
    return {
        "number": number,
        "repeat": len(per_call_us),
        "median_us": statistics.median(per_call_us),
        "min_us": min(per_call_us),
        "max_us": max(per_call_us),
    }


def bench_observe(repeat: int, number: int) -> dict:
    """A loop over a varied trace (calm, middle, high, slow-step samples, model readings) so that
    every branch of the policy is exercised, not only the cheapest."""
    config = GovernorConfig(
        ceiling_batch=256, effective_batch=512, cooldown_updates=5, grow_patience=3,
        fixed_bytes=800 * MiB, per_sample_bytes=12 * MiB,
    )
    governor = Governor(config)
    pressures = [0.3, 0.4, 0.5, 0.7, 0.95, None, 0.2, 0.3, 0.35, 0.5]
    trace = [
        Observation(pressure=p, step_seconds=0.1 + 0.01 * (i % 3), micro_batch=64,
                    limit_bytes=16 * 1024 * MiB, used_bytes=2 * 1024 * MiB)
        for i, p in enumerate(pressures)
    ]
    position = [0]

    def observe_once() -> None:
        governor.observe(trace[position[0] % len(trace)])
        position[0] += 1

    times = timeit.repeat(observe_once, repeat=repeat, number=number)
    result = summarise(times, number)
    result["changes"] = len(governor.history)
    return result


def bench_read(repeat: int, number: int, device: str, use_tensorflow: bool) -> dict:
    sources = None
    if not use_tensorflow:
        from edgebatch import sensors

        sources = {"host": sensors.read_host_memory}
    else:
        import tensorflow as tf  # noqa: F401  (imported here so its import time is not measured)

        tf.zeros([1])  # initialise the device so the allocator can be read
    reader = PressureReader(device=device, budget_bytes=8 * 1024 * MiB, sources=sources)
    first = reader.read(force=True)  # warm up: builds the sources, initialises NVML once
    times = timeit.repeat(lambda: reader.read(force=True), repeat=repeat, number=number)
    result = summarise(times, number)
    result["device"] = device
    result["sources"] = sorted(reader.last_readings)
    result["pressure"] = first.pressure
    result["psi_some_avg10"] = first.psi_some_avg10
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timeit repeats (>= 5)")
    parser.add_argument("--number", type=int, default=2000, help="calls per repeat for Governor.observe")
    parser.add_argument("--read-number", type=int, default=200, help="calls per repeat for PressureReader.read")
    parser.add_argument("--device", default="CPU:0", help="device for the pressure reader, e.g. CPU:0 or GPU:0")
    parser.add_argument("--no-tensorflow", action="store_true", help="read host memory only (no TF allocator)")
    args = parser.parse_args(argv)
    if args.repeat < 5:
        parser.error(f"--repeat must be >= 5, got {args.repeat}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    report: dict = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "governor_observe": bench_observe(args.repeat, args.number),
    }
    try:
        report["pressure_read_force"] = bench_read(args.repeat, args.read_number, args.device, not args.no_tensorflow)
    except Exception as exc:  # noqa: BLE001 - report what failed instead of no numbers at all
        report["pressure_read_force"] = {"error": f"{type(exc).__name__}: {exc}"}
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
