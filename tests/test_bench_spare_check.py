"""tools/bench/spare_check.py: what its section says of a run, and its bad input. No processes."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench"
sys.path.insert(0, str(BENCH))

import spare_check  # noqa: E402


def reading(peak, seconds, ok=True, settled=True):
    return {"peak_mib": peak, "ok": ok, "settled": settled, "seconds_to_reply": seconds}


RESULTS = {
    "environment": {"git_commit": "abc1234", "date_utc": "2026-12-07T14:00:00+00:00", "cpu": "CPU", "cores": 2},
    "rounds": 3, "trial_seconds": 10.0,
    "cases": [{"model": "small_cnn", "batch": 324, "runs": [
        {"new process": reading(1386.2, 21.0), "started ahead": reading(1386.3, 4.0)},
        {"new process": reading(1386.1, 19.0), "started ahead": reading(1386.2, 3.5, settled=False)},
        {"new process": reading(1549.0, 20.0), "started ahead": reading(None, 2.0, ok=False)},
    ]}],
}


def test_the_section_gives_each_kinds_peaks_failures_and_wait():
    section = spare_check.render(RESULTS)
    assert section.startswith(spare_check.SECTION_START) and section.endswith(spare_check.SECTION_END)
    assert "| small_cnn at 324 | new process | 1,386.2 [1,386.1-1,549.0] | 0 of 3 | 0 | 20.0 [19.0-21.0] |" in section
    assert "| small_cnn at 324 | started ahead | 1,386.2 [1,386.2-1,386.3] | 1 of 3 | 1 | 3.5 [2.0-4.0] |" in section
    assert "Run at abc1234 on 2026-12-07" in section


@pytest.mark.parametrize("text", ["small_cnn", "small_cnn:x", ":324"])
def test_a_bad_case_is_one_line_and_exit_2(text):
    done = subprocess.run([sys.executable, str(BENCH / "spare_check.py"), "--case", text],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "a case is MODEL:BATCH" in done.stderr and "Traceback" not in done.stderr


def test_a_case_is_model_and_batch():
    assert spare_check.parse_case("tests/models/dense_wide.py:build:256") == ("tests/models/dense_wide.py:build", 256)
