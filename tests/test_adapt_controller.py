"""The adaptive-batch controller on constructed measurements: each signal reaches the policy, and the
whole state survives a JSON round trip. Pure (numpy); the real-TensorFlow wiring is in
tests/test_training_adapt.py."""

import json
import math

import numpy as np
import pytest

from edgebatch.adapt import AdaptConfig
from edgebatch.adapt.controller import AdaptController, UpdateMeasurement

MEMORY_MICRO = 1024


def quiet_config(**overrides):
    """Every trigger off unless a test turns it on; a check every update, no cooldown."""
    settings = {
        "check_every_updates": 1,
        "cooldown_updates": 0,
        "lr_rule": "none",
        "grow_above_cosine": 0.999,
        "shrink_below_cosine": -0.999,
        "noise_cap_factor": None,
        "grow_below_noise_fraction": None,
        "schedule_decay_ratio": None,
        "plateau_checks": 1000,  # a constant loss is a plateau at any tolerance
        "drift_rise": 0.89,
    }
    settings.update(overrides)
    return AdaptConfig(**settings)


def measurement(sizes=(8,), sq=(1.0,), update_sq=1.0, cosine=None, loss=1.0, losses=None, rate=None):
    return UpdateMeasurement(micro_batch_samples=tuple(sizes), micro_sq_norms=tuple(sq), update_sq_norm=update_sq,
                             cosine_previous=cosine, loss=loss, per_example_losses=losses, schedule_rate=rate)


def expected_pair(gradient_sq, trace, piece):
    """Two micro-batches of `piece` examples at the exact expectations E|g_b|^2 = |G|^2 + tr(Sigma)/b."""
    return measurement(sizes=(piece, piece), sq=(gradient_sq + trace / piece,) * 2,
                       update_sq=gradient_sq + trace / (2 * piece))


def test_two_pieces_give_the_noise_scale_exactly_from_exact_expectations():
    controller = AdaptController(quiet_config(), 16)
    for _ in range(30):
        _, reading = controller.observe(expected_pair(gradient_sq=2.0, trace=96.0, piece=8), MEMORY_MICRO)
    assert reading.noise_scale_samples == pytest.approx(48.0, rel=1e-9)  # tr(Sigma) / |G|^2


def test_uneven_pieces_use_the_harmonic_mean_and_stay_exact():
    controller = AdaptController(quiet_config(), 36)
    sizes = (16, 16, 4)
    gradient_sq, trace = 1.5, 30.0
    m = measurement(sizes=sizes, sq=tuple(gradient_sq + trace / b for b in sizes), update_sq=gradient_sq + trace / 36)
    _, reading = controller.observe(m, MEMORY_MICRO)
    assert reading.noise_scale_samples == pytest.approx(20.0, rel=1e-9)


def test_one_piece_measures_no_noise_scale():
    controller = AdaptController(quiet_config(), 16)
    _, reading = controller.observe(measurement(sizes=(16,), sq=(3.0,), update_sq=3.0), MEMORY_MICRO)
    assert reading.noise_scale_samples is None


def test_a_batch_below_half_the_noise_scale_grows_and_growth_stops_at_the_cap():
    controller = AdaptController(quiet_config(grow_below_noise_fraction=0.5, noise_cap_factor=1.0), 16)
    decision, _ = controller.observe(expected_pair(gradient_sq=1.0, trace=40.0, piece=8), MEMORY_MICRO)
    assert decision.changed and decision.effective_batch_samples == 24  # x1.5, under the cap 40
    assert "noise scale" in decision.reason
    decision, _ = controller.observe(expected_pair(gradient_sq=1.0, trace=40.0, piece=12), MEMORY_MICRO)
    assert not decision.changed and decision.effective_batch_samples == 24  # 24 >= 0.5 x 40: enough


