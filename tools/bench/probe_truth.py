"""The independent truth for the probe benchmark: does batch B fit, in a fresh process?

Each check runs tests/support/fresh_step.py (its own step, loss and data, apart from the probe's
code on purpose) in a new process: 10 steps at B, then VmHWM; under an address-space cap, whether it
ran at all (a segfault from a oneDNN convolution counts as not fitting, docs/tensorflow-memory.md). A check costs a
TensorFlow import (10-20 s on the shared 2-core machines), so the truth is searched only near the
boundary: the methods' answers first, from the largest down, then a search between the largest
fresh fit and the smallest fresh failure above it, to `resolution` (1% by default).

The bisection assumes a batch above a failure fails too; docs/tensorflow-memory.md says the boundary is fuzzy (1%
under the edge a batch can fail one run in five), so the report lists any failure found below the
ceiling (`failures_below_ceiling`) instead of hiding it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from harness import ROOT, log, run_child
from edgebatch.probing.outcomes import BAND_READINGS_FACTOR, Outcome, levels_seen
from edgebatch.probing.worker import DEFAULT_INTER_OP_THREADS

FRESH_STEP = ROOT / "tests" / "support" / "fresh_step.py"
TRUTH_STEPS = 10  # docs/tensorflow-memory.md: the resident peak climbs for 5-11 steps
CHECK_TIMEOUT_SECONDS = 300
# Largest number of fresh processes one truth may start, so a pathological case cannot eat a run.
MAX_CHECKS = 14
PARALLEL_CHECKS = 2
# A scenario's truth may always take this long, while its section's allowance lasts, even when the
# scenario's methods used up its share: at 2e04e3d mobilenet_v2's slow_start (154 s) and
# shrink_x0.9 (158 s) left its truth two checks, 36 and 37, both failures, and every method's
# answer went unjudged, with about 750 s of the probe section's allowance left. A full mobilenet_v2
# truth took 338 s of child time in two-way parallel checks (a targeted rerun, 8 checks).
TRUTH_FLOOR_SECONDS = 300.0
# New processes a batch must fit in to count as fitting: on an AMD EPYC host one batch reads
# differently in every process (mobilenet_v2 at 30: 1,364-1,552 MiB), and the probe reads its
# answer in three (edgebatch.probing.outcomes.ANSWER_READINGS). A failure ends a check early.
# Where a batch's own readings differ by more than the noise (SPREAD_NOISE_FRACTION), each process
# is a draw between peak levels, and the batch is read BAND_READINGS_FACTOR times as often, as the
# probe reads its answer then (outcomes.answer_readings_wanted): text_cnn at 800 read 1,252 MiB in
# one new process of six, 1,152 MiB in the others (docs/probe-evidence.md).
TRUTH_READINGS = 3


def fresh_check(model_spec: str, batch: int, budget_bytes: int | None, headroom_bytes: int | None,
                seq_len: int | None = None, precision: str = "float32", optimize: str = "none",
                inter_op_threads: int = DEFAULT_INTER_OP_THREADS) -> dict:
    """One fresh-process run at `batch`: fits = it ran (and, with a budget, its peak fit the budget).

    `seq_len`: tokens per example for a model with a variable sequence axis. `precision` (a Keras
    mixed-precision policy) and `optimize` ("qat" or "prune": TFMOT-wrapped, tf_keras) are passed
    to fresh_step.py only when they differ from the defaults. `inter_op_threads`: TensorFlow's
    inter-op threads, always passed: the truth runs what the probe's workers run (default 1).
    """
    args = [str(FRESH_STEP), model_spec, str(batch), str(TRUTH_STEPS), f"--inter-op-threads={inter_op_threads}"]
    if headroom_bytes is not None:
        args.append(str(headroom_bytes))
    if seq_len is not None:
        args.append(f"--seq-len={seq_len}")
    if precision != "float32":
        args.append(f"--precision={precision}")
    if optimize != "none":
        args.append(f"--optimize={optimize}")
    child = run_child(args, CHECK_TIMEOUT_SECONDS)
    reply = child.reply or {}
    ok = bool(reply.get("ok"))
    peak = reply.get("peak_bytes")
    fits = ok and (budget_bytes is None or (peak is not None and peak <= budget_bytes))
    if child.returncode is None:
        error = "timeout"
    elif child.reply is None:
        error = f"exit {child.returncode}"  # killed by a signal: a segfaulting OOM
    else:
        error = reply.get("error")
    return {"batch": batch, "fits": fits, "ran": ok, "peak_bytes": peak, "error": (error or None) and str(error)[:160],
            "seconds": round(child.seconds, 2)}


def repeated_check(model_spec: str, batch: int, budget_bytes: int | None, headroom_bytes: int | None,
                   readings: int = TRUTH_READINGS, **options) -> dict:
    """fresh_check up to `readings` times, one process after another, until one does not fit; up to
    BAND_READINGS_FACTOR times that when the first `readings` peaks differ by more than the noise
    (_levels_differ).

    The result is the first check that failed, else the one with the highest peak; `peaks` lists
    every reading (None for a run that failed without one) and `seconds` their sum.
    """
    results = []
    wanted = readings
    while len(results) < wanted:
        results.append(fresh_check(model_spec, batch, budget_bytes, headroom_bytes, **options))
        if not results[-1]["fits"]:
            break
        if len(results) == readings and _levels_differ([r["peak_bytes"] for r in results]):
            wanted = readings * BAND_READINGS_FACTOR
    failed = [r for r in results if not r["fits"]]
    chosen = failed[0] if failed else max(results, key=lambda r: r["peak_bytes"] or 0)
    return {**chosen, "peaks": [r["peak_bytes"] for r in results],
            "seconds": round(sum(r["seconds"] for r in results), 2)}


# New processes run at one batch, one after another, by `answer_failures`: how often training at an
# answer goes over, where the truth above only says whether TRUTH_READINGS processes all fitted.
ANSWER_PROCESSES = 10
# The confidence of failure_share_upper's bound.
SHARE_CONFIDENCE = 0.95


def answer_failures(model_spec: str, batch: int, budget_bytes: int | None, headroom_bytes: int | None,
                    processes: int = ANSWER_PROCESSES, *, seconds_left=None, check_cost_seconds: float = 15.0,
                    progress=None, **options) -> dict:
    """Run `processes` new processes at `batch`, one after another, and count those that do not fit.

    Unlike repeated_check this does not stop at the first failure: the count of failures out of the
    processes run is the measurement (a training run is one such process, so the share is the chance
    that it goes over). One at a time, as a training run has the machine to itself. `seconds_left()`
    (optional) stops it early when less than `check_cost_seconds` is left; `progress(check)` is
    called after each process. `options` go to fresh_check. Returns the batch, the processes run,
    how many did not fit (`over`), each peak (None where a process failed without one), the errors
    seen, failure_share_upper's bound, and the seconds the processes took.
    """
    checks = []
    while len(checks) < processes and (seconds_left is None or seconds_left() >= check_cost_seconds):
        checks.append(fresh_check(model_spec, batch, budget_bytes, headroom_bytes, **options))
        if progress is not None:
            progress(checks[-1])
    over = sum(not c["fits"] for c in checks)
    return {
        "batch": batch,
        "processes": len(checks),
        "over": over,
        "share_upper": failure_share_upper(over, len(checks)) if checks else None,
        "peaks": [c["peak_bytes"] for c in checks],
        "errors": sorted({c["error"] for c in checks if c["error"]}),
        "seconds": round(sum(c["seconds"] for c in checks), 1),
    }


def failure_share_upper(over: int, processes: int, confidence: float = SHARE_CONFIDENCE) -> float:
    """The one-sided upper confidence bound (Clopper-Pearson) on the share of processes that fail,
    having seen `over` of `processes` fail: 0 of 10 still allows 25.9% at 95%, 0 of 20 13.9%.

    It treats the processes as independent draws. They run one after another, and peak levels can
    come in runs (small_cnn at 326: three high draws of five in a row, docs/probe-evidence.md,
    "The run at cb29ff0"), so the bound is a best case."""
    if not 0 <= over <= processes or processes < 1:
        raise ValueError(f"{over} failures of {processes} processes")
    if over == processes:
        return 1.0

    def at_most_over(share: float) -> float:  # P(failures <= over) when each process fails with `share`
        return sum(math.comb(processes, k) * share**k * (1 - share) ** (processes - k) for k in range(over + 1))

    low, high = over / processes, 1.0  # at_most_over falls as the share grows
    for _ in range(60):
        middle = (low + high) / 2
        if at_most_over(middle) > 1 - confidence:
            low = middle
        else:
            high = middle
    return high


def _levels_differ(peaks: list[int | None]) -> bool:
    """Whether these readings of one batch, each a new process, lie further apart than the noise:
    the probe's own test for peak levels (outcomes.levels_seen)."""
    return levels_seen([Outcome(0, True, peak, fresh=True, forked=False) for peak in peaks if peak])


