"""tools/bench/answer_failures.py: which batches it counts, where it finds a model file, what it writes.

No processes: probe_truth.fresh_check is replaced by a scripted reading.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench"
sys.path.insert(0, str(BENCH))

import answer_failures  # noqa: E402
from edgebatch.probing.margins import DEFAULT_HEADROOM  # noqa: E402
import probe_truth  # noqa: E402

MIB = 1024**2


def scenario(name="text_cnn, 1.25 GiB resident budget", model="text_cnn", budget=1280 * MIB, headroom=None,
             slow=(954,), binsearch=(664,), ceiling=985):
    return {"scenario": {"name": name, "model": model, "budget_bytes": budget, "headroom_bytes": headroom},
            "truth": {"ceiling": ceiling},
            "runs": {"slow_start": [{"found": b} for b in slow], "binsearch": [{"found": b} for b in binsearch]}}


def test_each_methods_largest_answer_and_the_truth_are_counted_once_largest_first():
    counted = answer_failures.batches_to_count(scenario(slow=(322, 327, None), ceiling=327), ["slow_start"], True)
    assert counted == {327: ["slow_start", "truth"]}
    counted = answer_failures.batches_to_count(scenario(), ["slow_start", "binsearch"], True)
    assert list(counted.items()) == [(985, ["truth"]), (954, ["slow_start"]), (664, ["binsearch"])]
    assert answer_failures.batches_to_count(scenario(ceiling=None), ["slow_start"], True) == {954: ["slow_start"]}


def test_a_methods_safe_batch_is_counted_as_recorded_or_as_the_profile_would_read_its_trial_log():
    mib = 1024**2
    recorded = scenario(slow=(954,))
    recorded["runs"]["slow_start"][0]["safe_batch"] = 700
    assert answer_failures.batches_to_count(recorded, ["slow_start", "slow_start:safe"], False) == {
        954: ["slow_start"], 700: ["slow_start:safe"]}
    # An older run, without the field: its trial log on a line of 100 MiB + 1 MiB per sample, read in
    # new processes, under a 1 GiB budget less the 1% margin; nothing over the budget, no spread.
    log = [{"batch": b, "ok": True, "error": None, "peak_bytes": (100 + b) * mib, "measured": True, "fresh": True,
            "forked": False} for b in (8, 100, 400, 800, 900, 900, 900)]
    older = {"found": 900, "budget_bytes": 1024 * mib, "inter_op_threads": 1, "trial_log": log}
    safe = answer_failures.safe_batch_of_run(older)
    # summary.safe_batch_of: the largest batch under the default headroom's share of the fit budget
    # (1,013.76 MiB at one thread).
    assert safe == int((1 - DEFAULT_HEADROOM) * 1024 * 0.99 - 100)
    # ":safe_now" reads the trial log by the current rule even where the run recorded another.
    now = {"runs": {"slow_start": [{**older, "safe_batch": 500}]}, "truth": {}}
    assert answer_failures.batches_to_count(now, ["slow_start:safe", "slow_start:safe_now"], False) == {
        safe: ["slow_start:safe_now"], 500: ["slow_start:safe"]}
    assert answer_failures.safe_batch_of_run({"found": None, "trial_log": log, "budget_bytes": 1}) is None


def test_a_model_file_from_the_benchmarks_worktree_is_found_in_this_checkout():
    local = answer_failures.local_model_spec("/tmp/bw/tests/models/dense_wide.py:build")
    assert local == f"{answer_failures.ROOT / 'tests' / 'models' / 'dense_wide.py'}:build"
    assert Path(local.rsplit(":", 1)[0]).exists()
    assert answer_failures.local_model_spec("mobilenet_v2") == "mobilenet_v2"
    assert answer_failures.local_model_spec("/elsewhere/model.py:build") == "/elsewhere/model.py:build"


def test_the_count_runs_every_chosen_batch_and_renders_a_section(monkeypatch, tmp_path):
    readings = {954: iter([1260, 1395, 1260]), 985: iter([1270, 1271, 1400])}

    def fresh_check(model_spec, batch, budget_bytes, headroom_bytes):
        peak = next(readings[batch]) * MIB
        return {"batch": batch, "fits": peak <= budget_bytes, "ran": True, "peak_bytes": peak, "error": None,
                "seconds": 1.0}

    monkeypatch.setattr(probe_truth, "fresh_check", fresh_check)
    monkeypatch.setattr(answer_failures, "log", lambda line: None)
    results = {"environment": {"git_commit": "a9fb42f", "cpu": "AMD EPYC"},
               "sections": {"probe": {"scenarios": [scenario(), scenario(name="mlp, cap", model="mlp")]}}}
    data = answer_failures.count(results, tmp_path / "results.json", 3, ["slow_start"], True, ["text_cnn"])
    assert [(row["batch"], row["over"], row["processes"]) for row in data["measured"]] == [(985, 1, 3), (954, 1, 3)]
    section = answer_failures.render(data)
    assert section.startswith(answer_failures.SECTION_START) and section.endswith(answer_failures.SECTION_END)
    assert "| text_cnn, 1.25 GiB resident budget | 1,280 MiB | 954 | slow_start | 1 / 3 | 86% | 1,260.0-1,395.0 |" in section
    assert "section 1's run at commit a9fb42f, AMD EPYC" in section


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    not_results = tmp_path / "other.json"
    not_results.write_text(json.dumps({"sections": {}}))
    for args in ([str(not_results)], [str(tmp_path / "missing.json")], [], [str(not_results), "--processes", "0"]):
        done = subprocess.run([sys.executable, str(BENCH / "answer_failures.py"), *args], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, args
        assert "Traceback" not in done.stderr and done.stderr.strip().splitlines()[-1].startswith("answer_failures.py: error:")
    assert not (tmp_path / "answer_failures.json").exists()


@pytest.mark.parametrize("over,processes", [(0, 10), (2, 10)])
def test_the_rendered_bound_is_probe_truths(over, processes):
    data = {"results": "r.json", "processes": processes,
            "measured": [{"scenario": "s", "budget_bytes": MIB, "headroom_bytes": None, "answer_of": ["truth"],
                          "batch": 8, "processes": processes, "over": over, "peaks": [None] * processes,
                          "share_upper": probe_truth.failure_share_upper(over, processes)}]}
    assert f"| {over} / {processes} | {probe_truth.failure_share_upper(over, processes):.0%} | - |" in answer_failures.render(data)


def test_counts_of_one_batch_in_several_measurements_add_up_in_the_merge():
    def row(scenario, batch, over, processes, names):
        return {"scenario": scenario, "batch": batch, "over": over, "processes": processes, "answer_of": names,
                "peaks": [1] * processes, "errors": [], "seconds": float(processes), "budget_bytes": 1,
                "headroom_bytes": None, "share_upper": None}

    first = {"environment": {"date_utc": "a"}, "processes": 10, "results": "r.json",
             "measured": [row("mobilenet", 29, 0, 10, ["truth"]), row("mlp", 24421, 7, 10, ["truth"])]}
    second = {"environment": {"date_utc": "b"}, "processes": 10, "results": "r.json",
              "measured": [row("mlp", 20736, 0, 10, ["binsearch"]), row("mobilenet", 29, 1, 10, ["binsearch"]),
                           row("mobilenet", 28, 0, 10, ["binsearch_checked"])]}
    merged = answer_failures.merge([first, second])
    assert [(r["scenario"], r["batch"], r["over"], r["processes"]) for r in merged["measured"]] == [
        ("mobilenet", 29, 1, 20), ("mobilenet", 28, 0, 10), ("mlp", 24421, 7, 10), ("mlp", 20736, 0, 10)]
    assert merged["measured"][0]["answer_of"] == ["truth", "binsearch"] and len(merged["measured"][0]["peaks"]) == 20
    assert merged["measured"][0]["share_upper"] == pytest.approx(probe_truth.failure_share_upper(1, 20))
    assert [m["environment"]["date_utc"] for m in merged["merged"]] == ["a", "b"]
    assert first["measured"][0]["processes"] == 10  # the inputs are left as they were


def test_explain_safe_names_the_reading_that_sets_the_safe_batch():
    mib = 1024**2
    # A line of 100 MiB + 1 MiB per sample in new processes, and one fork-server child 50 MiB above
    # it at 600. The answer's own level (1,000 MiB at 900) sets the safe batch; the child's far below
    # is superseded by the new processes' level at 800, nearer (summary.line_safe_batch).
    log = [{"batch": b, "ok": True, "error": None, "peak_bytes": (100 + b) * mib, "measured": True, "fresh": True,
            "forked": False} for b in (8, 100, 400, 800, 900)]
    log.append({"batch": 600, "ok": True, "error": None, "peak_bytes": 750 * mib, "measured": True, "fresh": True,
                "forked": True})
    run = {"found": 900, "budget_bytes": 1024 * mib, "inter_op_threads": 1, "trial_log": log}
    lines = answer_failures.explain_safe({"scenario": {"name": "toy"}, "runs": {"slow_start": [run]}})
    safe = answer_failures.safe_batch_of_run(run)
    assert safe == int((1 - DEFAULT_HEADROOM) * 1024 * 0.99 - 100)
    assert lines[0].startswith(f"toy: slow_start answered 900, safe_batch {safe};")
    assert lines[2].startswith(f"  allows {safe}: 900 read at 1,000.0 MiB in a new process (+")
    assert not any("fork-server child" in line for line in lines)
    # Where that child's batch is the nearest level below the answer, it sets the safe batch.
    near = [entry for entry in log if entry["batch"] != 800]
    run = {**run, "trial_log": near}
    lines = answer_failures.explain_safe({"scenario": {"name": "toy"}, "runs": {"slow_start": [run]}})
    safe = answer_failures.safe_batch_of_run(run)
    assert safe == 600 + int((1 - DEFAULT_HEADROOM) * 1024 * 0.99 - 750)
    assert any(line.startswith(f"  allows {safe}: 600 read at 750.0 MiB in a fork-server child (+") for line in lines)
    assert answer_failures.explain_safe({"scenario": {"name": "toy"}, "runs": {}}) == [
        "toy: no slow_start run with a trial log"]


def test_the_trial_log_lists_each_reading_and_where_it_was_read():
    mib = 1024**2
    log = [{"batch": 8, "ok": True, "error": None, "peak_bytes": 100 * mib, "measured": True, "fresh": True,
            "forked": False},
           {"batch": 16, "ok": True, "error": None, "peak_bytes": 110 * mib, "measured": True, "fresh": False,
            "forked": None},
           {"batch": 64, "ok": False, "error": "predicted_over_budget", "peak_bytes": 160 * mib, "measured": False,
            "fresh": False, "forked": None},
           {"batch": 40, "ok": False, "error": "over_budget", "peak_bytes": 150 * mib, "measured": True,
            "fresh": True, "forked": True}]
    scenario = {"scenario": {"name": "toy"}, "runs": {"slow_start": [{"found": 16, "trial_log": log}]}}
    assert answer_failures.trial_log_lines(scenario) == [
        "toy:", "  slow_start run 1: answered 16",
        "    8 fits: 100.0 MiB (new process)", "    16 fits: 110.0 MiB (reused worker)",
        "    64 predicted_over_budget: 160.0 MiB (predicted, not run)",
        "    40 over_budget: 150.0 MiB (fork-server child)"]
