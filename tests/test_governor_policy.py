"""The governor's pure policy, one transition at a time (optax style): build the state of interest,
apply one observation, assert fields by name."""

import dataclasses
import json
import math

import pytest

from edgebatch.errors import UsageError
from edgebatch.governor.policy import (
    GovernorConfig,
    GovernorConfigError,
    GovernorState,
    Observation,
    decision_for,
    initial_state,
    step,
)

MiB = 1024 * 1024


def config(**overrides):
    settings = {"ceiling_batch": 64, "effective_batch": 64}
    settings.update(overrides)
    return GovernorConfig(**settings)


def state_at(cfg, micro_batch, **fields):
    return dataclasses.replace(initial_state(cfg), micro_batch=micro_batch, **fields)


CALM = Observation(pressure=0.30)
MIDDLE = Observation(pressure=0.75)
HIGH = Observation(pressure=0.95)


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, quoted",
    [
        ({"ceiling_batch": 0}, "0"),
        ({"ceiling_batch": 8.0}, "8.0"),
        ({"ceiling_batch": True}, "True"),
        ({"effective_batch": -3}, "-3"),
        ({"min_batch": 0}, "0"),
        ({"mode": "adaptive"}, "'adaptive'"),
        ({"lr_scaling": "cubic", "mode": "elastic"}, "'cubic'"),
        ({"lr_scaling": "linear"}, "'linear'"),  # fixed mode: would do nothing
        ({"elastic_floor_batch": 8}, "8"),  # fixed mode: would do nothing
        ({"mode": "elastic", "elastic_floor_batch": 65}, "65"),
        ({"grow_below_pressure": 0.95}, "0.95"),
        ({"grow_patience": 0}, "0"),
        ({"cooldown_updates": -1}, "-1"),
        ({"max_grow_factor": 1.0}, "1.0"),
        ({"max_shrink_factor": 1.0}, "1.0"),
        ({"oom_shrink_factor": 0.0}, "0.0"),
        ({"slow_step_factor": float("nan")}, "nan"),
        ({"slow_step_window": 2}, "2"),
        ({"fixed_bytes": 10.0}, "None"),
        ({"fixed_bytes": 0.0, "per_sample_bytes": -1.0}, "-1.0"),
        ({"target_pressure": 0.92}, "0.92"),
        ({"multiple": 0}, "0"),
        ({"min_batch": 9, "ceiling_batch": 12, "multiple": 8}, "9"),
        ({"fixed_bytes": 0.0, "per_sample_bytes": 1.0, "model_measure": "rss"}, "'rss'"),
        ({"model_measure": "process_peak"}, "'process_peak'"),  # no model: would do nothing
        ({"extra_bytes": 5.0}, "5.0"),  # no model: would do nothing
        ({"fixed_bytes": 0.0, "per_sample_bytes": 1.0, "extra_bytes": -1.0}, "-1.0"),
        ({"hard_limit_fraction": 0.8}, "0.8"),  # at the target: growth to the fit would be shrunk
        ({"hard_limit_fraction": 1.01}, "1.01"),
        ({"threshold_safe_fraction": 1.0}, "1.0"),
        ({"threshold_expiry_updates": 0}, "0"),
    ],
)
def test_config_rejects_bad_values_quoting_them(overrides, quoted):
    with pytest.raises(GovernorConfigError) as info:
        config(**overrides)
    message = str(info.value)
    assert quoted in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, UsageError)


def test_config_bounds_micro_batch_by_effective_batch_and_multiple():
    cfg = config(ceiling_batch=100, effective_batch=90, multiple=8, min_batch=3)
    assert cfg.upper_batch == 88
    assert cfg.lower_batch == 3
    assert config(ceiling_batch=100, effective_batch=90, multiple=8, min_batch=10).lower_batch == 16


