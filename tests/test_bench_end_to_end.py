"""tools/bench/end_to_end_bench.py: the C20 bisection, a training run's figures, the targets and the section.

No processes: probe_truth.fresh_check is replaced by a scripted reading, training runs by their records.
"""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench"
sys.path.insert(0, str(BENCH))

import end_to_end_bench as bench  # noqa: E402
import probe_truth  # noqa: E402

MIB = 1024**2


def bisect(largest_fit: int, start: int, processes: int = 20) -> dict:
    """c20_next_batch driven to the end against a monotone edge: batches up to `largest_fit` pass."""
    counts, steps = {}, []
    while (step := bench.c20_next_batch(counts, start, wanted=processes)) is not None:
        batch, wanted = step
        assert wanted in (1, processes) and not (batch in counts and counts[batch].processes == processes)
        fits = batch <= largest_fit
        counts[batch] = bench.Count(batch, wanted if fits else 1, 0 if fits else 1, (), 0.0)
        steps.append(step)
    return counts, steps


@pytest.mark.parametrize("largest_fit", [256, 257, 240, 300, 343, 190, 1])
def test_c20_is_bracketed_to_two_percent_around_the_edge(largest_fit):
    counts, _ = bisect(largest_fit, start=256)
    low, high = bench.c20_bounds(counts)
    assert low == largest_fit or low <= largest_fit < high and high - low <= max(1, 0.02 * low)


def test_it_scouts_up_one_process_a_batch_then_steps_down_with_full_counts():
    _, steps = bisect(343, start=256)
    assert steps == [(256, 1), (277, 1), (300, 1), (325, 1), (352, 1), (346, 20), (340, 20)]
    # The truth's ceiling went over: straight to the descent.
    assert bisect(240, start=256)[1] == [(256, 1), (251, 20), (247, 20), (243, 20), (239, 20)]


def test_a_batch_counts_as_passed_only_after_all_its_processes():
    counts = {256: bench.Count(256, 12, 0, (), 0.0)}  # a count cut short says nothing yet
    assert bench.c20_bounds(counts) == (None, None)
    assert bench.c20_bounds(counts, wanted=12) == (256, None)


def test_a_count_stops_at_its_first_process_over(monkeypatch):
    readings = iter([True, True, False, True])
    monkeypatch.setattr(probe_truth, "fresh_check", lambda *a, **k: {
        "fits": next(readings), "peak_bytes": 1300 * MIB, "error": None, "seconds": 8.0})
    count = bench.count_batch("dense_wide", 258, 1400 * MIB, None, 20, "test")
    assert (count.processes, count.over, count.seconds) == (3, 1, 24.0)


def test_a_run_counts_each_update_once_after_a_restart_and_its_largest_peak():
    updates = [{"restart": 0, "update": 1, "micro_batches": [253, 253], "oom_events": 0, "peak_bytes": 1300 * MIB},
               {"restart": 0, "update": 2, "micro_batches": [253, 253], "oom_events": 0, "peak_bytes": 1310 * MIB},
               # killed before update 2's checkpoint: the restart runs it again, smaller
               {"restart": 1, "update": 2, "micro_batches": [200, 200, 106], "oom_events": 1, "peak_bytes": 1250 * MIB}]
    done = [{"restart": 1, "peak_bytes": 1260 * MIB, "oom_events": 1}]
    run = bench.run_summary(updates, done, {"exit_code": 0, "restarts": 1, "signals": ["SIGKILL"]}, 2e-7, 30.0, 2)
    assert run["completed"] and run["updates"] == 2
    assert run["micro_batches"] == [253, 253, 200, 200, 106] and run["mean_micro_batch"] == pytest.approx(202.4)
    assert run["peak_bytes"] == 1310 * MIB and (run["oom_events"], run["kills"], run["restarts"]) == (1, 1, 1)
    unfinished = bench.run_summary(updates[:1], [], {"exit_code": -9, "restarts": 3, "signals": []}, None, 1.0, 2)
    assert not unfinished["completed"]


def training_run(mean=253.0, peak=1290 * MIB, kills=0, diff=3e-7, completed=True):
    return {"completed": completed, "updates": 6, "micro_batches": [int(mean)] * 12, "mean_micro_batch": mean,
            "peak_bytes": peak, "oom_events": 0, "kills": kills, "restarts": kills, "exit_code": 0,
            "weights_max_abs_diff": diff, "seconds": 20.0}


