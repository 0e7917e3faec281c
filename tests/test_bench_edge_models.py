"""tools/bench/edge_models_bench.py's bookkeeping and the truth's precision/optimize options, without processes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "bench"))

import edge_models_bench
import probe_truth
from harness import ChildResult


def test_fresh_check_passes_precision_and_optimize_only_when_asked(monkeypatch):
    calls = []

    def run_child(args, timeout):
        calls.append(list(args))
        return ChildResult({"ok": True, "peak_bytes": 100, "error": None}, 0, 1.0, "")

    monkeypatch.setattr(probe_truth, "run_child", run_child)
    assert probe_truth.fresh_check("m", 8, 200, None)["fits"]
    probe_truth.fresh_check("m", 8, 200, None, precision="mixed_bfloat16", optimize="qat")
    # The truth runs the inter-op threads the probe's workers run (worker.DEFAULT_INTER_OP_THREADS).
    assert calls[0][1:] == ["m", "8", str(probe_truth.TRUTH_STEPS), "--inter-op-threads=1"]
    assert calls[1][-2:] == ["--precision=mixed_bfloat16", "--optimize=qat"]


def test_measure_truth_hands_the_options_to_every_check_and_none_by_default(monkeypatch):
    seen = []

    def fresh_check(model_spec, batch, budget_bytes, headroom_bytes, **extra):
        seen.append(extra)
        return {"batch": batch, "fits": batch <= 40, "ran": True, "peak_bytes": None, "error": None, "seconds": 1.0}

    monkeypatch.setattr(probe_truth, "fresh_check", fresh_check)
    monkeypatch.setattr(probe_truth, "log", lambda message: None)
    for options, expected in (({}, {}), ({"optimize": "prune"}, {"optimize": "prune"})):
        seen.clear()
        truth = probe_truth.measure_truth("m", [38], [44], budget_bytes=None, headroom_bytes=None,
                                          seconds_left=lambda: 1e9, check_cost_seconds=1.0, **options)
        assert truth["ceiling"] == 40 and seen and all(extra == expected for extra in seen)


def _profile():
    trial = {"ok": True, "error": None, "peak_bytes": 1 << 30, "measured": True, "fresh": False}
    return {
        "max_batch": 38, "safe_batch": 30, "probe_seconds": 200.0, "predicted_ceiling": 39,
        "memory_model": {"fixed_bytes": 1.0e9, "per_sample_bytes": 1.2e7, "r2": 0.999, "points": 4},
        "model": {"key": "mobilenet_v2-float32-adam-qat-tf2.21-x", "parameters": 1, "keras_flavor": "tf_keras"},
        "trials": [
            dict(trial, batch=8), dict(trial, batch=38, fresh=True),
            dict(trial, batch=40, ok=False, error="over_budget", fresh=True),
            dict(trial, batch=64, ok=False, error="predicted_over_budget", measured=False, peak_bytes=None),
        ],
    }


def test_probe_command_and_profile_facts():
    command = edge_models_bench.probe_command("mobilenet_v2", 1 << 30, "float32", "qat", "/tmp/p")
    assert command[1:4] == ["-m", "edgebatch", "probe"] and command[-2:] == ["--optimize", "qat"]
    assert "--no-save" in command and "--precision" not in command
    facts = edge_models_bench.profile_facts(_profile())
    assert (facts["trials"], facts["failed_trials"], facts["fresh_trials"]) == (3, 1, 2)
    assert facts["failed_batches_above"] == [40] and facts["per_sample_bytes"] == 1.2e7


def test_markdown_renders_between_its_markers():
    facts = edge_models_bench.profile_facts(_profile())
    truth = {"ceiling": 40, "first_failure_above": 41, "narrowed_to_resolution": True, "failures_below_ceiling": [],
             "seconds": 90.0, "checks": [{"batch": 38, "fits": True, "ran": True, "peak_bytes": 1.5e9, "error": None},
                                         {"batch": 41, "fits": False, "ran": True, "peak_bytes": 1.7e9, "error": None}]}
    facts.update(judged_max=probe_truth.judge(38, truth), judged_safe=probe_truth.judge(30, truth),
                 fresh_peak_at_max_bytes=1.5e9)
    data = {"command": "x", "model": "mobilenet_v2", "budget_bytes": 1610612736, "repeats": 1, "jobs": 1,
            "truth_steps": 10, "seconds": 1.0, "load_average_at_end": [1.0],
            "environment": {"date_utc": "d", "git_commit": "c", "cpu": "cpu", "cores": 2, "load_average_at_start": [1.0]},
            "variants": [{"variant": "float32", "probes": [facts], "truth": truth},
                         {"variant": "qat", "probes": [{"error": "exit 1: boom"}], "truth": None}]}
    text = edge_models_bench.markdown(data)
    assert text.startswith(edge_models_bench.SECTION_START) and text.endswith(edge_models_bench.SECTION_END)
    assert "| float32 | 38 | 30 | 3 (1, 2) |" in text and "| 40 | 41 | 0.950 | 38 (41) |" in text
    assert "qat: 1 probe(s) failed: exit 1: boom" in text


def test_fit_limit_truth_reads_the_same_checks_against_the_probes_margin():
    budget = 1000
    checks = [{"batch": 38, "ran": True, "peak_bytes": 960}, {"batch": 39, "ran": True, "peak_bytes": 974},
              {"batch": 43, "ran": True, "peak_bytes": 990}, {"batch": 44, "ran": False, "peak_bytes": None}]
    assert edge_models_bench.fit_limit_truth(checks, budget, 0.975) == (39, 43)
    assert edge_models_bench.fit_limit_truth(checks[:2], budget, 0.975) == (39, None)
    assert edge_models_bench.fit_limit_truth([], budget, 0.975) == (None, None)
    # The default is the probe's margin with one inter-op thread, 1%: 43 at 990 of 1000 fits it.
    assert edge_models_bench.FIT_MARGIN == 0.99
    assert edge_models_bench.fit_limit_truth(checks, budget) == (43, 44)


def test_measure_truth_continues_from_prior_checks(monkeypatch):
    checked = []

    def fresh_check(model_spec, batch, budget_bytes, headroom_bytes, **extra):
        checked.append(batch)
        return {"batch": batch, "fits": batch <= 66, "ran": True, "peak_bytes": None, "error": None, "seconds": 1.0}

    monkeypatch.setattr(probe_truth, "fresh_check", fresh_check)
    monkeypatch.setattr(probe_truth, "log", lambda message: None)
    prior = [fresh_check("m", b, None, None) for b in (59, 60, 65, 71)]
    checked.clear()
    truth = probe_truth.measure_truth("m", [59], [71], budget_bytes=None, headroom_bytes=None,
                                      seconds_left=lambda: 1e9, check_cost_seconds=1.0, prior_checks=prior)
    assert truth["ceiling"] == 66 and truth["first_failure_above"] == 67 and truth["narrowed_to_resolution"]
    assert checked and not set(checked) & {59, 60, 65, 71} and all(65 < b < 71 for b in checked)


def test_a_truth_check_fits_only_when_every_new_process_does(monkeypatch):
    readings = iter([100, 250, 120])

    def fresh_check(model_spec, batch, budget_bytes, headroom_bytes, **extra):
        peak = next(readings)
        return {"batch": batch, "fits": peak <= budget_bytes, "ran": True, "peak_bytes": peak, "error": None,
                "seconds": 1.0}

    monkeypatch.setattr(probe_truth, "fresh_check", fresh_check)
    failed = probe_truth.repeated_check("m", 8, 200, None)
    assert not failed["fits"] and failed["peak_bytes"] == 250 and failed["peaks"] == [100, 250]
    readings = iter([1000, 1005, 1002])
    fits = probe_truth.repeated_check("m", 8, 2000, None)
    assert fits["fits"] and fits["peak_bytes"] == 1005 and fits["peaks"] == [1000, 1005, 1002]
    assert fits["seconds"] == 3.0 and probe_truth.TRUTH_READINGS == 3


def test_a_truth_reads_a_batch_six_times_where_its_processes_read_different_levels(monkeypatch):
    # text_cnn at 800 on an Intel Xeon: 1,152 MiB in five new processes of six, 1,252 MiB in one.
    readings = iter([1152.0, 1152.7, 1163.0, 1152.3, 1252.2, 1152.5])

    def fresh_check(model_spec, batch, budget_bytes, headroom_bytes, **extra):
        peak = next(readings)
        return {"batch": batch, "fits": peak <= budget_bytes, "ran": True, "peak_bytes": peak, "error": None,
                "seconds": 1.0}

    monkeypatch.setattr(probe_truth, "fresh_check", fresh_check)
    # 1152.0-1163.0 is 0.95% apart, within the noise: three readings judge the batch.
    assert probe_truth.repeated_check("m", 800, 1250, None)["peaks"] == [1152.0, 1152.7, 1163.0]
    readings = iter([1152.0, 1152.7, 1170.0, 1152.3, 1252.2, 1152.5])
    failed = probe_truth.repeated_check("m", 800, 1250, None)
    assert not failed["fits"] and failed["peaks"] == [1152.0, 1152.7, 1170.0, 1152.3, 1252.2]
    readings = iter([1152.0, 1152.7, 1170.0, 1152.3, 1160.0, 1152.5])
    fits = probe_truth.repeated_check("m", 800, 1250, None)
    assert fits["fits"] and len(fits["peaks"]) == 3 * probe_truth.BAND_READINGS_FACTOR and fits["peak_bytes"] == 1170.0
