"""max/safe/knee from trial tables: pure, no TensorFlow."""

import pytest

from edgebatch.probe import summary
from edgebatch.profiles import MemoryModel, Trial

MIB = 1024**2


def trial(batch, peak_mib, rate=None, ok=True, error=None, measured=True):
    return Trial(batch, ok, error, None if peak_mib is None else int(peak_mib * MIB), None, None,
                 None if rate is None else batch / rate, rate, measured)


TRIALS = [
    trial(8, 800, 60),
    trial(16, 880, 90),
    trial(32, 1040, 100),
    trial(64, 1360, 97),
    trial(128, 2000, 80),
    trial(256, 3280, None, ok=False, error="over_budget"),
    trial(512, None, ok=False, error="oom"),
]
BUDGET = 2100 * MIB


def test_max_batch_is_the_largest_measured_fit():
    assert summary.max_batch_of(TRIALS, BUDGET) == 128


def test_knee_is_the_smallest_batch_within_5_percent_of_the_best_rate():
    assert summary.throughput_knee_of(TRIALS, BUDGET) == 32  # 97 >= 95 but 64 > 32
    assert summary.throughput_knee_of([trial(8, 800, 100), trial(16, 900, 96)], BUDGET) == 8


def test_memory_model_uses_every_trial_that_ran_including_over_budget():
    model = summary.memory_model_of(TRIALS)
    assert model.points == 6  # 8..128 and 256, which read over budget; 512 raised an OOM: no reading
    assert model.per_sample_bytes == pytest.approx(10 * MIB, rel=1e-6)
    assert model.fixed_bytes == pytest.approx(720 * MIB, rel=1e-6)


def test_safe_batch_steps_down_from_the_largest_fit_by_per_sample_bytes():
    model = MemoryModel(720 * MIB, 10 * MIB, 1.0, 5)
    # safe budget 0.9 x 2100 = 1890 MiB; from 128 at 2000 MiB step down 11 samples -> 117.
    assert summary.safe_batch_of(TRIALS, BUDGET, 0.10, 1, model) == 117
    assert summary.safe_batch_of(TRIALS, BUDGET, 0.10, 8, model) == 112
    # Without a model only measured trials count.
    assert summary.safe_batch_of(TRIALS, BUDGET, 0.10, 1, None) == 64


def test_safe_batch_never_exceeds_max_batch_and_none_without_fits():
    model = MemoryModel(720 * MIB, 10 * MIB, 1.0, 5)
    assert summary.safe_batch_of(TRIALS, BUDGET, 0.0, 1, model) == 128
    assert summary.safe_batch_of([trial(8, None, ok=False, error="oom")], BUDGET, 0.1, 1, model) is None


def test_safe_batch_respects_the_worst_reading_when_readings_are_not_monotone():
    # The default mobilenet_v2 probe on this machine kind: the scout read 21.84 GiB at 1643, a
    # fresh worker 20.48 GiB at 1694. 1694 is under the safe budget only by its own low reading.
    gib = 1024**3
    trials = [trial(8, 1.03 * 1024, 55), trial(1643, 21.84 * 1024, 16), trial(1694, 20.48 * 1024, 20)]
    model = MemoryModel(971 * MIB, 12.39 * MIB, 0.996, 5)
    budget = 23.15 * gib
    safe = summary.safe_batch_of(trials, budget, 0.10, 1, model)
    assert 1540 <= safe <= 1570  # 1643 - (21.84 - 20.835) GiB / 12.39 MiB = 1560


# An address-space cap binds far below the budget: dense_wide under a 600 MiB cap in CI, where 256
# ran in the probe's worker and failed in the next fresh process.
CAPPED = [
    trial(32, 776, 650),
    trial(156, 1045, 1106),
    trial(249, 1229, 1087),
    trial(256, 1239, 1068),
    trial(260, None, ok=False, error="oom"),
    trial(264, None, ok=False, error="oom"),
]
CAP_BUDGET = 16 * 1024 * MIB


def test_a_failure_the_budget_does_not_explain_keeps_the_safe_batch_clear_of_the_edge():
    model = summary.memory_model_of(CAPPED)
    assert model.predict_bytes(260) < CAP_BUDGET
    assert summary.hidden_limit_edge_of(CAPPED, CAP_BUDGET, model) == 256
    # The budget alone would allow 256 (the largest fit); 10% below the edge in samples is 230.
    assert summary.safe_batch_of(CAPPED, CAP_BUDGET, 0.10, 1, model) == 230
    assert summary.safe_batch_of(CAPPED, CAP_BUDGET, 0.10, 8, model) == 224
    assert summary.safe_batch_of(CAPPED, CAP_BUDGET, 0.10, 1, None) == 230
    assert summary.safe_batch_of(CAPPED, CAP_BUDGET, 0.0, 1, model) == 256


def test_failures_the_budget_explains_leave_the_safe_batch_to_the_budget():
    model = MemoryModel(720 * MIB, 10 * MIB, 1.0, 5)
    # TRIALS' OOM at 512 is predicted at 5840 MiB, far over the 2100 MiB budget: no hidden limit.
    assert summary.hidden_limit_edge_of(TRIALS, BUDGET, model) is None
    over_budget_only = [t for t in CAPPED if t.ok] + [trial(300, None, ok=False, error="over_budget")]
    assert summary.hidden_limit_edge_of(over_budget_only, CAP_BUDGET, model) is None
    # A failure below every fit has no edge under it.
    assert summary.hidden_limit_edge_of([trial(8, None, ok=False, error="oom"), trial(16, 900)], BUDGET, model) is None