def truth_seconds_left(share_left, section_left, floor_seconds: float = TRUTH_FLOOR_SECONDS, clock=None):
    """`seconds_left` for measure_truth: the scenario's share (`share_left()`), or, while the truth
    has run less than `floor_seconds`, what is left of that floor, never past the section's
    allowance (`section_left()`). The clock starts when this is called."""
    clock = clock or time.monotonic
    started = clock()

    def left() -> float:
        floor_left = floor_seconds - (clock() - started)
        return max(share_left(), min(floor_left, section_left()))

    return left


def measure_truth(
    model_spec: str,
    found: Iterable[int | None],
    failed_hints: Iterable[int],
    *,
    budget_bytes: int | None,
    headroom_bytes: int | None,
    seconds_left,
    resolution: float = 0.01,
    check_cost_seconds: float = 15.0,
    seq_len: int | None = None,
    precision: str = "float32",
    optimize: str = "none",
    prior_checks: Iterable[dict] = (),
) -> dict:
    """The largest batch that fits in TRUTH_READINGS fresh processes of TRUTH_READINGS, near the methods' answers.

    `found`: the methods' answers; `failed_hints`: batches some method saw fail (first guesses for
    the failure above the ceiling); `seconds_left()`: time this truth may still take. Two checks run
    at a time (a check is a memory fact, not a timing, so sharing the cores does not change it;
    three-way splits then narrow the interval as fast as two bisection steps). Returns the ceiling
    (a fresh fit), the first fresh failure above it, every check, whether the interval was
    narrowed to `resolution`, and, when a method's failure below the ceiling also fails fresh, the
    largest fresh fit under it (`edge_below_first_failure`). `seq_len`, `precision` and `optimize`
    go to every check (fresh_check). `prior_checks`: fresh_check results of an earlier search of
    the same truth, taken as they are (a search cut short by time can be continued).
    """
    checks: dict[int, dict] = {c["batch"]: c for c in prior_checks}
    answers = sorted({b for b in found if b}, reverse=True)
    hints = sorted(set(failed_hints))
    with ThreadPoolExecutor(max_workers=PARALLEL_CHECKS) as pool:

        def run_checks(batches: list[int]) -> None:
            # Only what differs from the defaults, so a stand-in for fresh_check with the older
            # signature (seq_len_bench.cached_checks) keeps working.
            extra = {"seq_len": seq_len} if seq_len is not None else {}
            if precision != "float32":
                extra["precision"] = precision
            if optimize != "none":
                extra["optimize"] = optimize
            futures = {b: pool.submit(repeated_check, model_spec, b, budget_bytes, headroom_bytes, **extra)
                       for b in batches}
            for batch, future in futures.items():
                result = checks[batch] = future.result()
                detail = " ".join(str(result["error"] or result["peak_bytes"]).split())[:80]
                log(f"truth {model_spec.split('/')[-1]} batch {batch}: {'fits' if result['fits'] else 'FAILS'} "
                    f"({detail}, {result['seconds']:.0f} s)")

        while len(checks) < MAX_CHECKS and seconds_left() >= check_cost_seconds:
            wanted = _wanted(checks, answers, hints, resolution)[: min(PARALLEL_CHECKS, MAX_CHECKS - len(checks))]
            if not wanted:
                break
            run_checks(wanted)
        # Is the landscape below the ceiling monotone? Memory at fine scale is not (small_cnn on a
        # 1.5 GiB budget: 300 over, 340 under in fresh processes), so a method's failure below the
        # ceiling is checked fresh, with the largest answer under it, before it is called noise.
        below = _below_ceiling_checks(checks, answers, hints)[: MAX_CHECKS - len(checks)]
        if below and seconds_left() >= check_cost_seconds:
            run_checks(below)
    lo = _largest_fit(checks)
    hi = _first_failure_above(checks, lo)
    narrowed = lo is not None and hi is not None and hi - lo <= max(1, resolution * lo)
    failures_below = sorted(b for b, c in checks.items() if not c["fits"] and lo is not None and b < lo)
    edge = None
    if failures_below:
        edge = max((b for b, c in checks.items() if c["fits"] and b < failures_below[0]), default=None)
    return {
        "ceiling": lo,
        "first_failure_above": hi,
        "narrowed_to_resolution": narrowed,
        "resolution": resolution,
        "checks": [checks[b] for b in sorted(checks)],
        "failures_below_ceiling": failures_below,
        # The largest fresh fit below the first fresh failure: the ceiling of a method that stops at
        # its first failure (None when every checked batch below the ceiling fitted).
        "edge_below_first_failure": edge,
        "seconds": round(sum(c["seconds"] for c in checks.values()), 1),
    }