def test_initial_state_starts_at_upper_or_a_legal_start():
    cfg = config(ceiling_batch=64, effective_batch=256, multiple=4)
    assert initial_state(cfg).micro_batch == 64
    assert initial_state(cfg, start_micro_batch=30).micro_batch == 28
    assert initial_state(config(ceiling_batch=64, effective_batch=32), start_micro_batch=64).micro_batch == 32
    with pytest.raises(GovernorConfigError, match="65"):
        initial_state(cfg, start_micro_batch=65)


# --- hysteresis ------------------------------------------------------------------------------


def test_four_calm_observations_do_not_grow_the_fifth_does():
    cfg = config(grow_patience=5)
    state = state_at(cfg, 16, calm_streak=3)
    state, decision = step(cfg, state, CALM)
    assert state.calm_streak == 4 and decision.micro_batch == 16 and not decision.changed
    state, decision = step(cfg, state, CALM)
    assert decision.changed and decision.micro_batch == 32
    assert decision.reason == "calm 5 updates < 0.60: 16 -> 32"
    assert state.calm_streak == 0 and state.cooldown_left == cfg.cooldown_updates


@pytest.mark.parametrize("spike", [MIDDLE, HIGH])
def test_a_mid_streak_spike_resets_the_streak(spike):
    # min_batch 16: the HIGH spike cannot shrink, so only its effect on the streak shows.
    cfg = config(grow_patience=5, min_batch=16)
    state, decision = step(cfg, state_at(cfg, 16, calm_streak=4), spike)
    assert state.calm_streak == 0 and not decision.changed
    for _ in range(4):
        state, decision = step(cfg, state, CALM)
        assert not decision.changed
    state, decision = step(cfg, state, CALM)
    assert decision.changed and decision.micro_batch == 32


def test_a_missing_reading_neither_counts_nor_resets_the_streak():
    cfg = config()
    state, decision = step(cfg, state_at(cfg, 16, calm_streak=4), Observation(pressure=None))
    assert state.calm_streak == 4 and not decision.changed
    assert state.updates == 1


def test_pressure_exactly_at_thresholds_is_neither_calm_nor_high():
    cfg = config()
    state, decision = step(cfg, state_at(cfg, 32, calm_streak=2), Observation(pressure=0.90))
    assert not decision.changed and state.calm_streak == 0
    state, decision = step(cfg, state_at(cfg, 32, calm_streak=2), Observation(pressure=0.60))
    assert state.calm_streak == 0


# --- cooldown --------------------------------------------------------------------------------


def test_cooldown_blocks_a_voluntary_shrink_and_counts_down():
    cfg = config(cooldown_updates=20)
    state, decision = step(cfg, state_at(cfg, 64, cooldown_left=3), HIGH)
    assert not decision.changed and decision.micro_batch == 64
    assert state.cooldown_left == 2 and state.updates == 1


def test_cooldown_blocks_growth_but_the_streak_keeps_counting():
    cfg = config()
    state, decision = step(cfg, state_at(cfg, 16, cooldown_left=1, calm_streak=7), CALM)
    assert not decision.changed and state.calm_streak == 8 and state.cooldown_left == 0
    state, decision = step(cfg, state, CALM)
    assert decision.changed and decision.micro_batch == 32


def test_cooldown_does_not_block_an_oom():
    cfg = config()
    oom = Observation(pressure=None, oom=True, micro_batch=64)
    state, decision = step(cfg, state_at(cfg, 64, cooldown_left=15), oom)
    assert decision.changed and decision.micro_batch == 32 and decision.reason == "oom: 64 -> 32"
    assert state.cooldown_left == cfg.cooldown_updates and state.oom_count == 1
    assert state.updates == 0  # an OOM is not an update


def test_after_a_change_exactly_cooldown_updates_are_blocked():
    cfg = config(cooldown_updates=3)
    state, decision = step(cfg, state_at(cfg, 64), HIGH)
    assert decision.micro_batch == 32
    blocked = 0
    while True:
        state, decision = step(cfg, state, HIGH)
        if decision.changed:
            break
        blocked += 1
    assert blocked == 3 and decision.micro_batch == 16


# --- growth and shrink bounds ----------------------------------------------------------------


