"""The statistical batch policy, one update at a time (governor/policy.py's test style): build the
state of interest, apply one update's statistics, assert the decision's fields by name."""

import dataclasses
import math

import pytest

from edgebatch.adapt.policy import (
    AdaptConfig,
    AdaptConfigError,
    AdaptState,
    AdaptStats,
    decide,
    initial_state,
    micro_plan,
)
from edgebatch.errors import UsageError

MEMORY_MICRO = 1024  # the governor allows more than any batch below: memory is not the limit


def config(**overrides):
    # The direction rule at the seed's thresholds (off in AdaptConfig's defaults), to test it.
    settings = {"check_every_updates": 1, "cooldown_updates": 0, "lr_rule": "none",
                "grow_above_cosine": 0.8, "shrink_below_cosine": 0.3}
    settings.update(overrides)
    return AdaptConfig(**settings)


def at(cfg, effective, **fields):
    return dataclasses.replace(initial_state(cfg, effective), **fields)


NOTHING = AdaptStats()


# --- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, quoted",
    [
        ({"min_effective_batch_samples": 0}, "0"),
        ({"max_effective_batch_samples": 4, "min_effective_batch_samples": 8}, "4"),
        ({"check_every_updates": 0}, "0"),
        ({"cooldown_updates": -1}, "-1"),
        ({"cooldown_updates": 2.5}, "2.5"),
        ({"max_grow_factor": 1.0}, "1.0"),
        ({"max_shrink_factor": 1.0}, "1.0"),
        ({"max_shrink_factor": 0.0}, "0.0"),
        ({"grow_above_cosine": 0.2, "shrink_below_cosine": 0.3}, "0.2"),  # below the shrink bound
        ({"shrink_below_cosine": float("nan")}, "nan"),
        ({"noise_cap_factor": 0.0}, "0.0"),
        ({"schedule_decay_ratio": 1.0}, "1.0"),
        ({"lr_rule": "cubic"}, "'cubic'"),
        ({"noise_ema_decay": 1.0}, "1.0"),
        ({"cosine_window_updates": 0}, "0"),
        ({"plateau_relative_tolerance": 0.0}, "0.0"),
        ({"drift_quantile": 1.5}, "1.5"),
        ({"min_pieces_per_update": 0}, "0"),
    ],
)
def test_config_rejects_bad_values_quoting_them(overrides, quoted):
    with pytest.raises(AdaptConfigError) as info:
        config(**overrides)
    assert quoted in str(info.value)
    assert isinstance(info.value, UsageError) and isinstance(info.value, ValueError)


def test_seed_defaults():
    cfg = AdaptConfig()
    assert (cfg.check_every_updates, cfg.cooldown_updates, cfg.max_grow_factor, cfg.max_shrink_factor) == (
        50, 200, 1.5, 0.5)
    assert (cfg.grow_above_cosine, cfg.shrink_below_cosine) == (None, None)  # off: see AdaptConfig
    seed = AdaptConfig.seed_rules(check_every_updates=7)
    assert (seed.grow_above_cosine, seed.shrink_below_cosine, seed.lr_rule) == (0.8, 0.3, "inverse_sqrt")
    assert seed.check_every_updates == 7 and seed.cooldown_updates == 200
    assert cfg.lr_rule == "sqrt"


def test_with_the_direction_rule_off_no_cosine_moves_the_batch():
    cfg = config(noise_cap_factor=None, grow_below_noise_fraction=None, schedule_decay_ratio=None,
                 grow_above_cosine=None, shrink_below_cosine=None)
    for cosine in (-0.9, 0.0, 0.99):
        _, decision = decide(cfg, initial_state(cfg, 16), AdaptStats(mean_cosine=cosine), MEMORY_MICRO)
        assert not decision.changed


def test_initial_state_clamps_into_the_range():
    cfg = config(min_effective_batch_samples=16, max_effective_batch_samples=256)
    assert initial_state(cfg, 4).effective_batch_samples == 16
    assert initial_state(cfg, 1000).base_effective_batch_samples == 256
    with pytest.raises(AdaptConfigError, match="0"):
        initial_state(cfg, 0)


# --- each trigger on constructed statistics ------------------------------------------------------


@pytest.mark.parametrize(
    "stats, effective, reason_start",
    [
        (AdaptStats(drift=True), 50, "drift"),
        (AdaptStats(mean_cosine=0.29), 50, "mean cosine 0.29 < 0.30"),
        (AdaptStats(mean_cosine=0.81), 150, "mean cosine 0.81 > 0.80"),
        (AdaptStats(plateau=True), 150, "loss plateau"),
        (AdaptStats(schedule_lr_ratio=0.5), 150, "schedule decayed the rate to 0.50x"),
        (AdaptStats(noise_scale_samples=500.0), 150, "batch 100 < 0.5 x noise scale 500"),
        # Disagreeing statistics: shrinking wins.
        (AdaptStats(drift=True, mean_cosine=0.95, plateau=True), 50, "drift"),
        (AdaptStats(mean_cosine=0.1, plateau=True), 50, "mean cosine 0.10"),
    ],
)
def test_each_trigger_moves_the_batch_by_its_bound(stats, effective, reason_start):
    cfg = config()
    state, decision = decide(cfg, at(cfg, 100), stats, MEMORY_MICRO)
    assert decision.changed
    assert decision.effective_batch_samples == state.effective_batch_samples == effective
    assert decision.reason.startswith(reason_start)
    assert decision.reason.endswith(f"100 -> {effective}")
    assert state.last_reason == decision.reason and state.changes == 1


