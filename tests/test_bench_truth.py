"""The probe benchmark's truth search (tools/bench/probe_truth.py) against scripted landscapes.

No processes: `fresh_check` is replaced by a function of the batch, so these run in milliseconds and
check the bookkeeping the benchmark's verdicts rest on.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "bench"))

import probe_truth  # noqa: E402


def scripted(fits):
    checked = []

    def fresh_check(model_spec, batch, budget_bytes, headroom_bytes):
        checked.append(batch)
        ok = fits(batch)
        return {"batch": batch, "fits": ok, "ran": ok, "peak_bytes": None, "error": None, "seconds": 1.0}

    return fresh_check, checked


def measure(monkeypatch, fits, found, hints):
    fresh_check, checked = scripted(fits)
    monkeypatch.setattr(probe_truth, "fresh_check", fresh_check)
    monkeypatch.setattr(probe_truth, "log", lambda message: None)
    truth = probe_truth.measure_truth("m", found, hints, budget_bytes=None, headroom_bytes=None,
                                      seconds_left=lambda: 1e9, check_cost_seconds=1.0)
    return truth, checked


def test_a_monotone_boundary_is_bracketed_to_the_resolution(monkeypatch):
    truth, _ = measure(monkeypatch, lambda b: b <= 331, found=[323, 324], hints=[333, 340])
    ceiling, failure = truth["ceiling"], truth["first_failure_above"]
    assert 331 * 0.99 <= ceiling <= 331 < failure <= ceiling + max(1, 0.01 * ceiling)
    assert truth["narrowed_to_resolution"]
    assert truth["failures_below_ceiling"] == [] and truth["edge_below_first_failure"] is None
    assert probe_truth.judge(323, truth)["found_over_edge"] is None


def test_a_failure_below_the_ceiling_is_checked_and_gives_the_edge(monkeypatch):
    # small_cnn on 1.5 GiB: 290 fits, 300 is over, 340 fits again, 344 is over.
    def fits(batch):
        return batch <= 295 or 330 <= batch <= 342

    truth, _ = measure(monkeypatch, fits, found=[293, 340], hints=[300, 344])
    assert truth["ceiling"] == 342
    assert truth["failures_below_ceiling"] == [300]
    assert truth["edge_below_first_failure"] == 293
    judged = probe_truth.judge(293, truth)
    assert judged["found_over_edge"] == pytest.approx(1.0)
    assert judged["found_over_true"] == pytest.approx(293 / 342)
    assert not judged["unsafe"]


def test_a_method_failure_below_the_ceiling_that_fits_fresh_is_noise(monkeypatch):
    truth, checked = measure(monkeypatch, lambda b: b <= 342, found=[293, 340], hints=[300, 344])
    assert 300 in checked
    assert truth["failures_below_ceiling"] == [] and truth["edge_below_first_failure"] is None


def test_a_truth_whose_share_is_spent_still_gets_its_floor_within_the_section():
    now = [0.0]
    left = probe_truth.truth_seconds_left(lambda: -50.0, lambda: 1000.0 - now[0], floor_seconds=300.0,
                                          clock=lambda: now[0])
    assert left() == 300.0
    now[0] = 200.0
    assert left() == 100.0
    now[0] = 320.0
    assert left() == -20.0, "past the floor, the spent share decides"


def test_the_floor_never_runs_past_the_sections_allowance_and_a_larger_share_stands():
    now = [0.0]
    left = probe_truth.truth_seconds_left(lambda: -50.0, lambda: 120.0 - now[0], floor_seconds=300.0,
                                          clock=lambda: now[0])
    assert left() == 120.0
    share = probe_truth.truth_seconds_left(lambda: 900.0, lambda: 1000.0, floor_seconds=300.0, clock=lambda: 0.0)
    assert share() == 900.0


def test_answer_failures_runs_every_process_and_counts_those_over(monkeypatch):
    # text_cnn at 954 under 1.25 GiB (BENCHMARKS.md at a9fb42f): most new processes read about
    # 1,260 MiB, some draw a level near 1,395 MiB. The count must not stop at the first failure.
    peaks = iter([1260, 1395, 1260, 1261, 1394, 1260])
    budget = 1280

    def fresh_check(model_spec, batch, budget_bytes, headroom_bytes):
        peak = next(peaks)
        return {"batch": batch, "fits": peak <= budget_bytes, "ran": True, "peak_bytes": peak, "error": None,
                "seconds": 2.0}

    monkeypatch.setattr(probe_truth, "fresh_check", fresh_check)
    seen = []
    count = probe_truth.answer_failures("m", 954, budget, None, 6, progress=seen.append)
    assert (count["processes"], count["over"]) == (6, 2)
    assert count["peaks"] == [1260, 1395, 1260, 1261, 1394, 1260] and len(seen) == 6
    assert count["seconds"] == 12.0
    assert count["share_upper"] == pytest.approx(probe_truth.failure_share_upper(2, 6))


def test_answer_failures_stops_when_its_time_is_spent(monkeypatch):
    monkeypatch.setattr(probe_truth, "fresh_check", lambda *args: {"batch": 1, "fits": True, "ran": True,
                                                                   "peak_bytes": 1, "error": None, "seconds": 1.0})
    left = iter([100.0, 100.0, 5.0])
    count = probe_truth.answer_failures("m", 1, None, None, 10, seconds_left=lambda: next(left), check_cost_seconds=15)
    assert count["processes"] == 2 and count["over"] == 0


def test_the_share_bound_is_clopper_pearsons():
    # One-sided 95%: 0 of n gives 1 - 0.05 ** (1 / n); the others are the beta quantiles.
    assert probe_truth.failure_share_upper(0, 10) == pytest.approx(1 - 0.05 ** 0.1, abs=1e-9)
    assert probe_truth.failure_share_upper(0, 20) == pytest.approx(0.1391, abs=1e-4)
    assert probe_truth.failure_share_upper(1, 10) == pytest.approx(0.3942, abs=1e-4)
    assert probe_truth.failure_share_upper(3, 10) == pytest.approx(0.6066, abs=1e-4)
    assert probe_truth.failure_share_upper(4, 4) == 1.0
    with pytest.raises(ValueError):
        probe_truth.failure_share_upper(3, 2)