@pytest.mark.parametrize("factor, start, expected", [(2.0, 10, 20), (1.5, 10, 15), (1.5, 1, 2), (2.0, 40, 64)])
def test_growth_is_bounded_by_the_factor_and_the_ceiling(factor, start, expected):
    cfg = config(max_grow_factor=factor)
    _, decision = step(cfg, state_at(cfg, start, calm_streak=4), CALM)
    assert decision.micro_batch == expected


def test_no_growth_at_the_upper_bound():
    cfg = config()
    state, decision = step(cfg, state_at(cfg, 64, calm_streak=10), CALM)
    assert not decision.changed and decision.micro_batch == 64 and state.cooldown_left == 0


@pytest.mark.parametrize("start, expected", [(64, 32), (33, 17), (3, 2), (2, 1)])
def test_pressure_shrinks_to_the_shrink_factor(start, expected):
    cfg = config()
    _, decision = step(cfg, state_at(cfg, start), HIGH)
    assert decision.micro_batch == expected
    assert decision.reason == f"pressure 0.95 > 0.90: {start} -> {expected}"


def test_pressure_shrink_factor_is_configurable():
    cfg = config(max_shrink_factor=0.75)
    _, decision = step(cfg, state_at(cfg, 64), HIGH)
    assert decision.micro_batch == 48


def test_pressure_at_min_batch_changes_nothing():
    cfg = config(min_batch=4)
    state, decision = step(cfg, state_at(cfg, 4), HIGH)
    assert not decision.changed and decision.micro_batch == 4 and state.cooldown_left == 0


def test_oom_halves_skipping_patience_and_never_below_min():
    cfg = config(min_batch=2)
    _, decision = step(cfg, state_at(cfg, 3), Observation(pressure=None, oom=True))
    assert decision.micro_batch == 2


def test_oom_at_the_smallest_size_is_exhausted():
    cfg = config()
    state, decision = step(cfg, state_at(cfg, 1), Observation(pressure=None, oom=True, micro_batch=1))
    assert decision.exhausted and not decision.changed and decision.micro_batch == 1
    assert "cannot shrink" in decision.reason and state.oom_count == 1


def test_oom_of_the_remainder_piece_shrinks_from_the_size_that_was_running():
    # effective 100 at 32 runs pieces [32, 32, 32, 4]; the 4 failing must not collapse to 2
    cfg = config(ceiling_batch=100, effective_batch=100)
    state, decision = step(cfg, state_at(cfg, 32), Observation(pressure=None, oom=True, micro_batch=4))
    assert decision.micro_batch == 16 and decision.accumulation_steps == 7 and not decision.exhausted
    assert decision.reason == "oom (a piece of 4): 32 -> 16"
    assert state.threshold_batch == 32


def test_oom_with_running_micro_batch_given_shrinks_from_it():
    cfg = config(ceiling_batch=100, effective_batch=100)
    remainder = Observation(pressure=None, oom=True, micro_batch=4, running_micro_batch=32)
    state, decision = step(cfg, state_at(cfg, 32), remainder)
    assert decision.micro_batch == 16 and state.threshold_batch == 32
    # a restarted process resumed at 64 from an older checkpoint is told 32 died (a full piece)
    killed = Observation(pressure=None, oom=True, micro_batch=32, running_micro_batch=32)
    state, decision = step(cfg, state_at(cfg, 64), killed)
    assert decision.micro_batch == 16 and state.threshold_batch == 32


def test_oom_of_a_remainder_at_the_smallest_size_is_exhausted():
    cfg = config(ceiling_batch=10, effective_batch=10, min_batch=4)
    # [4, 4, 2]: the 2 failed and 4 is the smallest size allowed
    state, decision = step(cfg, state_at(cfg, 4), Observation(pressure=None, oom=True, micro_batch=2))
    assert decision.exhausted and decision.micro_batch == 4 and state.oom_count == 1


def test_a_stale_oom_from_a_larger_size_does_not_shrink_again():
    cfg = config()
    state, decision = step(cfg, state_at(cfg, 32), Observation(pressure=None, oom=True, micro_batch=64))
    assert not decision.changed and not decision.exhausted and decision.micro_batch == 32
    assert state.oom_count == 1 and state.cooldown_left == cfg.cooldown_updates