@pytest.mark.parametrize(
    "stats",
    [
        NOTHING,
        AdaptStats(mean_cosine=0.5),  # between the thresholds
        AdaptStats(mean_cosine=0.3),  # the thresholds are strict
        AdaptStats(mean_cosine=0.8),
        AdaptStats(schedule_lr_ratio=0.9),  # decayed, but not by a growth step yet
        AdaptStats(noise_scale_samples=150.0),  # 100 is not below half of it
    ],
)
def test_quiet_statistics_change_nothing(stats):
    cfg = config()
    state, decision = decide(cfg, at(cfg, 100), stats, MEMORY_MICRO)
    assert not decision.changed and decision.reason == "" and decision.blocked == ""
    assert state.effective_batch_samples == 100 and state.updates == 1


def test_schedule_decay_grows_by_the_decay_it_replaces_within_the_bound():
    cfg = config(schedule_decay_ratio=0.9)
    _, decision = decide(cfg, at(cfg, 100), AdaptStats(schedule_lr_ratio=0.8), MEMORY_MICRO)
    assert decision.effective_batch_samples == 125  # 100 / 0.8, under the x1.5 bound
    _, decision = decide(cfg, at(cfg, 100), AdaptStats(schedule_lr_ratio=0.1), MEMORY_MICRO)
    assert decision.effective_batch_samples == 150


def test_disabled_triggers_do_not_fire():
    cfg = config(schedule_decay_ratio=None, grow_below_noise_fraction=None)
    stats = AdaptStats(schedule_lr_ratio=0.1, noise_scale_samples=1e6)
    _, decision = decide(cfg, at(cfg, 100), stats, MEMORY_MICRO)
    assert not decision.changed


# --- bounds and the noise-scale cap -----------------------------------------------------------------


@pytest.mark.parametrize(
    "effective, stats, overrides, expected, blocked",
    [
        (1, AdaptStats(plateau=True), {}, 2, ""),  # x1.5 of 1 rounds to 1: one example up
        (3, AdaptStats(drift=True), {}, 2, ""),  # ceil(1.5) = 2
        (2, AdaptStats(drift=True), {}, 1, ""),
        (1, AdaptStats(drift=True), {}, 1, "drift: hard examples rising: at min_effective_batch_samples 1"),
        (16, AdaptStats(drift=True), {"min_effective_batch_samples": 12}, 12, ""),
        (100, AdaptStats(plateau=True), {"max_effective_batch_samples": 120}, 120, ""),
        (120, AdaptStats(plateau=True), {"max_effective_batch_samples": 120}, 120,
         "loss plateau: at max_effective_batch_samples 120"),
        # Growth capped near the noise scale (cap factor 1 by default).
        (100, AdaptStats(plateau=True, noise_scale_samples=130.0), {}, 130, ""),
        (100, AdaptStats(plateau=True, noise_scale_samples=130.0), {"noise_cap_factor": 2.0}, 150, ""),
        (130, AdaptStats(mean_cosine=0.9, noise_scale_samples=130.4), {}, 130,
         "mean cosine 0.90 > 0.80: at the noise-scale cap 1 x 130"),
        (200, AdaptStats(plateau=True, noise_scale_samples=100.0), {}, 200,
         "loss plateau: at the noise-scale cap 1 x 100"),
        (100, AdaptStats(plateau=True, noise_scale_samples=1e9), {"noise_cap_factor": None}, 150, ""),
        # The cap never shrinks: a batch above the noise scale shrinks only on a shrink trigger.
        (200, AdaptStats(noise_scale_samples=100.0), {}, 200, ""),
        (100, AdaptStats(plateau=True), {"max_grow_factor": 3.0}, 300, ""),
        (100, AdaptStats(drift=True), {"max_shrink_factor": 0.9}, 90, ""),
    ],
)
def test_changes_are_bounded(effective, stats, overrides, expected, blocked):
    cfg = config(**overrides)
    state, decision = decide(cfg, at(cfg, effective), stats, MEMORY_MICRO)
    assert decision.effective_batch_samples == state.effective_batch_samples == expected
    assert decision.changed is (expected != effective)
    assert decision.blocked == blocked


# --- checks and the cooldown ---------------------------------------------------------------------------


