"""The governor policy's inputs beyond plain pressure: the memory model, slow steps and PSI.
One transition at a time, fields asserted by name."""

import dataclasses

import pytest

from edgebatch.governor.policy import (
    GovernorConfig,
    Observation,
    footprint_bytes,
    initial_state,
    model_fit_batch,
    step,
)

MiB = 1024 * 1024


def config(**overrides):
    settings = {"ceiling_batch": 64, "effective_batch": 64}
    settings.update(overrides)
    return GovernorConfig(**settings)


def state_at(cfg, micro_batch, **fields):
    return dataclasses.replace(initial_state(cfg), micro_batch=micro_batch, **fields)


# --- model-predictive sizing ------------------------------------------------------------------


def test_model_fit_batch_is_the_largest_batch_under_target():
    cfg = config(fixed_bytes=849 * MiB, per_sample_bytes=11.6 * MiB)
    fit = model_fit_batch(cfg, limit_bytes=4096 * MiB, used_bytes=1000 * MiB)
    room = 0.8 * 4096 * MiB - 1000 * MiB
    assert cfg.fixed_bytes + cfg.per_sample_bytes * fit <= room < cfg.fixed_bytes + cfg.per_sample_bytes * (fit + 1)
    assert model_fit_batch(cfg, 4096 * MiB, None) is None
    assert model_fit_batch(config(), 4096 * MiB, 0) is None


def test_pressure_shrink_picks_the_model_fit_instead_of_halving():
    cfg = config(fixed_bytes=100 * MiB, per_sample_bytes=10 * MiB)
    # predicted at 64: (200 + 100 + 640) / 1000 = 0.94 of the limit
    observation = Observation(pressure=0.93, limit_bytes=1000 * MiB, used_bytes=200 * MiB)  # fits 50
    _, decision = step(cfg, state_at(cfg, 64), observation)
    assert decision.micro_batch == 50 and decision.reason == "predicted 0.94 > 0.90: 64 -> 50 (model fits 50)"


def test_pressure_shrink_with_model_stays_within_the_shrink_factor():
    cfg = config(fixed_bytes=0.0, per_sample_bytes=250 / 64 * MiB)
    # predicted at 64: (700 + 250) / 1000 = 0.95, below the hard limit; fits 25, below the bound 32
    observation = Observation(pressure=0.93, limit_bytes=1000 * MiB, used_bytes=700 * MiB)
    _, decision = step(cfg, state_at(cfg, 64), observation)
    assert decision.micro_batch == 32 and decision.reason == "predicted 0.95 > 0.90: 64 -> 32 (model fits 25)"


def test_hard_limit_goes_to_the_model_fit_at_once_even_in_cooldown():
    cfg = config(fixed_bytes=100 * MiB, per_sample_bytes=10 * MiB)
    # predicted at 64: (600 + 740) / 1000 = 1.34: this size does not fit at all
    observation = Observation(pressure=0.93, limit_bytes=1000 * MiB, used_bytes=600 * MiB)  # fits 10
    state, decision = step(cfg, state_at(cfg, 64, cooldown_left=7), observation)
    assert decision.micro_batch == 10
    assert decision.reason == "predicted 1.34 > 0.97 (hard limit): 64 -> 10 (model fits 10)"
    assert state.cooldown_left == cfg.cooldown_updates


def test_hard_limit_is_above_the_fraction_not_at_it():
    cfg = config(fixed_bytes=0.0, per_sample_bytes=1 * MiB)
    at_limit = Observation(pressure=0.5, limit_bytes=1000 * MiB, used_bytes=906 * MiB)  # (906 + 64) / 1000
    state, decision = step(cfg, state_at(cfg, 64, cooldown_left=3), at_limit)
    assert not decision.changed and state.cooldown_left == 2
    over = dataclasses.replace(at_limit, used_bytes=907 * MiB)
    assert step(cfg, state_at(cfg, 64, cooldown_left=3), over)[1].changed