def test_oom_goes_below_the_factor_only_when_the_model_says_so():
    cfg = config(fixed_bytes=100 * MiB, per_sample_bytes=10 * MiB)
    # room = 0.8 x 1000 - 100 - 100 = 600 MiB -> 60 samples: the model allows more; x0.5 still applies
    roomy = Observation(pressure=None, oom=True, micro_batch=64, limit_bytes=1000 * MiB, used_bytes=100 * MiB)
    assert step(cfg, state_at(cfg, 64), roomy)[1].micro_batch == 32
    # room = 0.8 x 1000 - 400 - 100 = 300 MiB -> 30 samples: just below x0.5
    assert step(cfg, state_at(cfg, 64), dataclasses.replace(roomy, used_bytes=400 * MiB))[1].micro_batch == 30
    # room = 0.8 x 1000 - 600 - 100 = 100 MiB -> 10 samples: well below x0.5
    tight = dataclasses.replace(roomy, used_bytes=600 * MiB)
    _, decision = step(cfg, state_at(cfg, 64), tight)
    assert decision.micro_batch == 10 and decision.reason == "oom: 64 -> 10 (model fits 10)"
    no_model = config()
    assert step(no_model, state_at(no_model, 64), tight)[1].micro_batch == 32


# --- multiples -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "start, observation, expected",
    [
        (16, CALM, 32),  # x2 stays a multiple
        (24, HIGH, 16),  # 12 would break x0.5 when rounded down to 8; round up to 16
        (32, Observation(pressure=None, oom=True), 16),
        (8, HIGH, 4),  # below the multiple any size is allowed
        (3, CALM, 6),  # x2 from 3 = 6 < 8 is legal
    ],
)
def test_sizes_are_multiples_once_at_least_the_multiple(start, observation, expected):
    cfg = config(multiple=8, grow_patience=1)
    _, decision = step(cfg, state_at(cfg, start), observation)
    assert decision.micro_batch == expected


def test_growth_takes_one_legal_step_when_the_factor_rounds_to_nothing():
    cfg = config(multiple=8, max_grow_factor=1.5, grow_patience=1)
    _, decision = step(cfg, state_at(cfg, 8), CALM)
    assert decision.micro_batch == 16


def test_shrink_takes_one_legal_step_when_the_factor_rounds_to_nothing():
    cfg = config(multiple=8, max_shrink_factor=0.9)
    _, decision = step(cfg, state_at(cfg, 16), HIGH)
    assert decision.micro_batch == 8


# --- effective batch, accumulation, learning rate ---------------------------------------------


@pytest.mark.parametrize("micro_batch, accumulation", [(64, 2), (48, 3), (32, 4), (7, 19), (1, 128)])
def test_fixed_mode_keeps_effective_batch_and_accumulates_ceil(micro_batch, accumulation):
    cfg = config(ceiling_batch=64, effective_batch=128)
    decision = decision_for(cfg, state_at(cfg, micro_batch))
    assert decision.effective_batch == 128
    assert decision.accumulation_steps == accumulation == math.ceil(128 / micro_batch)
    assert decision.lr_scale == 1.0


@pytest.mark.parametrize(
    "micro_batch, effective, accumulation",
    [(64, 64, 1), (40, 40, 1), (16, 16, 1), (10, 16, 2), (5, 16, 4), (1, 16, 16)],
)
def test_elastic_mode_follows_micro_batch_above_floor_and_accumulates_below(micro_batch, effective, accumulation):
    cfg = config(ceiling_batch=64, effective_batch=64, mode="elastic", elastic_floor_batch=16)
    decision = decision_for(cfg, state_at(cfg, micro_batch))
    assert (decision.effective_batch, decision.accumulation_steps) == (effective, accumulation)


def test_elastic_mode_without_floor_never_accumulates():
    cfg = config(mode="elastic")
    decision = decision_for(cfg, state_at(cfg, 3))
    assert (decision.effective_batch, decision.accumulation_steps) == (3, 1)


