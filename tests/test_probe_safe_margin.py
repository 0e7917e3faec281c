"""safe_batch by schema 3's rule (summary.line_safe_batch): pure, no TensorFlow.

The trial logs are two real slow_start runs of BENCHMARKS.md section 1 (AMD EPYC, 2 cores; one
inter-op thread); the committed profiles are read as they are.
"""

import json
import math
from pathlib import Path

import pytest

from edgebatch.probing import summary
from edgebatch.probing.margins import DEFAULT_HEADROOM, fit_budget_bytes
from edgebatch.profiles import DeviceProfile, Trial

MIB = 1024**2
COMMITTED = Path(__file__).resolve().parents[1] / "device_profiles"

# (batch, peak bytes, fits, where): N a new process, C a fork-server child, S the scout reused,
# P predicted over the budget and not run.
DENSE_WIDE_1_37_GIB = (1468006400, 253, [
    (8, 836349952, True, "N"), (16, 858382336, True, "S"), (32, 902586368, True, "S"),
    (221, 1329262592, True, "C"), (263, 1572007936, False, "C"), (263, 1541177344, False, "N"),
    (268, 1585410048, False, "C"), (337, 1766387712, False, "C"), (225, 1337692160, True, "C"),
    (244, 1377628160, True, "C"), (253, 1396490240, True, "C"), (258, 1558941696, False, "C"),
    (258, 1528147968, False, "N"), (253, 1365950464, True, "N"), (253, 1366351872, True, "N"),
])
TEXT_CNN_1_25_GIB = (1342177280, 1022, [
    (8, 887066624, True, "N"), (16, 887767040, True, "S"), (32, 899444736, True, "S"),
    (64, 900227072, True, "S"), (128, 927772672, True, "S"), (256, 1031917568, True, "S"),
    (512, 1159892992, True, "S"), (778, 1350062080, False, "C"), (778, 1222402048, True, "N"),
    (975, 1457119232, False, "C"), (975, 1306001408, True, "N"), (1022, 1485217792, False, "C"),
    (1022, 1325735936, True, "N"), (1042, 1336256342, False, "P"), (1042, 1349316608, False, "N"),
    (1022, 1325985792, True, "N"),
])


def trials_of(log):
    return [Trial(batch=batch, ok=fits, error=None if fits else ("predicted_over_budget" if where == "P" else "over_budget"),
                  peak_bytes=peak, process_peak_bytes=None, allocator_peak_bytes=None, step_seconds=None,
                  samples_per_second=None, measured=where != "P", fresh=where in "NC" and where != "",
                  forked={"N": False, "C": True}.get(where))
            for batch, peak, fits, where in log]


def run(case, headroom=DEFAULT_HEADROOM):
    budget, found, log = case
    trials = trials_of(log)
    fit = fit_budget_bytes(budget, 1)
    model = summary.memory_model_of(trials)
    return trials, fit, model, summary.safe_batch_of(trials, fit, headroom, 1, model, found)


def allowed_along_the_line(trials, target_bytes, per_sample_bytes, batch, ceiling):
    """line_safe_batch's condition, spelled out: the levels at or above `batch` stepped down to it,
    and the nearest below stepped up, all under the target."""
    levels = summary.batch_levels(trials)
    at_or_above = [t for b, t in levels.items() if batch <= b <= ceiling]
    below = [t for b, t in levels.items() if b < batch]
    nearest = max(below, key=lambda t: t.batch, default=None)
    down_ok = all(t.peak_bytes - (t.batch - batch) * per_sample_bytes <= target_bytes for t in at_or_above)
    up_ok = nearest is None or nearest.peak_bytes + (batch - nearest.batch) * per_sample_bytes <= target_bytes
    return down_ok and up_ok


def test_readings_above_the_answer_do_not_lower_the_safe_batch():
    trials, fit, model, safe = run(DENSE_WIDE_1_37_GIB)
    # The answer stands at its highest new-process reading, not the child's 1,396,490,240.
    level = summary.batch_levels(trials)[253]
    assert level.forked is False and level.peak_bytes == 1366351872
    # Memory jumps 162 MiB from 253 to 258 (5 samples of a 2 MiB line): those readings, carried
    # down the line, had left 134 (the older rule, section 1). Without them the answer is the same.
    below_only = [t for t in trials if t.batch <= 253]
    assert summary.safe_batch_of(below_only, fit, DEFAULT_HEADROOM, 1, summary.memory_model_of(below_only), 253) == safe
    assert allowed_along_the_line(trials, fit * (1 - DEFAULT_HEADROOM), model.per_sample_bytes, safe, 253)
    assert not allowed_along_the_line(trials, fit * (1 - DEFAULT_HEADROOM), model.per_sample_bytes, safe + 1, 253)
    assert 134 < safe < 253


