"""The probe benchmark's cost ratios (tools/bench/probe_bench.summarise) and how the report shows them.

Scripted runs, no processes: the ratios are taken repeat by repeat, against binsearch and against
binsearch_checked (binsearch held to slow_start's answer rule).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "bench"))

import probe_bench  # noqa: E402
import report  # noqa: E402


def run(repeat, trials, seconds):
    return {"repeat": repeat, "trials": trials, "wall_seconds": seconds, "failed_trials": 0, "workers_started": 1,
            "found": 100, "found_over_true": 1.0, "unsafe": False}


def test_cost_is_compared_repeat_by_repeat_with_binsearch_and_with_its_checked_form():
    runs = {
        "slow_start": [run(0, 12, 40.0), run(1, 14, 60.0)],
        "binsearch": [run(0, 10, 20.0), run(1, 10, 20.0)],
        "binsearch_checked": [run(0, 13, 50.0), run(1, 14, 40.0)],
    }
    summary = probe_bench.summarise(runs)["slow_start"]
    assert abs(summary["trials_vs_binsearch"].median - 1.3) < 1e-9  # 1.2 and 1.4
    assert summary["trials_vs_checked"].min == 12 / 13 and summary["trials_vs_checked"].max == 1.0
    assert summary["wall_vs_checked"].min == 0.8 and summary["wall_vs_checked"].max == 1.5


def test_a_repeat_the_checked_baseline_skipped_is_left_out_of_its_ratios():
    runs = {"slow_start": [run(0, 12, 40.0), run(1, 14, 60.0)], "binsearch": [run(0, 10, 20.0), run(1, 10, 20.0)],
            "binsearch_checked": [run(1, 7, 30.0)]}
    summary = probe_bench.summarise(runs)["slow_start"]
    assert summary["trials_vs_checked"].n == 1 and summary["trials_vs_checked"].median == 2.0
    assert summary["trials_vs_binsearch"].n == 2


def test_the_targets_table_shows_the_checked_comparison_without_a_verdict():
    runs = {"slow_start": [run(0, 12, 40.0)], "binsearch": [run(0, 10, 20.0)], "binsearch_checked": [run(0, 16, 50.0)]}
    scenario = {"scenario": {"name": "toy"}, "truth": {"narrowed_to_resolution": True},
                "summary": probe_bench.summarise(runs)}
    rows = report._probe_targets(scenario)
    assert ["cost against binsearch_checked (no target): toy", "trials 0.75; wall 0.80", "for reference"] in rows
    assert ["trials <= 0.5 x binsearch's: toy", "1.20", "**not met**"] in rows


def logged(*kinds):
    """A trial log with one measured trial per kind (reused, forked, new_process) and a skip."""
    entries = {"reused": {"fresh": False, "forked": None}, "forked": {"fresh": True, "forked": True},
               "new_process": {"fresh": True, "forked": False}}
    return [{"measured": True, **entries[k]} for k in kinds] + [{"measured": False, "fresh": False, "forked": None}]


def test_where_the_trials_ran_is_counted_per_run_and_shown_under_the_table():
    slow = [{**run(0, 5, 40.0), "trial_log": logged("new_process", "reused", "forked", "forked", "new_process")},
            {**run(1, 3, 40.0), "trial_log": logged("new_process", "forked", "forked")}]
    older = [{**run(0, 2, 20.0), "trial_log": [{"measured": True, "ok": True}]}]  # before `fresh` was logged
    summary = probe_bench.summarise({"slow_start": slow, "binsearch": older})
    kinds = summary["slow_start"]["trials_by_worker"]
    assert (kinds["reused"].max, kinds["reused"].min) == (1, 0)
    assert kinds["forked"].median == 2 and kinds["new_process"].min == 1 and kinds["new_process"].max == 2
    assert summary["binsearch"]["trials_by_worker"] is None
    lines = report._worker_kind_lines(summary)
    assert lines[-1].endswith("slow_start 0 [0-1] / 2 / 2 [1-2].")  # median 0.5 prints as 0
    assert "binsearch" not in lines[-1]
    assert report._worker_kind_lines(probe_bench.summarise({"binsearch": older})) == []


def test_the_count_of_new_processes_over_at_the_answer_is_shown_where_it_was_measured():
    runs = {"slow_start": [run(0, 12, 40.0)], "binsearch": [run(0, 10, 20.0)]}
    counted = {"batch": 954, "processes": 10, "over": 2, "share_upper": 0.5069,
               "peaks": [1260 * 1024**2, 1395 * 1024**2] + [None] * 8}
    scenario = {"scenario": {"name": "toy"}, "truth": {"narrowed_to_resolution": True},
                "summary": probe_bench.summarise(runs), "answer_failures": counted}
    rows = report._probe_targets(scenario)
    assert ["new processes over the budget at the answer (no target): toy", "2 of 10 at 954 (share at most 51% at 95%)",
            "for reference"] in rows
    (line,) = [line for line in report._answer_failure_lines(counted, {"budget_bytes": 1}) if line]
    assert "954, run in 10 more new processes" in line and "2 went over the budget" in line
    assert "peaks 1,260.0-1,395.0 MiB" in line and "at most 51%" in line
    capped = report._answer_failure_lines(counted, {"headroom_bytes": 1})[-1]
    assert "2 failed to run under the cap" in capped
    # Results from before the count (and a count that ran no process) add nothing.
    assert report._answer_failure_lines(None, {}) == []
    assert report._answer_failure_lines({**counted, "processes": 0}, {}) == []
    del scenario["answer_failures"]
    assert not [row for row in report._probe_targets(scenario) if "at the answer" in row[0]]
