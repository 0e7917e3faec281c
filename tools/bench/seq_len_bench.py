"""The ceiling per sequence length against fresh processes, and the token model's prediction at a length it never saw.

Issue 14, item 2 asks: for the Transformer, the ceiling at 64 tokens above the one at 256, each
within [0.97, 1.0] of the fresh-process truth at a CPU budget, and the fitted token memory model
predicting an unprobed length within 5%. This runs `edgebatch.probe(model, seq_lens=...)` once,
then for every probed length and every `--predict-lens` length searches the truth with
tools/bench/probe_truth.py (tests/support/fresh_step.py with --seq-len: its own step, 10 steps; a
batch fits when it stays under the limit in each of probe_truth.TRUTH_READINGS (3) new processes (6 where their peaks differ by more than 1%),
as section 1's truth does, and fails at the first process over it).

Two truths per length, from the same fresh checks (each check's peak is compared with both):
- at the budget itself: the largest batch whose fresh peak fits the budget;
- at the probe's fitting limit, the budget less the measurement margin (margins.fit_budget_bytes: 0.99 x
  budget with one inter-op thread, the default): the limit `max_batch` is defined by
  (device_profiles/README.md).
Against the first, the margin alone costs 0.01 x budget / (budget - fixed) of the batch (about 2%
at 1.5 GiB, where the process holds ~800 MiB before any batch), so both are reported.
Then REPEAT_PROCESSES (4) more new processes at each length's answer and at its truth's ceiling at
the budget, with the truth's own ones: where processes read one batch at two levels a few
processes per batch may all draw the low one, and the count says how often each batch stays under
the budget. (Until 2026-12-05 the truth read each batch in one process only: seq_lens.json files
before then hold one reading per batch in `fresh_checks`.)

Writes tools/bench/results/seq_lens.json and, with --benchmarks-md, its own section of
BENCHMARKS.md between the markers below (run.py keeps it).

    python tools/bench/seq_len_bench.py --benchmarks-md BENCHMARKS.md      # ~15 minutes on 2 cores
    python tools/bench/seq_len_bench.py --from-json tools/bench/results/seq_lens.json --benchmarks-md BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_truth
from harness import (
    RESULTS_DIR,
    environment,
    load_average,
    log,
    write_json,
    write_section,
)

from edgebatch.probing import per_length, probe, token_fit
from edgebatch.probing.margins import fit_budget_bytes
from edgebatch.profiles import Trial
from edgebatch.units import parse_size_bytes

SECTION_START = "<!-- seq_len_bench:start -->"
SECTION_END = "<!-- seq_len_bench:end -->"
RESULTS_FILE = RESULTS_DIR / "seq_lens.json"
TRUTH_SECONDS_PER_LENGTH = 600.0  # a fit is read in up to 3 processes


# More new processes at the answer and at the truth's ceiling (at the budget), after the truth's
# own ones: where processes read one batch at two levels (docs/probe-evidence.md, "Probing per
# sequence length") a few processes a batch say little about the others.
REPEAT_PROCESSES = 4
UNCACHED_CHECK = probe_truth.fresh_check


def repeated_reading(model: str, length: int, batch: int, budget_bytes: int, earlier: list[dict], extra: int) -> dict:
    """`extra` more new processes at `batch` (fresh_step.py, as the truth runs it), with the truth's
    own processes at it (`earlier`): how many ran under the budget, and their peaks."""
    checks = list(earlier) + [UNCACHED_CHECK(model, batch, None, None, seq_len=length) for _ in range(extra)]
    peaks = [c["peak_bytes"] for c in checks]
    fits = sum(1 for c in checks if c["ran"] and c["peak_bytes"] is not None and c["peak_bytes"] <= budget_bytes)
    log(f"{length} tokens, batch {batch}: {fits} of {len(checks)} new processes under the budget "
        f"(peaks MiB: {[None if p is None else round(p / 2**20, 1) for p in peaks]})")
    return {"batch": batch, "processes": len(checks), "under_budget": fits, "peaks": peaks}


class SharedChecks:
    """probe_truth.fresh_check with a memory: the two truths of one length share their processes.

    A truth reads a batch in up to TRUTH_READINGS processes (twice that between peak levels), one after another
    (probe_truth.repeated_check). Within one truth (`new_truth` starts one) the n-th reading of a
    batch is the n-th process any truth ran at it, started only when no earlier truth got that far;
    each is judged against the asking truth's budget. `readings[(model, batch, seq_len)]` keeps every
    process's result, unjudged.
    """

    def __init__(self, check=None) -> None:
        self.check = check or UNCACHED_CHECK
        self.readings: dict[tuple, list[dict]] = {}
        self.asked: dict[tuple, int] = {}

    def new_truth(self) -> None:
        self.asked = {}

    def __call__(self, model_spec, batch, budget_bytes, headroom_bytes, seq_len=None) -> dict:
        key = (model_spec, batch, seq_len)
        index = self.asked.get(key, 0)
        self.asked[key] = index + 1
        readings = self.readings.setdefault(key, [])
        if index >= len(readings):
            readings.append(self.check(model_spec, batch, None, headroom_bytes, seq_len=seq_len))
        result = dict(readings[index])
        peak = result["peak_bytes"]
        result["fits"] = result["ran"] and (budget_bytes is None or (peak is not None and peak <= budget_bytes))
        return result


def cached_checks() -> SharedChecks:
    """A SharedChecks put in place of probe_truth.fresh_check for this run."""
    checks = SharedChecks()
    probe_truth.fresh_check = checks
    return checks


def truth_at(checks: SharedChecks, model, length, found, hints, budget_bytes) -> dict:
    checks.new_truth()
    deadline = time.monotonic() + TRUTH_SECONDS_PER_LENGTH
    return probe_truth.measure_truth(
        model, [found], hints, budget_bytes=budget_bytes, headroom_bytes=None,
        seconds_left=lambda: deadline - time.monotonic(), seq_len=length,
    )


def run(model: str, budget_bytes: int, probe_lens: tuple[int, ...], predict_lens: tuple[int, ...],
        trial_seconds: float, repeat_processes: int = REPEAT_PROCESSES) -> dict:
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as profiles:
        profile = probe(model, device="CPU:0", memory_budget=budget_bytes, seq_lens=probe_lens,
                        trial_seconds=trial_seconds, profiles_dir=profiles, save=False, progress=log)
    probe_seconds = time.monotonic() - started
    limit = fit_budget_bytes(budget_bytes)
    checks = cached_checks()
    rows = []
    # An untrusted token model (token_fit.trusted) predicts nothing: the probed lengths keep their
    # answers and truths, the others are reported without either, not a crash that loses the run.
    model_trusted = token_fit.trusted(profile.token_model)
    for length in sorted(set(probe_lens) | set(predict_lens)):
        probed = length in profile.per_length
        predicted = given = None
        if model_trusted:
            # The model's line alone under the fitting limit (how well it predicts), and what the
            # profile gives there: the same under the limit lowered by the widest spread a probed
            # length showed (token_fit.profile_ceiling_at_length).
            predicted = token_fit.ceiling_at_length(length, per_length=None, token_model=profile.token_model,
                                                    fit_budget_bytes=limit, headroom=profile.headroom).max_batch
            given = token_fit.profile_ceiling_at_length(profile, length).max_batch
        found = profile.per_length[length].max_batch if probed else given
        trials = sum(1 for t in profile.trials if t.seq_len == length and t.measured)
        if found is None:
            log(f"{length} tokens: not probed, and the token model is not trusted: no prediction to check")
            rows.append({"length": length, "probed": False, "found": None, "predicted_max_batch": None,
                         "trials": trials, "truth": None})
            continue
        hints = sorted({t.batch for t in profile.trials if t.seq_len == length and not t.ok and t.measured})
        truths = {}
        for name, budget in (("budget", budget_bytes), ("fit_limit", limit)):
            truth = truth_at(checks, model, length, found, hints or [int(found * 1.08) + 1], budget)
            truths[name] = {key: truth[key] for key in ("ceiling", "first_failure_above", "narrowed_to_resolution",
                                                         "failures_below_ceiling")}
            truths[name]["found_over_true"] = found / truth["ceiling"] if truth["ceiling"] else None
            log(f"{length} tokens, truth at {name}: {truth['ceiling']} (found {found}, "
                f"ratio {truths[name]['found_over_true']})")
        repeats = None
        if repeat_processes:
            ceiling = truths["budget"]["ceiling"]
            repeats = {
                name: repeated_reading(model, length, batch, budget_bytes, checks.readings.get((model, batch, length), []),
                                       repeat_processes)
                for name, batch in (("answer", found), ("truth", ceiling)) if batch
            }
        rows.append({
            "length": length,
            "probed": probed,
            "repeats": repeats,
            "found": found,
            "predicted_max_batch": predicted,
            "line_over_truth_at_fit_limit": (predicted / truths["fit_limit"]["ceiling"]
                                             if predicted and truths["fit_limit"]["ceiling"] else None),
            "trials": trials,
            "truth": truths,
        })
    return {
        "model": model,
        "budget_bytes": budget_bytes,
        "fit_limit_bytes": limit,
        "trial_seconds": trial_seconds,
        "truth_readings": probe_truth.TRUTH_READINGS,
        "truth_band_factor": probe_truth.BAND_READINGS_FACTOR,
        # The probe's workers and the truth's fresh processes (probe_truth.fresh_check) alike.
        "inter_op_threads": profile.search.get("inter_op_threads"),
        "probe_lens": list(probe_lens),
        "predict_lens": list(predict_lens),
        "probe_seconds": round(probe_seconds, 1),
        "token_model": _token_model_record(profile.token_model),
        "per_length": {str(k): {"max_batch": v.max_batch, "safe_batch": v.safe_batch, "peak_bytes": v.peak_bytes}
                       for k, v in sorted(profile.per_length.items())},
        # Every trial the token model could be fitted on, so another form can be refitted offline.
        "trial_readings": [{"length": t.seq_len, "batch": t.batch, "peak_bytes": t.peak_bytes, "ok": t.ok,
                            "fresh": t.fresh, "forked": t.forked}
                           for t in profile.trials if t.measured and t.peak_bytes is not None],
        "rows": rows,
        "fresh_checks": [{"length": key[2], "batch": key[1], "reading": index, "ran": value["ran"],
                          "peak_bytes": value["peak_bytes"], "seconds": value["seconds"]}
                         for key, values in sorted(checks.readings.items(), key=lambda kv: kv[0][1:])
                         for index, value in enumerate(values)],
        "seconds": round(time.monotonic() - started, 1),
        "environment": environment(),
        "load_average": load_average(),
    }


def _token_model_record(model_fit) -> dict | None:
    """The token model as the results file keeps it (None: no fit at all)."""
    if model_fit is None:
        return None
    return {
        "fixed_bytes": model_fit.fixed_bytes, "per_token_bytes": model_fit.per_token_bytes,
        "per_token_squared_bytes": model_fit.per_token_squared_bytes, "r2": model_fit.r2,
        "points": model_fit.points, "lengths": list(model_fit.lengths), "trusted": token_fit.trusted(model_fit),
    }


def token_model_of(data: dict) -> dict | None:
    """The results' token model; where the probe kept none (it keeps only a trusted one), today's fit
    (token_fit.fit_token_model of per_length.token_readings: children's readings less their steady
    lift) of the kept trial readings, marked `refitted` and untrusted (the run predicted nothing
    with it), to say how far off it was."""
    if data.get("token_model") is not None or not data.get("trial_readings"):
        return data.get("token_model")
    trials = [Trial(batch=r["batch"], ok=r.get("ok", True), error=None, peak_bytes=r["peak_bytes"],
                    process_peak_bytes=r["peak_bytes"], allocator_peak_bytes=None, step_seconds=None,
                    samples_per_second=None, fresh=bool(r.get("fresh")), forked=r.get("forked"), seq_len=r["length"])
              for r in data["trial_readings"]]
    record = _token_model_record(token_fit.fit_token_model(per_length.token_readings(trials)))
    return None if record is None else {**record, "trusted": False, "refitted": True}


def _ratio(row, name):
    if row["truth"] is None:
        return "-"
    value = row["truth"][name]["found_over_true"]
    ceiling = row["truth"][name]["ceiling"]
    narrowed = "" if row["truth"][name]["narrowed_to_resolution"] else " (truth not narrowed to 1%)"
    return "-" if value is None else f"{value:.3f} (truth {ceiling}){narrowed}"


def _repeats(row) -> str:
    """'5 of 5 at 79; 3 of 5 at 95' (repeated_reading), '-' where none were run."""
    repeats = row.get("repeats")
    if not repeats:
        return "-"
    return "; ".join(f"{r['under_budget']} of {r['processes']} at {r['batch']}"
                     for r in (repeats.get("answer"), repeats.get("truth")) if r)


def _line(row) -> str:
    if row["predicted_max_batch"] is None:
        return "-"
    ratio = row.get("line_over_truth_at_fit_limit")
    return str(row["predicted_max_batch"]) + ("" if ratio is None else f" ({ratio:.3f})")


def markdown(data: dict) -> str:
    mib = 1024**2
    model = token_model_of(data)
    lines = [
        SECTION_START,
        "## 8. Ceiling per sequence length (issue 14, item 2)",
        "",
        f"`{data['model']}` probed per length at {', '.join(map(str, data['probe_lens']))} tokens under a "
        f"{data['budget_bytes'] / mib:.0f} MiB resident budget (`--trial-seconds {data['trial_seconds']:g}`), in "
        f"{data['probe_seconds']:.0f} s; lengths {', '.join(map(str, data['predict_lens']))} were not probed and are "
        "the token model's predictions where it is trusted: its line under the fitting limit, and as the answer "
        "what the profile gives (token_fit.profile_ceiling_at_length: the same under the limit lowered by the "
        "widest spread between processes any probed length showed). Truth: fresh processes (tests/support/fresh_step.py --seq-len, 10 steps; "
        + (f"a batch fits when it stays under the limit in each of {data['truth_readings']} new processes, one after another"
           + (f", {data['truth_readings'] * data['truth_band_factor']} where their peaks differ by more than 1%"
              if data.get("truth_band_factor", 1) > 1 else "") + "), "
           if data.get("truth_readings", 1) > 1 else "one new process per batch), ")
        + f"at the budget and at the probe's fitting limit ({data['fit_limit_bytes'] / mib:.0f} MiB, {data['fit_limit_bytes'] / data['budget_bytes']:.3f} x budget, "
        "the limit max_batch is defined by). "
        + (f"Workers and truth ran {data['inter_op_threads']} TensorFlow inter-op thread(s) (`--inter-op-threads`). "
           if data.get("inter_op_threads") else "Workers and truth ran TensorFlow's own inter-op pool. ")
        + "Produced by `python tools/bench/seq_len_bench.py`.",
        "",
    ]
    if model:
        lines += [
            f"Token model: peak = {model['fixed_bytes'] / mib:.1f} MiB + {model['per_token_bytes']:,.0f} B x batch x "
            f"tokens + {model['per_token_squared_bytes']:,.1f} B x batch x tokens^2 (r2 {model['r2']:.4f}, "
            f"{model['points']} readings at {', '.join(map(str, model['lengths']))} tokens"
            + ("; refitted by today's token_fit from the kept readings: the probe kept no model)" if model.get("refitted")
               else ")")
            + (". Not trusted (token_fit.trusted: r2 at least "
               f"{token_fit.MIN_FIT_R2}, {token_fit.MIN_FIT_POINTS} readings, two lengths): no length is predicted."
               if model.get("trusted") is False else "."),
            "",
        ]
    lines += [
        "| tokens | probed | trials | answer | token model's line under the fitting limit (/ truth there) | "
        "answer / truth at the fitting limit | "
        "answer / truth at the budget | new processes under the budget: at the answer; at the truth's ceiling |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        lines.append(
            f"| {row['length']} | {'yes' if row['probed'] else 'no'} | {row['trials']} | {'-' if row['found'] is None else row['found']} | "
            f"{_line(row)} | {_ratio(row, 'fit_limit')} | "
            f"{_ratio(row, 'budget')} | {_repeats(row)} |"
        )
    lines += ["", f"Whole run {data['seconds']:.0f} s, load average {data['load_average']}.", SECTION_END]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="transformer_tiny")
    parser.add_argument("--budget", default="1.5GiB")
    parser.add_argument("--probe-lens", default="64,256,512")
    parser.add_argument("--predict-lens", default="128")
    parser.add_argument("--trial-seconds", type=float, default=4.0)
    parser.add_argument("--repeat-processes", type=int, default=REPEAT_PROCESSES,
                        help="new processes more at each length's answer and at its truth's ceiling (0: none)")
    parser.add_argument("--from-json", default=None, help="re-render a results file instead of running")
    parser.add_argument("--benchmarks-md", default=None, help="write this benchmark's section into BENCHMARKS.md")
    args = parser.parse_args()
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        data = run(args.model, parse_size_bytes(args.budget), token_fit.parse_seq_lens(args.probe_lens),
                   token_fit.parse_seq_lens(args.predict_lens), args.trial_seconds, args.repeat_processes)
        write_json(RESULTS_FILE, data)
        log(f"wrote {RESULTS_FILE}")
    text = markdown(data)
    print(text)
    if args.benchmarks_md:
        write_section(Path(args.benchmarks_md), text, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