@pytest.mark.parametrize("scaling, micro_batch, expected", [
    ("none", 16, 1.0), ("linear", 16, 0.25), ("sqrt", 16, 0.5), ("linear", 64, 1.0), ("sqrt", 4, 0.5),
])
def test_elastic_lr_scale(scaling, micro_batch, expected):
    cfg = config(mode="elastic", elastic_floor_batch=16, lr_scaling=scaling)
    assert decision_for(cfg, state_at(cfg, micro_batch)).lr_scale == pytest.approx(expected)


def test_lr_scale_follows_a_shrink_in_elastic_mode():
    cfg = config(mode="elastic", lr_scaling="linear")
    _, decision = step(cfg, state_at(cfg, 64), HIGH)
    assert (decision.micro_batch, decision.effective_batch, decision.lr_scale) == (32, 32, 0.5)


# --- the OOM threshold (TCP's ssthresh) ------------------------------------------------------


def test_oom_sets_the_threshold_and_an_oom_cooldown():
    cfg = config()
    state, decision = step(cfg, state_at(cfg, 64, threshold_calm_updates=9), Observation(pressure=None, oom=True))
    assert decision.micro_batch == 32
    assert state.threshold_batch == 64 and state.threshold_calm_updates == 0
    assert state.oom_cooldown and state.cooldown_left == cfg.cooldown_updates


def test_a_later_oom_keeps_the_lower_threshold():
    cfg = config()
    state, _ = step(cfg, state_at(cfg, 40, threshold_batch=48), Observation(pressure=None, oom=True))
    assert state.threshold_batch == 40
    # a stale report from above (a restart resumed lower) only lowers it when it is lower
    state, decision = step(cfg, state_at(cfg, 16, threshold_batch=40), Observation(pressure=None, oom=True,
                                                                                   micro_batch=56))
    assert not decision.changed and state.threshold_batch == 40 and state.oom_count == 1


def test_a_stale_oom_sets_a_threshold_when_there_is_none():
    cfg = config()
    state, decision = step(cfg, state_at(cfg, 32), Observation(pressure=None, oom=True, micro_batch=64))
    assert not decision.changed and state.threshold_batch == 64


def test_calm_in_an_oom_cooldown_does_not_count():
    cfg = config()
    state = state_at(cfg, 32, cooldown_left=5, oom_cooldown=True, calm_streak=0, threshold_batch=64)
    state, decision = step(cfg, state, CALM)
    assert state.calm_streak == 0 and state.cooldown_left == 4 and state.oom_cooldown
    assert state.threshold_calm_updates == 0


def test_the_oom_cooldown_ends_with_the_cooldown():
    cfg = config()
    state, _ = step(cfg, state_at(cfg, 32, cooldown_left=1, oom_cooldown=True, threshold_batch=64), CALM)
    assert state.cooldown_left == 0 and not state.oom_cooldown and state.calm_streak == 0
    state, _ = step(cfg, state, CALM)
    assert state.calm_streak == 1 and state.threshold_calm_updates == 1


def test_calm_in_a_pressure_cooldown_still_counts():
    cfg = config()
    state, _ = step(cfg, state_at(cfg, 32, cooldown_left=5, calm_streak=2), CALM)
    assert state.calm_streak == 3


@pytest.mark.parametrize(
    "current, threshold, expected",
    [
        (8, 64, 16),  # far below the safe point 48: x2
        (32, 64, 48),  # x2 would pass the safe point: capped at it
        (48, 64, 49),  # at the safe point: one step
        (60, 64, 61),
        (63, 64, 63),  # one step would reach the threshold: no growth
        (30, 41, 31),  # safe point floor(41 x 0.75) = 30
    ],
)
def test_growth_under_a_threshold(current, threshold, expected):
    cfg = config()
    state, decision = step(cfg, state_at(cfg, current, calm_streak=4, threshold_batch=threshold), CALM)
    assert decision.micro_batch == expected and decision.changed is (expected != current)
    if expected == current:
        assert state.calm_streak == 5, "nothing higher allowed: the streak keeps counting"
    else:
        assert decision.reason.endswith(f"(oom threshold {threshold})")


