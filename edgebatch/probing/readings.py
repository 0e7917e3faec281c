"""A worker's reply as a profile's Trial, and the line the probe prints for it."""

from __future__ import annotations

from collections.abc import Callable

from edgebatch.probing.worker import MEASURE_FIELDS
from edgebatch.profiles import Trial
from edgebatch.units import format_bytes

# What the probe tells its caller, a line at a time (print, a log, a test's list).
Progress = Callable[[str], None]


def trial_from_reply(reply: dict, measure: str, budget_bytes: int) -> Trial:
    """The Trial a worker's trial `reply` gives: its `measure`'s peak (worker.MEASURE_FIELDS) judged
    against `budget_bytes` (the fit figure: Budget.fit_bytes, or less where readings spread)."""
    if not reply.get("ok"):
        return Trial(
            batch=reply["batch"], ok=False, error=reply.get("error") or "oom", peak_bytes=None,
            process_peak_bytes=None, allocator_peak_bytes=None, step_seconds=None, samples_per_second=None,
        )
    peak = reply.get(MEASURE_FIELDS[measure])
    fits = peak is not None and peak <= budget_bytes
    return Trial(
        batch=reply["batch"],
        ok=fits,
        error=None if fits else "over_budget",
        peak_bytes=peak,
        process_peak_bytes=reply.get("process_peak_bytes"),
        allocator_peak_bytes=reply.get("allocator_peak_bytes"),
        step_seconds=reply.get("step_seconds"),
        samples_per_second=reply.get("samples_per_second"),
        settled=reply.get("resident_settled"),
        steady=reply.get("steady"),
    )


def trial_line(trial: Trial) -> str:
    """The progress line of one trial: its batch, verdict, peak and throughput."""
    if trial.peak_bytes is None:
        return f"  batch {trial.batch:>6}  {trial.error.upper().replace('_', ' ')}"
    status = "ok" if trial.ok else "OVER BUDGET"
    return (
        f"  batch {trial.batch:>6}  {status:<11} peak {format_bytes(trial.peak_bytes):>11}  "
        f"{trial.samples_per_second:8.1f} samples/s" + ("  (peak still rising)" if trial.settled is False else "")
    )