def measured_row(runs, c20=256, safes=(253, 253), headroom=None):
    return {"scenario": "dense_wide, 1.37 GiB resident budget", "budget_bytes": 1400 * MIB, "headroom_bytes": headroom,
            "slow_start": [{"run": i + 1, "found": 253, "safe_batch": s} for i, s in enumerate(safes)],
            "c20": {"c20": c20, "first_over_above": 262, "processes": 20, "resolution": 0.02,
                    "counts": [{"batch": 262, "processes": 1, "over": 1, "peaks": [], "seconds": 8.0},
                               {"batch": c20, "processes": 20, "over": 0, "peaks": [], "seconds": 160.0}]},
            "training_plan": {"profile_from": "the trial log of section 1's slow_start run 1", "found": 253,
                              "safe_batch": max(safes), "effective_batch": 2 * max(safes), "updates": 6,
                              "checkpoint_every_updates": 2, "malloc_arena_max": None},
            "profile_source": "trial-log", "run_at": "abc1234, 2026-12-07", "runs": runs}


def test_the_targets_read_the_issues_thresholds():
    row = measured_row([training_run() for _ in range(10)])
    met = bench.targets(row)
    assert all(target["met"] for target in met.values()), met
    assert met["safe_batch"]["detail"] == "253-253 = 0.988-0.988 x C20 over 2 runs"

    low = bench.targets(measured_row([training_run(mean=200.0)] * 9 + [training_run(peak=1401 * MIB)], safes=(253, 210)))
    assert not low["safe_batch"]["met"] and not low["mean_micro_batch"]["met"]
    assert not low["peak"]["met"] and low["peak"]["detail"] == "9 of 10 within the budget"

    capped = bench.targets(measured_row([training_run(kills=1)] + [training_run()] * 9, headroom=300 * MIB))
    assert capped["peak"] == {"met": True, "detail": "1 kills in 10 runs"}
    edge = bench.targets(measured_row([training_run(mean=326.0)] * 10, c20=354, safes=(300, 326)))
    assert not edge["safe_batch"]["met"] and edge["safe_batch"]["detail"] == "300-326 = 0.847-0.921 x C20 over 2 runs"
    probed = measured_row([training_run()] * 10, safes=(253, 253))
    probed.update(profile_source="probe", safe_batches=[300])
    assert bench.targets(probed)["safe_batch"] == {"met": True, "detail": "300 = 1.172 x C20"}
    off = bench.targets(measured_row([training_run(diff=2e-4)] + [training_run(completed=False)] + [training_run()] * 8))
    assert off["completed_exact"] == {"met": False, "detail": "8 of 10; largest diff 2.0e-04"}


def test_the_section_names_what_ran_what_did_not_and_each_target():
    data = {"environment": {"git_commit": "abc1234", "date_utc": "2026-12-07T18:00:00+00:00", "cpu": "AMD EPYC",
                            "cores": 2},
            "results": "tools/bench/results/results.json", "results_environment": {"git_commit": "cb29ff0"},
            "all_scenarios": ["dense_wide, 1.37 GiB resident budget", "small_cnn, 1.5 GiB resident budget"],
            "processes_c20": 20, "runs": 10, "measured": []}
    row = measured_row([training_run() for _ in range(10)])
    row["targets"] = bench.targets(row)
    data["measured"].append(row)
    text = bench.render(data)
    assert text.startswith(bench.SECTION_START) and text.endswith(bench.SECTION_END)
    assert "## 15. End to end" in text and "commit abc1234" in text
    assert "Ran: dense_wide, 1.37 GiB resident budget. Not run: small_cnn, 1.5 GiB resident budget." in text
    assert "| abc1234, 2026-12-07 | 256 (262: 1 over in 1, 256: 0 over in 20) | section 1 trial logs: 253, 253 |" in text
    assert "met: 253.0 = 0.988 x C20" in text and "met: 10 of 10 within the budget" in text
    assert text.count("| dense_wide, 1.37 GiB resident budget | ") == 11  # the targets row and 10 runs
    probed = {**row, "profile_source": "probe", "safe_batches": [300],
              "training_plan": {**row["training_plan"], "profile_from": "a new probe", "safe_batch": 300}}
    text = bench.render({**data, "measured": [row, probed]})
    assert "| new probe: 300 (answer 253) |" in text and "| dense_wide, 1.37 GiB resident budget | new probe | 10 |" in text
    assert "Ran: dense_wide, 1.37 GiB resident budget. Not run" in text


def test_a_new_row_is_added_to_a_kept_measurement_and_a_remeasured_one_replaced():
    kept = {"measured": [{"scenario": "a", "x": 1}, {"scenario": "b", "x": 1}], "environment": {"git_commit": "old"}}
    new = {"measured": [{"scenario": "b", "x": 2}, {"scenario": "c", "x": 2},
                        {"scenario": "a", "profile_source": "probe", "x": 3}], "environment": {"git_commit": "new"}}
    merged = bench.merge_measurements(kept, new)
    assert [(r["scenario"], r["x"]) for r in merged["measured"]] == [("a", 1), ("b", 2), ("c", 2), ("a", 3)]
    assert merged["environment"]["git_commit"] == "new"