def test_agreeing_updates_grow_after_a_full_window_and_disagreeing_ones_shrink():
    cfg = quiet_config(grow_above_cosine=0.8, shrink_below_cosine=0.3, cosine_window_updates=3)
    controller = AdaptController(cfg, 16)
    readings = [controller.observe(measurement(cosine=0.9), MEMORY_MICRO) for _ in range(3)]
    assert [d.changed for d, _ in readings] == [False, False, True]  # a half window is no evidence
    assert readings[-1][1].mean_cosine == pytest.approx(0.9)
    assert readings[-1][0].effective_batch_samples == 24
    for _ in range(3):
        decision, reading = controller.observe(measurement(cosine=0.1), MEMORY_MICRO)
    assert reading.mean_cosine == pytest.approx(0.1) and decision.effective_batch_samples == 12
    assert "cosine" in decision.reason


def test_a_flat_loss_over_the_plateau_checks_grows_and_the_history_restarts_after_a_change():
    controller = AdaptController(quiet_config(plateau_checks=3, plateau_relative_tolerance=1e-3), 10)
    outputs = [controller.observe(measurement(loss=2.0), MEMORY_MICRO) for _ in range(8)]
    # 4 checks hold 3 changes of 0; after the change the batch differs, so 4 new checks are needed.
    assert [decision.changed for decision, _ in outputs] == [False, False, False, True] * 2
    decision, reading = outputs[3]
    assert decision.reason.startswith("loss plateau") and reading.plateau and reading.loss_change == 0.0


def test_a_falling_loss_is_no_plateau_and_reports_its_relative_change():
    controller = AdaptController(quiet_config(plateau_checks=2), 10)
    for loss in (4.0, 3.0, 2.0, 1.0):
        decision, reading = controller.observe(measurement(loss=loss), MEMORY_MICRO)
        assert not decision.changed
    assert reading.loss_change == pytest.approx(0.5) and reading.plateau is False


def test_plateau_checks_use_the_mean_loss_since_the_previous_check():
    controller = AdaptController(quiet_config(check_every_updates=2, plateau_checks=1), 10)
    for loss in (1.0, 3.0):  # first check: mean 2.0
        controller.observe(measurement(loss=loss), MEMORY_MICRO)
    controller.observe(measurement(loss=2.5), MEMORY_MICRO)
    decision, reading = controller.observe(measurement(loss=1.5), MEMORY_MICRO)  # mean 2.0 again
    assert reading.checked and reading.loss_change == 0.0 and decision.changed


def test_a_decayed_schedule_grows_the_batch_instead_and_the_reference_moves_with_the_change():
    controller = AdaptController(quiet_config(schedule_decay_ratio=2 / 3), 16)
    decision, reading = controller.observe(measurement(rate=0.1), MEMORY_MICRO)
    assert not decision.changed and reading.schedule_lr_ratio == pytest.approx(1.0)
    decision, reading = controller.observe(measurement(rate=0.05), MEMORY_MICRO)
    assert reading.schedule_lr_ratio == pytest.approx(0.5)
    assert decision.changed and decision.effective_batch_samples == 24  # wanted x2, bounded by x1.5
    decision, reading = controller.observe(measurement(rate=0.05), MEMORY_MICRO)
    assert reading.schedule_lr_ratio == pytest.approx(1.0) and not decision.changed


def test_rising_hard_examples_shrink_the_batch():
    controller = AdaptController(quiet_config(drift_rise=0.1, drift_recent_examples=128,
                                              drift_reference_examples=512), 32)
    rng = np.random.default_rng(0)
    for _ in range(40):  # settled losses: about 10% above the reference's 90th percentile
        decision, reading = controller.observe(measurement(losses=rng.exponential(1.0, 64)), MEMORY_MICRO)
        assert not decision.changed
    assert reading.hard_share < 0.2
    for _ in range(4):  # harder examples arrive: most losses now above the old 90th percentile
        decision, reading = controller.observe(measurement(losses=rng.exponential(5.0, 64)), MEMORY_MICRO)
        if decision.changed:
            break
    assert decision.changed and decision.effective_batch_samples == 16 and reading.drift
    assert decision.reason.startswith("drift")