def test_triggers_are_only_evaluated_every_check_every_updates():
    cfg = config(check_every_updates=3)
    state = initial_state(cfg, 100)
    changes = []
    for _ in range(6):
        state, decision = decide(cfg, state, AdaptStats(mean_cosine=0.9, noise_scale_samples=1e9), MEMORY_MICRO)
        changes.append(decision.effective_batch_samples)
    assert changes == [100, 100, 150, 150, 150, 225]
    assert state.updates == 6


def test_a_change_starts_the_cooldown_and_nothing_changes_until_it_ends():
    cfg = config(cooldown_updates=200, check_every_updates=50)
    state = at(cfg, 100, updates_since_check=49)
    state, decision = decide(cfg, state, AdaptStats(plateau=True), MEMORY_MICRO)
    assert decision.effective_batch_samples == 150
    assert state.cooldown_left_updates == 200
    for _ in range(200):
        # Even the strongest shrink trigger waits.
        state, decision = decide(cfg, state, AdaptStats(drift=True), MEMORY_MICRO)
        assert not decision.changed and decision.effective_batch_samples == 150
    assert state.cooldown_left_updates == 0
    state, decision = decide(cfg, state, AdaptStats(drift=True), MEMORY_MICRO)
    assert decision.changed and decision.effective_batch_samples == 75
    assert state.updates == 202 and state.changes == 2


def test_a_check_that_changes_nothing_starts_no_cooldown():
    cfg = config(cooldown_updates=200, check_every_updates=2)
    state = at(cfg, 100)
    state, _ = decide(cfg, state, NOTHING, MEMORY_MICRO)
    state, decision = decide(cfg, state, NOTHING, MEMORY_MICRO)  # a check: nothing fires
    assert state.cooldown_left_updates == 0 and state.updates_since_check == 0
    state, _ = decide(cfg, state, AdaptStats(plateau=True), MEMORY_MICRO)
    state, decision = decide(cfg, state, AdaptStats(plateau=True), MEMORY_MICRO)
    assert decision.changed and state.cooldown_left_updates == 200


# --- composition with the memory governor ------------------------------------------------------------


@pytest.mark.parametrize(
    "effective, memory_micro, micro, steps",
    [
        (100, 1024, 100, 1),
        (100, 32, 32, 4),  # 32 + 32 + 32 + 4
        (96, 32, 32, 3),
        (150, 1, 1, 150),
    ],
)
def test_micro_plan_reaches_the_effective_batch_by_accumulation(effective, memory_micro, micro, steps):
    assert micro_plan(effective, memory_micro) == (micro, steps)
    assert micro * steps >= effective > micro * (steps - 1)


def test_the_micro_batch_never_exceeds_the_memory_governors():
    cfg = config()
    state = at(cfg, 100)
    for memory_micro, stats in [(64, AdaptStats(plateau=True)), (16, NOTHING), (48, AdaptStats(mean_cosine=0.9))]:
        state, decision = decide(cfg, state, stats, memory_micro)
        assert decision.micro_batch_samples <= memory_micro
        assert decision.micro_batch_samples * decision.accumulation_steps >= decision.effective_batch_samples
    assert (decision.effective_batch_samples, decision.micro_batch_samples, decision.accumulation_steps) == (225, 48, 5)


def test_a_new_memory_ceiling_changes_the_plan_at_once_even_in_cooldown():
    cfg = config(cooldown_updates=10)
    state = at(cfg, 96, cooldown_left_updates=5)
    _, decision = decide(cfg, state, NOTHING, 24)
    assert (decision.micro_batch_samples, decision.accumulation_steps, decision.changed) == (24, 4, False)


# --- LR coupling in the decision ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule, scale",
    [("none", 1.0), ("linear", 1.5), ("sqrt", math.sqrt(1.5)), ("inverse_sqrt", math.sqrt(1 / 1.5))],
)
def test_decision_lr_scale_follows_the_rule_from_the_base_batch(rule, scale):
    cfg = config(lr_rule=rule)
    state, decision = decide(cfg, at(cfg, 100), AdaptStats(plateau=True), MEMORY_MICRO)
    assert decision.lr_scale == pytest.approx(scale)
    # Path independent: 100 -> 150 -> 75 is scale(75 / 100), not a compounded product of roundings.
    state, decision = decide(cfg, state, AdaptStats(drift=True), MEMORY_MICRO)
    assert decision.effective_batch_samples == 75
    assert decision.lr_scale == pytest.approx({"none": 1.0, "linear": 0.75, "sqrt": math.sqrt(0.75),
                                               "inverse_sqrt": math.sqrt(1 / 0.75)}[rule])


def test_state_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        initial_state(config(), 8).updates = 3  # type: ignore[misc]
    assert isinstance(initial_state(config(), 8), AdaptState)


def test_importing_the_package_imports_no_tensorflow():
    import subprocess
    import sys

    code = "import sys, edgebatch.adapt; print('tensorflow' in sys.modules or 'keras' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