def test_a_full_device_that_is_our_own_cache_is_calm_with_a_model():
    cfg = config(fixed_bytes=100 * MiB, per_sample_bytes=1 * MiB)
    # the device reads 0.95, all of it this job's pool; others use nothing: fits 700
    observation = Observation(pressure=0.95, limit_bytes=1000 * MiB, used_bytes=0, own_bytes=950 * MiB)
    state, decision = step(cfg, state_at(cfg, 32, calm_streak=3), observation)
    assert not decision.changed and decision.micro_batch == 32
    assert state.calm_streak == 4 and state.cooldown_left == 0
    # the same reading without the byte counts: halve
    assert step(cfg, state_at(cfg, 32), Observation(pressure=0.95))[1].micro_batch == 16


def test_without_a_model_a_room_reading_is_judged_on_what_others_use():
    cfg = config()
    own_pool = Observation(pressure=0.95, limit_bytes=1000 * MiB, used_bytes=20 * MiB, own_bytes=930 * MiB)
    state, decision = step(cfg, state_at(cfg, 32, calm_streak=3), own_pool)
    assert not decision.changed and state.calm_streak == 4
    neighbour = Observation(pressure=0.95, limit_bytes=1000 * MiB, used_bytes=920 * MiB, own_bytes=30 * MiB)
    _, decision = step(cfg, state_at(cfg, 32), neighbour)
    assert decision.micro_batch == 16 and decision.reason == "others use 0.92 > 0.90: 32 -> 16"


@pytest.mark.parametrize(
    "model_measure, reading_measure, applies",
    [
        ("process_peak", "process_peak", True),
        ("process_peak", "allocator_peak", False),
        ("allocator_peak", "process_peak", False),
        (None, "allocator_peak", True),
        ("process_peak", None, True),
    ],
)
def test_the_memory_model_applies_only_to_a_reading_in_its_measure(model_measure, reading_measure, applies):
    cfg = config(fixed_bytes=100 * MiB, per_sample_bytes=10 * MiB, model_measure=model_measure)
    fit = model_fit_batch(cfg, 1000 * MiB, 200 * MiB, reading_measure)
    assert fit == (50 if applies else None)
    observation = Observation(pressure=0.3, limit_bytes=1000 * MiB, used_bytes=200 * MiB, measure=reading_measure)
    _, decision = step(cfg, state_at(cfg, 64), observation)
    # predicted 0.94 shrinks to the fit; others' 0.20 alone is calm
    assert decision.micro_batch == (50 if applies else 64)


def test_extra_bytes_count_in_the_fit_and_the_footprint():
    cfg = config(fixed_bytes=100 * MiB, per_sample_bytes=10 * MiB, extra_bytes=100 * MiB)
    assert model_fit_batch(cfg, 1000 * MiB, 200 * MiB) == 40
    assert footprint_bytes(cfg, 40) == 600 * MiB


def test_growth_stops_at_the_model_fit():
    cfg = config(ceiling_batch=256, effective_batch=256, fixed_bytes=100 * MiB, per_sample_bytes=10 * MiB)
    observation = Observation(pressure=0.3, limit_bytes=1000 * MiB, used_bytes=200 * MiB)  # fits 50
    _, decision = step(cfg, state_at(cfg, 32, calm_streak=4), observation)
    assert decision.micro_batch == 50
    assert decision.reason == "calm 5 updates under the model's fit: 32 -> 50 (model fits 50)"
    state, decision = step(cfg, state_at(cfg, 50, calm_streak=4), observation)
    assert not decision.changed and state.calm_streak == 0, "at the fit a prediction is not calm"


# --- slow steps and PSI -----------------------------------------------------------------------


