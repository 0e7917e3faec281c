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