def _wanted(checks: dict[int, dict], answers: list[int], hints: list[int], resolution: float) -> list[int]:
    """The next batches worth a fresh process, most useful first (see measure_truth)."""
    lo = _largest_fit(checks)
    hi = _first_failure_above(checks, lo)
    # Answers still open: above every fresh fit and below every fresh failure (judge() calls an
    # answer at or above a fresh failure unsafe without running it).
    pending = [a for a in answers if a not in checks and (lo is None or a > lo) and (hi is None or a < hi)]
    wanted = pending[:2] if hi is not None else pending[:1]
    reference = max(pending[:1] + ([lo] if lo is not None else []), default=None)
    if reference is None:
        if hi is not None:  # every answer failed: walk down for a fit
            wanted += [b for b in (int(hi * 0.8), int(hi * 0.6)) if b >= 1]
    elif hi is None:
        above = [h for h in hints if h > reference and h not in checks]
        wanted += sorted(set(above[:1] + [int(reference * 1.08) + 1]))
    elif not pending and lo is not None and hi - lo > max(1, resolution * lo):
        step = max(1, resolution * lo)
        wanted += [lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3] if hi - lo > 3 * step else [(lo + hi) // 2]
    unique = []
    for batch in wanted:
        if batch not in checks and batch not in unique:
            unique.append(batch)
    return unique


def _below_ceiling_checks(checks: dict[int, dict], answers: list[int], hints: list[int]) -> list[int]:
    """The smallest method failure below the fresh ceiling, and the largest answer under it, if unchecked."""
    lo = _largest_fit(checks)
    if lo is None:
        return []
    known = [b for b, c in checks.items() if not c["fits"] and b < lo]
    wanted = []
    if known:
        failure = min(known)
    else:
        under = [h for h in hints if h < lo and h not in checks]
        if not under:
            return []
        failure = min(under)
        wanted.append(failure)
    below = [a for a in answers if a < failure and a not in checks]
    if below and not any(c["fits"] and b < failure for b, c in checks.items()):
        wanted.append(max(below))
    return wanted


def judge(found: int | None, truth: dict) -> dict:
    """found / true ceiling, and whether the answer was unsafe (failed, or above the truth)."""
    ceiling = truth.get("ceiling")
    checked = {c["batch"]: c for c in truth.get("checks", [])}
    if found is None:
        return {"found_over_true": None, "found_over_true_low": None, "found_over_edge": None, "unsafe": False,
                "verdict": "no answer"}
    ratio = found / ceiling if ceiling else None
    # The true ceiling lies in [ceiling, first_failure_above - 1]: the ratio's other end.
    above = truth.get("first_failure_above")
    ratio_low = found / (above - 1) if ceiling and above and above - 1 >= ceiling else None
    if found in checked:
        unsafe = not checked[found]["fits"]
        verdict = "failed in a fresh process" if unsafe else "fits in a fresh process"
    elif ceiling is not None and found <= ceiling:
        unsafe, verdict = False, "below a fresh fit"
    elif truth.get("first_failure_above") is not None and found >= truth["first_failure_above"]:
        unsafe, verdict = True, "at or above a fresh failure"
    else:
        unsafe, verdict = None, "not checked"
    edge = truth.get("edge_below_first_failure")
    return {"found_over_true": ratio, "found_over_true_low": ratio_low, "found_over_edge": found / edge if edge else None,
            "unsafe": unsafe, "verdict": verdict}


def _largest_fit(checks: dict[int, dict]) -> int | None:
    return max((b for b, c in checks.items() if c["fits"]), default=None)


def _first_failure_above(checks: dict[int, dict], lo: int | None) -> int | None:
    """The smallest fresh failure above `lo` (above nothing when no batch fitted yet)."""
    return min((b for b, c in checks.items() if not c["fits"] and (lo is None or b > lo)), default=None)