def test_additive_growth_takes_one_legal_step_with_a_multiple():
    cfg = config(multiple=8)
    _, decision = step(cfg, state_at(cfg, 48, calm_streak=4, threshold_batch=64), CALM)
    assert decision.micro_batch == 56
    _, decision = step(cfg, state_at(cfg, 56, calm_streak=4, threshold_batch=64), CALM)
    assert not decision.changed


def test_the_threshold_is_raised_after_enough_calm_updates_and_then_forgotten():
    cfg = config(threshold_expiry_updates=10)
    state = state_at(cfg, 39, threshold_batch=40, threshold_calm_updates=9)
    state, _ = step(cfg, state, CALM)
    assert state.threshold_batch == 54 and state.threshold_calm_updates == 0  # ceil(40 / 0.75)
    state, _ = step(cfg, dataclasses.replace(state, threshold_batch=60, threshold_calm_updates=9), CALM)
    assert state.threshold_batch is None  # 80 > upper 64: nothing left to protect


def test_only_calm_readings_count_towards_expiry():
    cfg = config()
    state = state_at(cfg, 32, threshold_batch=40, threshold_calm_updates=3)
    for observation, expected in ((MIDDLE, 3), (Observation(pressure=None), 3), (CALM, 4)):
        state, _ = step(cfg, state, observation)
        assert state.threshold_calm_updates == expected


# --- state serialisation ------------------------------------------------------------------------


def test_state_round_trips_through_json():
    state = GovernorState(
        micro_batch=24, calm_streak=2, cooldown_left=7, updates=130,
        recent_step_seconds=((24, 0.31), (24, 0.29)), oom_count=1, last_reason="oom: 48 -> 24",
    )
    restored = GovernorState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state


@pytest.mark.parametrize(
    "key, value", [("micro_batch", 0), ("updates", -1), ("calm_streak", 1.5), ("recent_step_seconds", [[3]]),
                   ("last_reason", None)]
)
def test_state_from_dict_rejects_malformed_values(key, value):
    data = initial_state(config()).to_dict()
    data[key] = value
    with pytest.raises(ValueError, match=key):
        GovernorState.from_dict(data)


def test_state_round_trips_a_threshold_through_json():
    state = dataclasses.replace(initial_state(config()), threshold_batch=41, threshold_calm_updates=17,
                                oom_cooldown=True, cooldown_left=3)
    assert GovernorState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_state_from_dict_loads_a_state_saved_before_the_threshold():
    data = initial_state(config()).to_dict()
    for key in ("threshold_batch", "threshold_calm_updates", "oom_cooldown"):
        del data[key]
    state = GovernorState.from_dict(data)
    assert state.threshold_batch is None and state.threshold_calm_updates == 0 and not state.oom_cooldown


@pytest.mark.parametrize("key, value", [("threshold_batch", 0), ("threshold_batch", "40"),
                                        ("threshold_calm_updates", -2), ("oom_cooldown", 1)])
def test_state_from_dict_rejects_a_malformed_threshold(key, value):
    data = initial_state(config()).to_dict()
    data[key] = value
    with pytest.raises(ValueError, match=key):
        GovernorState.from_dict(data)


def test_state_from_dict_names_missing_keys():
    data = initial_state(config()).to_dict()
    del data["oom_count"]
    with pytest.raises(ValueError, match="oom_count"):
        GovernorState.from_dict(data)


def test_observation_rejects_bad_values():
    with pytest.raises(ValueError, match="-0.1"):
        Observation(pressure=-0.1)
    with pytest.raises(ValueError, match="0"):
        Observation(pressure=None, micro_batch=0)
    with pytest.raises(ValueError, match="'rss'"):
        Observation(pressure=None, measure="rss")
    with pytest.raises(ValueError, match="running_micro_batch"):
        Observation(pressure=None, oom=True, running_micro_batch=0)
