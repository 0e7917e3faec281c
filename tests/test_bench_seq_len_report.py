"""tools/bench/seq_len_bench.py's report when the probe's token model is not trusted.

A run at 771d6f6 crashed after its probe (ValueError from token_fit.ceiling_at_length) because
512 tokens read 10.5% apart between processes and the token model's fit fell under its r2 floor;
the probed lengths' answers were lost with it. The report now keeps them and marks the rest.
"""

import json
import sys
from pathlib import Path

import pytest

from edgebatch.probing import token_fit

RESULTS = Path(__file__).resolve().parents[1] / "tools" / "bench" / "results"
sys.path.insert(0, str(RESULTS.parent))

import seq_len_bench  # noqa: E402

MIB = 1024**2


def truth(found, ceiling):
    return {"ceiling": ceiling, "first_failure_above": ceiling + 1, "narrowed_to_resolution": True,
            "failures_below_ceiling": [], "found_over_true": found / ceiling}


def results(r2, trusted, points, rows):
    """A seq_len_bench results dict around `rows`, as run() writes it."""
    return {
        "model": "transformer_tiny", "budget_bytes": 1536 * MIB, "fit_limit_bytes": int(1536 * MIB * 0.99),
        "trial_seconds": 10.0, "inter_op_threads": 1, "probe_lens": [64, 512], "predict_lens": [128],
        "probe_seconds": 150.0, "seconds": 400.0, "load_average": [1.0, 1.0, 1.0],
        "token_model": {"fixed_bytes": 800 * MIB, "per_token_bytes": 6500.0, "per_token_squared_bytes": 95.0,
                        "r2": r2, "points": points, "lengths": [64, 512], "trusted": trusted},
        "rows": rows,
    }


def test_an_untrusted_token_model_leaves_unprobed_lengths_without_a_prediction():
    data = results(0.95, False, 12, [
        {"length": 64, "probed": True, "found": 901, "predicted_max_batch": None, "trials": 7,
         "truth": {"budget": truth(901, 931), "fit_limit": truth(901, 910)}},
        {"length": 128, "probed": False, "found": None, "predicted_max_batch": None, "trials": 0, "truth": None},
    ])
    report = seq_len_bench.markdown(data)
    assert "Not trusted" in report and "no length is predicted" in report
    assert "| 64 | yes | 7 | 901 | - | 0.990 (truth 910) | 0.968 (truth 931) |" in report
    assert "| 128 | no | 0 | - | - | - | - |" in report



def test_a_predicted_length_shows_the_lines_ceiling_against_the_truth_and_the_lowered_answer():
    data = results(0.998, True, 21, [
        {"length": 128, "probed": False, "found": 290, "predicted_max_batch": 308,
         "line_over_truth_at_fit_limit": 308 / 322, "trials": 0,
         "repeats": {"answer": {"batch": 290, "processes": 5, "under_budget": 5, "peaks": []},
                     "truth": {"batch": 333, "processes": 5, "under_budget": 3, "peaks": []}},
         "truth": {"budget": truth(290, 333), "fit_limit": truth(290, 322)}},
    ])
    report = seq_len_bench.markdown(data)
    assert ("| 128 | no | 0 | 290 | 308 (0.957) | 0.901 (truth 322) | 0.871 (truth 333) | 5 of 5 at 290; 3 of 5 at 333 |"
            in report), report
    assert "Not trusted" not in report


def test_where_the_probe_kept_no_token_model_the_report_refits_the_kept_readings_and_marks_it_untrusted():
    """The kept run (tools/bench/results/seq_lens_untrusted_56da49b.json, 2026-12-05; a rerun of the
    benchmark rewrites seq_lens.json, not this copy): 512 tokens read 1.43-1.57 GiB at
    24-25 between processes, and the probe's fit of all 36 readings then had r2 0.977, under
    token_fit's 0.98, so it predicted nothing. The report refits the readings with today's fit and
    still says the run had no trusted model."""
    kept = json.loads((RESULTS / "seq_lens_untrusted_56da49b.json").read_text())
    assert kept["token_model"] is None
    record = seq_len_bench.token_model_of(kept)
    assert record["refitted"] is True and record["trusted"] is False
    assert record["points"] <= len({(r["batch"], r["length"]) for r in kept["trial_readings"]})
    report = seq_len_bench.markdown(kept)
    assert "Not trusted" in report and "refitted by today's token_fit" in report


@pytest.mark.parametrize(("name", "pairs", "high_draws"), [
    ("seq_lens_untrusted_56da49b.json", 24, 1),  # 94 x 256 read 143 MiB above the line in a child
    ("seq_lens_two_valued_b201dfd.json", 23, 2),  # 80 and 96 x 256, children, 9-10% above
])
def test_the_low_level_fit_trusts_the_kept_runs_whose_two_valued_peaks_left_them_without_a_model(name, pairs, high_draws):
    """Two kept runs (2026-12-05, Intel Xeon) whose probes kept no token model: the fit of their
    readings was under token_fit's r2 floor (0.977 and 0.974). Fitted at each pair's lowest reading,
    without the high draws, both are trusted."""
    kept = json.loads((RESULTS / name).read_text())
    assert kept["token_model"] is None
    readings = [(r["batch"], r["length"], r["peak_bytes"]) for r in kept["trial_readings"]]
    assert len({(b, length) for b, length, _ in readings}) == pairs
    model = token_fit.fit_token_model(readings)
    assert token_fit.trusted(model) and model.r2 >= 0.995, model
    assert model.points == pairs - high_draws and model.lengths == (64, 256, 512)


def test_the_two_truths_of_a_length_share_their_processes_and_each_reads_a_fit_three_times_or_six_between_levels(monkeypatch):
    import probe_truth

    started = []

    def fake_process(model_spec, batch, budget_bytes, headroom_bytes, seq_len=None):
        # Peaks alternate between two levels by process, as transformer_tiny's do at some lengths.
        started.append(batch)
        peak = batch * MIB + (40 * MIB if len(started) % 3 == 0 else 0)
        return {"batch": batch, "fits": True, "ran": True, "peak_bytes": peak, "error": None, "seconds": 1.0}

    checks = seq_len_bench.SharedChecks(fake_process)
    monkeypatch.setattr(probe_truth, "fresh_check", checks)
    checks.new_truth()
    at_budget = probe_truth.repeated_check("m", 100, 150 * MIB, None, seq_len=64)
    # Three readings 40% apart: the batch is read three times more (probe_truth._levels_differ).
    assert at_budget["fits"] and len(at_budget["peaks"]) == 6 and started == [100] * 6
    checks.new_truth()  # the truth at the fitting limit: the same processes, judged again
    at_limit = probe_truth.repeated_check("m", 100, 120 * MIB, None, seq_len=64)
    assert not at_limit["fits"] and at_limit["peak_bytes"] == 140 * MIB and started == [100] * 6
    assert len(at_limit["peaks"]) == 3  # the third process is the one over 120 MiB
    at_101 = probe_truth.repeated_check("m", 101, 130 * MIB, None, seq_len=64)
    assert not at_101["fits"] and started == [100] * 6 + [101] * 3  # the ninth process reads 141 MiB
    assert [r["peak_bytes"] for r in checks.readings[("m", 100, 64)]] == [100 * MIB, 100 * MIB, 140 * MIB] * 2
