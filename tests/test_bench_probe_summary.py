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
    answer = {"batch": 954, "answer_of": ["slow_start"], "processes": 10, "over": 2, "share_upper": 0.5069,
              "peaks": [1260 * 1024**2, 1395 * 1024**2] + [None] * 8}
    truth = {"batch": 985, "answer_of": ["truth"], "processes": 10, "over": 0, "share_upper": 0.2589,
             "peaks": [None] * 10}
    scenario = {"scenario": {"name": "toy"}, "truth": {"narrowed_to_resolution": True},
                "summary": probe_bench.summarise(runs), "answer_failures": [truth, answer]}
    rows = report._probe_targets(scenario)
    assert ["new processes over the budget at slow_start's answer (no target): toy",
            "2 of 10 at 954 (share at most 51% at 95%)", "for reference"] in rows
    assert ["new processes over the budget at the truth's ceiling (no target): toy",
            "0 of 10 at 985 (share at most 26% at 95%)", "for reference"] in rows
    (line,) = [line for line in report._answer_failure_lines([truth, answer], {"budget_bytes": 1}) if line]
    assert "985 (the truth's ceiling): 0 of 10 went over the budget (no peak read; the share that would is at most 26%" in line
    assert "954 (slow_start's answer): 2 of 10 went over the budget (peaks 1,260.0-1,395.0 MiB" in line
    capped = report._answer_failure_lines([answer], {"headroom_bytes": 1})[-1]
    assert "2 of 10 failed to run under the cap" in capped
    # Results from before the count (and a count that ran no process) add nothing.
    assert report._answer_failure_lines(None, {}) == []
    assert report._answer_failure_lines([{**answer, "processes": 0}], {}) == []
    del scenario["answer_failures"]
    assert not [row for row in report._probe_targets(scenario) if "new processes over" in row[0]]


def test_a_scenario_counts_slow_starts_largest_answer_and_the_truths_ceiling(monkeypatch):
    found = {"slow_start": iter([950, 954]), "binsearch": iter([664, 664])}

    def run_method(scenario, strategy, start_batch):
        answer = next(found[strategy]) if strategy in found else 100
        return {**run(0, 10, 1.0), "found": answer, "safe_batch": answer - 300, "error": None, "trial_log": []}

    def measure_truth(model, answers, hints, **kwargs):
        return {"ceiling": 985, "first_failure_above": 994, "narrowed_to_resolution": True, "checks": []}

    counted, shares = [], []

    def answer_failures(model, batch, budget_bytes, headroom_bytes, processes, *, seconds_left):
        counted.append(batch)
        shares.append(seconds_left())
        return {"batch": batch, "processes": processes, "over": int(batch == 985), "share_upper": 0.4,
                "peaks": [None] * processes, "errors": [], "seconds": 1.0}

    monkeypatch.setattr(probe_bench, "run_method", run_method)
    monkeypatch.setattr(probe_bench, "measure_truth", measure_truth)
    monkeypatch.setattr(probe_bench, "answer_failures", answer_failures)
    monkeypatch.setattr(probe_bench, "log", lambda line: None)
    scenario = probe_bench.Scenario("toy", "text_cnn", 8192, budget_bytes=1280 * 1024**2)
    result = probe_bench.run_scenario(scenario, 2, methods_until=lambda: 1e9, truth_until=lambda: 123.0)
    assert counted == [985, 954, 654] and shares == [123.0] * 3
    assert [(c["answer_of"], c["over"]) for c in result["answer_failures"]] == [
        (["truth"], 1), (["slow_start"], 0), (["slow_start:safe"], 0)]
    assert report._counted_what(["slow_start:safe", "truth"]) == "slow_start's safe_batch and the truth's ceiling"