@pytest.mark.parametrize(
    "effective, memory_micro, min_pieces, split",
    [(16, 1024, 2, 8), (16, 4, 2, 4), (17, 1024, 2, 9), (16, 1024, 1, 16), (1, 1024, 2, 1), (30, 1024, 4, 8)],
)
def test_split_micro_batch_takes_the_governors_size_and_at_least_the_pieces_asked(
        effective, memory_micro, min_pieces, split):
    controller = AdaptController(quiet_config(min_pieces_per_update=min_pieces), effective)
    assert controller.split_micro_batch(memory_micro) == split
    # The bound alone (what pieces cut by length are capped with): the split when memory allows more.
    assert controller.pieces_bound_samples() == (split if memory_micro >= effective else -(-effective // min_pieces))


def test_the_decision_never_takes_a_micro_batch_above_memorys():
    controller = AdaptController(quiet_config(grow_above_cosine=0.5, cosine_window_updates=1), 16)
    decision, _ = controller.observe(measurement(cosine=0.9), memory_micro_batch_samples=5)
    assert decision.effective_batch_samples == 24
    assert decision.micro_batch_samples == 5 and decision.accumulation_steps == 5


@pytest.mark.parametrize("rule, scale", [("none", 1.0), ("linear", 1.5), ("sqrt", math.sqrt(1.5)),
                                         ("inverse_sqrt", 1 / math.sqrt(1.5))])
def test_lr_scale_follows_the_rule_from_the_starting_batch(rule, scale):
    controller = AdaptController(quiet_config(grow_above_cosine=0.5, cosine_window_updates=1, lr_rule=rule), 16)
    assert controller.lr_scale() == 1.0
    decision, _ = controller.observe(measurement(cosine=0.9), MEMORY_MICRO)
    assert controller.lr_scale() == pytest.approx(scale) == pytest.approx(decision.lr_scale)


def test_state_survives_a_json_round_trip_and_decides_the_same_afterwards():
    cfg = quiet_config(check_every_updates=3, cooldown_updates=2, grow_above_cosine=0.8, shrink_below_cosine=0.3,
                       cosine_window_updates=2, grow_below_noise_fraction=0.5, noise_cap_factor=1.0,
                       plateau_checks=2, schedule_decay_ratio=0.7, drift_rise=0.1, drift_recent_examples=32,
                       drift_reference_examples=64)
    rng = np.random.default_rng(3)
    stream = [
        UpdateMeasurement(micro_batch_samples=(8, 8), micro_sq_norms=tuple(rng.uniform(1, 3, 2)),
                          update_sq_norm=float(rng.uniform(0.5, 1.5)), cosine_previous=float(rng.uniform(-1, 1)),
                          loss=float(rng.uniform(1, 2)), per_example_losses=rng.exponential(1.0, 16),
                          schedule_rate=0.1 * 0.9 ** (k // 4))
        for k in range(40)
    ]
    straight = AdaptController(cfg, 16)
    resumed = AdaptController(cfg, 16)
    outputs_straight = [straight.observe(m, 64) for m in stream]
    outputs_resumed = [resumed.observe(m, 64) for m in stream[:17]]
    copy = AdaptController(cfg, 16)
    copy.load_state_dict(json.loads(json.dumps(resumed.state_dict())))
    outputs_resumed += [copy.observe(m, 64) for m in stream[17:]]
    assert outputs_resumed == outputs_straight
    assert any(decision.changed for decision, _ in outputs_straight)  # the stream exercised the policy


def test_the_controller_refuses_a_config_of_another_kind():
    with pytest.raises(TypeError, match="AdaptConfig"):
        AdaptController({"check_every_updates": 1}, 16)