def test_a_fork_childs_high_reading_is_not_the_level_where_new_processes_read_that_batch():
    trials, fit, model, safe = run(TEXT_CNN_1_25_GIB)
    levels = summary.batch_levels(trials)
    assert levels[1022].forked is False and levels[1022].peak_bytes == 1325985792  # the child read 1,485,217,792
    assert levels[512].fresh is False  # no new process read 512: the scout's reading stands for it
    target = fit * (1 - DEFAULT_HEADROOM)
    assert levels[1022].peak_bytes > target  # the answer itself is within the headroom: step down
    assert allowed_along_the_line(trials, target, model.per_sample_bytes, safe, 1022)
    assert not allowed_along_the_line(trials, target, model.per_sample_bytes, safe + 1, 1022)
    assert safe > 371  # the older rule's, which carried the child's readings down the line


def test_the_spread_between_processes_is_counted_once():
    # Two peak levels at the answer in new processes (7% apart): the search's judged budget is
    # lowered by that spread; the high draw itself keeps the headroom, so the answer is the batch
    # (the spread is not taken off again).
    line = [(b, 200 + 4 * b, True, "N") for b in (50, 100, 150, 200, 250)]
    answer = [(300, 1400 * MIB, True, "N"), (300, 1400 * MIB, True, "N"), (300, 1500 * MIB, True, "N")]
    trials = trials_of([(b, mib * MIB, ok, w) for b, mib, ok, w in line] + answer)
    fit = 1700 * MIB
    assert summary.judged_budget_bytes(trials, fit) == int(fit / (1500 / 1400))
    model = summary.memory_model_of(trials)
    assert summary.max_batch_of(trials, fit) == 300
    assert summary.safe_batch_of(trials, fit, DEFAULT_HEADROOM, 1, model, 300) == 300
    # A high draw with less than the headroom to spare steps the batch down the line.
    high = trials_of([(b, mib * MIB, ok, w) for b, mib, ok, w in line]
                     + [(300, 1400 * MIB, True, "N"), (300, 1580 * MIB, True, "N")])
    per_sample = summary.memory_model_of(high).per_sample_bytes
    expected = 300 - math.ceil((1580 * MIB - fit * (1 - DEFAULT_HEADROOM)) / per_sample)
    assert summary.safe_batch_of(high, fit, DEFAULT_HEADROOM, 1, summary.memory_model_of(high), 300) == expected


def test_a_straight_line_keeps_the_headroom_to_the_fit_budget():
    trials = trials_of([(b, (100 + b) * MIB, True, "N") for b in (8, 100, 400, 800, 900, 900, 900)])
    model = summary.memory_model_of(trials)
    fit = 1000 * MIB
    expected = int(1000 * (1 - DEFAULT_HEADROOM)) - 100  # the level at 800 (900 MiB) stepped to the target
    assert summary.safe_batch_of(trials, fit, DEFAULT_HEADROOM, 1, model, 880) == expected
    assert summary.safe_batch_of(trials, fit, 0.0, 1, model, 880) == 880
    assert summary.safe_batch_of(trials, fit, DEFAULT_HEADROOM, 16, model, 880) == expected // 16 * 16


@pytest.mark.parametrize("path", sorted(COMMITTED.glob("*.json")), ids=lambda p: p.name[:40])
def test_a_committed_profile_read_by_this_rule_trains_at_least_its_recorded_batch(path):
    profile = DeviceProfile.from_dict(json.loads(path.read_text()))
    fit = fit_budget_bytes(profile.budget_bytes, profile.search.get("inter_op_threads", 1))
    model = profile.memory_model
    safe = summary.safe_batch_of(list(profile.trials), fit, DEFAULT_HEADROOM, profile.search.get("multiple", 1),
                                 model, profile.max_batch)
    assert profile.schema_version < 3 and profile.headroom == 0.10  # written by the older rule
    assert profile.safe_batch <= safe <= profile.max_batch
