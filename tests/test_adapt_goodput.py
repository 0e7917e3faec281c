"""edgebatch/adapt/goodput.py: goodput = throughput x statistical efficiency, pure and table-tested."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgebatch.adapt.goodput import StepCurve, best_batch, efficiency
from edgebatch.errors import UsageError


def test_efficiency_is_one_at_the_base_batch_and_falls_above_it():
    assert efficiency(32, 32, 100.0) == pytest.approx(1.0)
    assert efficiency(132, 32, 100.0) == pytest.approx(132 / 232)
    assert efficiency(8, 32, 100.0) > 1.0
    assert efficiency(64, 32, 0.0) == pytest.approx(0.5)  # no noise: every example beyond B0 is wasted


def test_update_time_counts_full_steps_a_last_step_and_the_per_update_cost():
    curve = StepCurve((1, 100), (10.0, 1000.0), update_overhead_seconds=0.05)
    assert float(curve.step_seconds(100)) == pytest.approx(0.1)
    # 250 in micro-batches of 100: two full steps and a last one of 50 (samples/s 500 there).
    assert float(curve.update_seconds(250, 100)) == pytest.approx(2 * 0.1 + 50 / 500.0 + 0.05)
    assert float(curve.step_seconds(1000)) == pytest.approx(1.0)  # clamped at the last figure


@pytest.mark.parametrize("noise", [50.0, 400.0, 5000.0])
def test_a_constant_rate_with_a_per_update_cost_peaks_at_the_square_root(noise):
    # samples/s r at every batch and o seconds per update: goodput ~ B / ((B/r + o)(noise + B)),
    # whose maximum is at B* = sqrt(o r noise).
    rate, overhead = 1000.0, 0.01
    curve = StepCurve((1, 4096), (rate, rate), update_overhead_seconds=overhead)
    choice = best_batch(curve, noise, base_batch_samples=16, micro_ceiling_samples=4096, bounds_samples=(1, 4096))
    optimum = math.sqrt(overhead * rate * noise)
    assert abs(choice.effective_batch_samples - optimum) <= 1, (choice, optimum)
    assert choice.accumulation_steps == 1


def test_flat_step_times_choose_the_ceiling_and_no_accumulation():
    # Every step takes 0.1 s up to the ceiling (samples/s grows with the batch): more examples per
    # step are free until the ceiling; above it accumulation adds whole steps and only costs efficiency.
    curve = StepCurve((1, 512), (10.0, 5120.0))
    choice = best_batch(curve, 1000.0, base_batch_samples=32, micro_ceiling_samples=256, bounds_samples=(8, 2048))
    assert (choice.effective_batch_samples, choice.micro_batch_samples, choice.accumulation_steps) == (256, 256, 1)
    assert choice.samples_per_second == pytest.approx(2560.0)
    assert choice.goodput == pytest.approx(2560.0 * (1000 + 32) / (1000 + 256))


def test_without_a_per_update_cost_a_constant_rate_chooses_the_smallest_batch():
    curve = StepCurve((1, 1024), (500.0, 500.0))
    choice = best_batch(curve, 300.0, base_batch_samples=64, micro_ceiling_samples=1024, bounds_samples=(16, 1024))
    assert choice.effective_batch_samples == 16


def test_a_larger_noise_scale_never_chooses_a_smaller_batch():
    curve = StepCurve.from_points([(8, 400.0), (32, 1200.0), (128, 2000.0), (32, 1000.0)], update_overhead_seconds=0.02)
    assert curve.samples_per_second[1] == pytest.approx(1100.0)  # two figures at 32: their median
    chosen = [best_batch(curve, noise, 32, 128, (1, 4096)).effective_batch_samples
              for noise in (0.0, 10.0, 100.0, 1000.0, 10000.0)]
    assert chosen == sorted(chosen) and chosen[0] < chosen[-1], chosen


def test_the_choice_is_the_argmax_of_a_brute_force():
    curve = StepCurve.from_points([(1, 20.0), (16, 300.0), (64, 700.0), (100, 760.0)], update_overhead_seconds=0.004)
    choice = best_batch(curve, 250.0, 24, 100, (4, 600))
    scores = {b: b / float(curve.update_seconds(b, 100)) * float(efficiency(b, 24, 250.0)) for b in range(4, 601)}
    assert choice.effective_batch_samples == max(scores, key=lambda b: (scores[b], -b))
    assert choice.goodput == pytest.approx(max(scores.values()))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: best_batch(c, -1.0, 8, 8, (1, 8)), "noise scale"),
        (lambda c: best_batch(c, math.nan, 8, 8, (1, 8)), "noise scale"),
        (lambda c: best_batch(c, 10.0, 8, 8, (9, 8)), "bounds"),
        (lambda c: best_batch(c, 10.0, 8, 0, (1, 8)), "ceiling"),
        (lambda c: StepCurve((8, 4), (1.0, 2.0)), "increasing"),
        (lambda c: StepCurve((4,), (0.0,)), "> 0"),
        (lambda c: StepCurve((), ()), "at least one"),
        (lambda c: StepCurve((4,), (1.0,), update_overhead_seconds=-1.0), ">= 0 s"),
    ],
    ids=["negative noise", "nan noise", "low above high", "no ceiling", "unsorted", "zero rate", "empty", "overhead"],
)
def test_bad_input_is_one_usage_error(call, message):
    with pytest.raises(UsageError, match=message):
        call(StepCurve((1, 8), (1.0, 8.0)))


def test_a_committed_profile_gives_its_measured_curve():
    import glob

    from edgebatch.profiles import load_profile

    profile = load_profile(sorted(glob.glob("device_profiles/*mobilenet_v2*.json"))[0])
    curve = StepCurve.from_profile(profile)
    measured = {t.batch for t in profile.answer_trials if t.ok and t.measured and t.samples_per_second}
    assert set(curve.batches) <= measured and len(curve.batches) >= 3
    choice = best_batch(curve, 500.0, 32, profile.safe_batch, (8, 4 * profile.safe_batch))
    assert choice.micro_batch_samples <= profile.safe_batch and choice.goodput > 0


# --- the policy: AdaptConfig(policy="goodput") -----------------------------------------------------

from edgebatch.adapt import AdaptConfig, AdaptConfigError  # noqa: E402
from edgebatch.adapt.policy import AdaptStats, decide, initial_state  # noqa: E402

CURVE = StepCurve((1, 512), (10.0, 5120.0))  # flat 0.1 s steps


def goodput_config(**overrides):
    settings = {"policy": "goodput", "throughput": CURVE, "check_every_updates": 1, "cooldown_updates": 0,
                "max_effective_batch_samples": 4096}
    settings.update(overrides)
    return AdaptConfig(**settings)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy": "goodput_plus"}, "policy must be one of ('noise_scale', 'goodput'), got 'goodput_plus'"),
        ({"policy": "goodput", "throughput": None}, "policy='goodput' needs a throughput source"),
        ({"throughput": [(8, 100.0)]}, "throughput must be an edgebatch.adapt.goodput.StepCurve or 'measured'"),
        ({"throughput": "measure"}, "throughput must be an edgebatch.adapt.goodput.StepCurve or 'measured', got 'measure'"),
    ],
    ids=["no such policy", "no throughput", "not a curve", "a misspelt source"],
)
def test_a_goodput_config_that_cannot_hold_is_one_usage_error(overrides, message):
    settings = {"policy": "goodput", "throughput": CURVE, **overrides}
    with pytest.raises(AdaptConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AdaptConfig(**settings)


@pytest.mark.parametrize(
    ("current", "target", "expected"),
    [(64, 256, 96), (64, 80, 80), (256, 200, 200), (256, 16, 128), (100, 100, 100)],
    ids=["grow, bounded x1.5", "grow to it", "shrink to it", "shrink, bounded x0.5", "there already"],
)
def test_the_batch_moves_toward_the_goodput_batch_within_the_bounds(current, target, expected):
    config = goodput_config()
    state = initial_state(config, current)
    stats = AdaptStats(noise_scale_samples=1e6, goodput_batch_samples=target, goodput_note="why")
    after, decision = decide(config, state, stats, memory_micro_batch_samples=64)
    assert decision.effective_batch_samples == expected
    assert decision.changed == (expected != current)
    assert decision.reason == ("" if expected == current else f"goodput: why: {current} -> {expected}")


def test_drift_and_plateau_still_fire_first_and_the_noise_rule_is_off():
    config = goodput_config()
    state = initial_state(config, 100)
    drift = decide(config, state, AdaptStats(drift=True, goodput_batch_samples=400), 64)[1]
    assert drift.reason.startswith("drift") and drift.effective_batch_samples == 50
    plateau = decide(config, state, AdaptStats(plateau=True, goodput_batch_samples=40), 64)[1]
    assert plateau.reason.startswith("loss plateau") and plateau.effective_batch_samples == 150
    # Far below the noise scale, but at the goodput batch: the noise-scale rule does not grow it.
    quiet = decide(config, state, AdaptStats(noise_scale_samples=1e6, goodput_batch_samples=100), 64)[1]
    assert not quiet.changed
    # Growth past the noise scale is goodput's call: no noise-scale cap.
    past = decide(config, state, AdaptStats(noise_scale_samples=80.0, goodput_batch_samples=140, goodput_note="n"), 64)[1]
    assert past.effective_batch_samples == 140


def test_the_controller_asks_goodput_on_checks_once_the_noise_scale_is_known():
    from edgebatch.adapt import AdaptController, UpdateMeasurement

    config = goodput_config(check_every_updates=3, min_effective_batch_samples=8, max_effective_batch_samples=1024)
    controller = AdaptController(config, 32)
    rng = np.random.default_rng(0)
    reasons = []
    for update in range(12):
        sizes = (16, 16) if controller.effective_batch_samples == 32 else (controller.effective_batch_samples // 2,) * 2
        # Mean-gradient norms of a noisy problem: |G|^2 = 1, tr(Sigma) = 400 (noise scale 400).
        micro = tuple(1.0 + 400.0 / size + rng.normal(0, 0.01) for size in sizes)
        whole = 1.0 + 400.0 / sum(sizes)
        measurement = UpdateMeasurement(micro_batch_samples=sizes, micro_sq_norms=micro, update_sq_norm=whole,
                                        cosine_previous=None, loss=1.0)
        decision, _reading = controller.observe(measurement, memory_micro_batch_samples=256)
        reasons.append(decision.reason)
    changed = [reason for reason in reasons if reason]
    assert changed and all(reason.startswith("goodput: goodput ") for reason in changed), reasons
    # Flat 0.1 s steps up to the 256 ceiling: goodput climbs toward it, x1.5 per check.
    assert controller.effective_batch_samples > 32


# --- throughput="measured": the curve from the run's own step times ------------------------------

from edgebatch.adapt.goodput import MIN_MEASURED_UPDATES, MeasuredSteps  # noqa: E402


def test_measured_steps_fit_a_fixed_and_a_per_example_cost_and_leave_the_first_update_out():
    steps = MeasuredSteps()
    steps.add([64, 64], [9.0, 9.0], 99.0)  # the first update traces: left out
    assert steps.curve(64) is None
    for _ in range(MIN_MEASURED_UPDATES):
        # Steps of 2 ms + 0.1 ms per example; updates 5 ms more than their pieces.
        steps.add([16, 16, 4], [0.0036, 0.0036, 0.0024], 0.0036 * 2 + 0.0024 + 0.005)
    curve = steps.curve(64)
    assert curve.batches == (1, 2, 4, 8, 16, 32, 64)  # extrapolated up to the memory ceiling
    for batch, rate in zip(curve.batches, curve.samples_per_second):
        assert rate == pytest.approx(batch / (0.002 + 0.0001 * batch), rel=1e-6)
    assert curve.update_overhead_seconds == pytest.approx(0.005, rel=1e-6)


def test_measured_steps_of_one_size_predict_no_gain_from_larger_steps():
    steps = MeasuredSteps()
    for _ in range(MIN_MEASURED_UPDATES + 1):
        steps.add([8, 8], [0.004, 0.004], 0.01)
    curve = steps.curve(32)
    assert curve.samples_per_second == pytest.approx([2000.0] * len(curve.batches))  # 8 / 0.004 at every size


def test_a_measured_controller_chooses_for_goodput_once_it_has_timed_updates():
    from edgebatch.adapt import AdaptController, UpdateMeasurement

    config = goodput_config(throughput="measured", min_effective_batch_samples=8, max_effective_batch_samples=1024)
    controller = AdaptController(config, 32)
    reasons = []
    for _update in range(10):
        half = controller.effective_batch_samples // 2
        sizes = (half, controller.effective_batch_samples - half)
        micro = tuple(1.0 + 400.0 / size for size in sizes)
        # 10 ms a step whatever its size, 20 ms more per update: larger batches are nearly free.
        measurement = UpdateMeasurement(micro_batch_samples=sizes, micro_sq_norms=micro,
                                        update_sq_norm=1.0 + 400.0 / sum(sizes), cosine_previous=None, loss=1.0,
                                        piece_seconds=(0.01, 0.01), update_seconds=0.04)
        decision, _reading = controller.observe(measurement, memory_micro_batch_samples=256)
        reasons.append(decision.reason)
    changed = [reason for reason in reasons if reason]
    # The first update traces; the curve needs MIN_MEASURED_UPDATES more, the last of them deciding.
    assert reasons[:MIN_MEASURED_UPDATES] == [""] * MIN_MEASURED_UPDATES
    assert changed and all(reason.startswith("goodput: ") for reason in changed)
    assert controller.effective_batch_samples > 32
