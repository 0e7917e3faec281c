"""The neighbour benchmark's bookkeeping (tools/bench/neighbour_bench.py `summarise`) on scripted runs.

No processes: progress lines and the bench's timestamps are written by hand, so these check the
figures BENCHMARKS.md reports (paces, recovery time, OOMs per pressure event, lost updates).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "bench"))

import neighbour_bench  # noqa: E402
from neighbour_bench import CEILING, summarise  # noqa: E402


def update(number, t, micro_batch=CEILING, restart=0, examples=CEILING):
    return {"event": "update", "t": t, "update": number, "examples": examples, "micro_batch": micro_batch,
            "oom_events": 0, "pressure": 0.2, "reason": "", "next_micro_batch": micro_batch, "restart": restart}


EVENTS = {"neighbour_start_t": 10.5, "neighbour_filled_t": 12.0, "neighbour_released_t": 30.5, "returncode": 0}


def test_a_governed_run_killed_once_counts_one_oom_and_drops_the_lost_update():
    records = [{"event": "start", "t": 0.0, "restart": 0}]
    records += [update(n, float(n)) for n in range(1, 12)]  # 1 update/s at the ceiling, updates 1-11
    records += [{"event": "start", "t": 13.0, "restart": 1}]
    # The restarted child resumes after update 10 (its checkpoint): update 11 ran again, at half the size.
    records += [update(n, 14.0 + (n - 11), micro_batch=CEILING // 2, restart=1) for n in range(11, 40)]
    records += [{"event": "end", "t": 45.0}]
    result = summarise("governed", records, dict(EVENTS), started=0.0)
    assert result["completed"] and result["neighbour_filled"]
    assert result["restarts"] == 1 and result["ooms_in_pressure_event"] == 1
    assert result["updates_lost_to_kills"] == 1 and result["updates"] == 39
    assert result["examples"] == 39 * CEILING
    # Before: updates 2-10 ended in (1, 10.5]: 9 x 256 over 9.5 s.
    assert result["pre_samples_per_second"] == pytest.approx(9 * CEILING / 9.5)
    assert result["smallest_micro_batch_in_pressure"] == CEILING // 2
    # After the release the pace is 256/s again: the first 3-update window ends 3 updates later.
    assert result["recovered_seconds"] == pytest.approx(33.0 - 30.5)
    assert result["back_at_ceiling_seconds"] is None  # it stayed at half the ceiling
    assert [t["update"] for t in result["timeline"]].count(11) == 2  # the plot shows both runs of it


def test_a_static_run_the_kernel_killed_has_no_recovery_and_one_oom():
    records = [{"event": "start", "t": 0.0, "restart": 0}] + [update(n, float(n)) for n in range(1, 12)]
    events = {**EVENTS, "returncode": -9}
    result = summarise("static", records, events, started=0.0)
    assert not result["completed"]
    assert result["ooms_in_pressure_event"] == 1
    assert result["during_samples_per_second"] == pytest.approx(1 * CEILING / 20.0)  # update 11 only
    assert result["after_samples_per_second"] is None and result["recovered_seconds"] is None


def test_a_run_whose_neighbour_never_filled_says_so():
    records = [{"event": "start", "t": 0.0, "restart": 0}] + [update(n, float(n)) for n in range(1, 40)]
    records += [{"event": "end", "t": 40.0}]
    result = summarise("governed", records, {**EVENTS, "neighbour_filled_t": None}, started=0.0)
    assert not result["neighbour_filled"]


def test_cgroup_unavailable_is_reported_not_raised(monkeypatch, tmp_path):
    monkeypatch.setattr(neighbour_bench, "CGROUP_ROOT", tmp_path / "no-such-hierarchy")
    with pytest.raises(neighbour_bench.CgroupUnavailable, match="no cgroup v1 memory hierarchy"):
        neighbour_bench.make_cgroup(1024)