def test_a_slow_step_counts_as_pressure():
    cfg = config(slow_step_factor=2.0, slow_step_patience=1)
    history = ((64, 1.0), (64, 1.1), (32, 9.0), (64, 0.9))
    state = state_at(cfg, 64, recent_step_seconds=history)
    _, decision = step(cfg, state, Observation(pressure=0.5, step_seconds=3.1, micro_batch=64))
    assert decision.micro_batch == 32 and decision.reason == "slow step 3.1x median: 64 -> 32"


def test_one_slow_step_alone_is_noise_by_default_two_in_a_row_are_pressure():
    cfg = config(slow_step_factor=2.0)
    assert cfg.slow_step_patience == 2
    state = state_at(cfg, 64, recent_step_seconds=((64, 1.0), (64, 1.1), (64, 0.9)))
    state, decision = step(cfg, state, Observation(pressure=0.5, step_seconds=3.3, micro_batch=64))
    assert not decision.changed
    state, decision = step(cfg, state, Observation(pressure=0.5, step_seconds=1.0, micro_batch=64))
    assert not decision.changed, "a slow step followed by a normal one is not pressure"
    state, decision = step(cfg, state, Observation(pressure=0.5, step_seconds=2.5, micro_batch=64))
    assert not decision.changed
    _, decision = step(cfg, state, Observation(pressure=0.5, step_seconds=2.6, micro_batch=64))
    assert decision.micro_batch == 32 and decision.reason.startswith("slow step 2.")


def test_a_step_within_the_factor_is_not_slow_and_joins_the_history():
    cfg = config(slow_step_factor=2.0)
    state = state_at(cfg, 64, recent_step_seconds=((64, 1.0), (64, 1.1), (64, 0.9)))
    state, decision = step(cfg, state, Observation(pressure=0.5, step_seconds=1.9, micro_batch=64))
    assert not decision.changed and state.recent_step_seconds[-1] == (64, 1.9)


def test_slow_step_needs_three_samples_at_the_same_size():
    cfg = config()
    state = state_at(cfg, 64, recent_step_seconds=((64, 1.0), (64, 1.0), (32, 0.5), (32, 0.5), (32, 0.5)))
    _, decision = step(cfg, state, Observation(pressure=0.5, step_seconds=10.0, micro_batch=64))
    assert not decision.changed


def test_step_history_is_bounded_by_the_window():
    cfg = config(slow_step_window=4)
    state = initial_state(cfg)
    for seconds in (1.0, 1.1, 1.2, 1.3, 1.4, 1.5):
        state, _ = step(cfg, state, Observation(pressure=None, step_seconds=seconds, micro_batch=64))
    assert state.recent_step_seconds == ((64, 1.2), (64, 1.3), (64, 1.4), (64, 1.5))


@pytest.mark.parametrize("psi, shrinks", [(9.9, False), (10.0, True), (35.0, True)])
def test_psi_at_or_above_threshold_counts_as_pressure(psi, shrinks):
    cfg = config()
    _, decision = step(cfg, state_at(cfg, 64), Observation(pressure=0.5, psi_some_avg10=psi))
    assert decision.changed is shrinks
    if shrinks:
        assert decision.reason.startswith(f"psi some_avg10 {psi:.1f}% >= 10.0%")


def test_psi_pressure_resets_the_calm_streak_even_without_a_reading():
    cfg = config(min_batch=64)
    state, _ = step(cfg, state_at(cfg, 64, calm_streak=3), Observation(pressure=None, psi_some_avg10=20.0))
    assert state.calm_streak == 0


def test_psi_shrinks_even_where_the_model_sees_room():
    cfg = config(fixed_bytes=100 * MiB, per_sample_bytes=1 * MiB)
    observation = Observation(pressure=0.3, limit_bytes=1000 * MiB, used_bytes=0, psi_some_avg10=25.0)  # fits 700
    _, decision = step(cfg, state_at(cfg, 64), observation)
    assert decision.micro_batch == 32 and decision.reason == "psi some_avg10 25.0% >= 10.0%: 64 -> 32 (model fits 700)"
