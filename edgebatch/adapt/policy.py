"""The statistical batch policy: `decide(config, state, stats, memory_micro_batch_samples)`. Pure.

The memory governor (edgebatch/governor/policy.py) says how large a micro-batch *can* be; this
policy says how large the effective batch (examples per optimizer update) *should* be, from the
training statistics of signals.py. The two compose: the effective batch is reached by
accumulation, micro = min(memory_micro_batch_samples, effective) and
accumulation_steps = ceil(effective / micro), so a micro-batch never exceeds the governor's
decision whatever the effective batch is. Plain values in and out, no TensorFlow.

One call per optimizer update; the triggers are evaluated only on a check (`is_check`), in the
order `_trigger` gives, and a change is bounded as `decide` says. The LR multiplier follows the
effective batch (`_decision`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from edgebatch.adapt.goodput import MEASURED, StepCurve
from edgebatch.adapt.lr_coupling import LR_RULES, lr_scale
from edgebatch.errors import UsageError

#: "noise_scale": grow while the batch is under the noise scale (trigger 6 of `_trigger`);
#: "goodput": move to the batch of highest predicted goodput (adapt/goodput.py) instead.
POLICIES = ("noise_scale", "goodput")

__all__ = [
    "POLICIES",
    "AdaptConfig",
    "AdaptConfigError",
    "AdaptDecision",
    "AdaptState",
    "AdaptStats",
    "decide",
    "initial_state",
    "is_check",
    "micro_plan",
]


class AdaptConfigError(UsageError, ValueError):
    """An adaptive-batch setting is out of range (a UsageError that is also a ValueError)."""


def _integer(owner: object, name: str, minimum: int, optional: bool = False) -> None:
    value = getattr(owner, name)
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise AdaptConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    object.__setattr__(owner, name, int(value))


def _real(owner: object, name: str, low: float, high: float, optional: bool = False) -> None:
    """A finite number in the open interval (low, high)."""
    value = getattr(owner, name)
    if optional and value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or not low < value < high
    ):
        raise AdaptConfigError(f"{name} must be a finite number in ({low}, {high}), got {value!r}")
    object.__setattr__(owner, name, float(value))


@dataclass(frozen=True)
class AdaptConfig:
    """How the statistical policy sizes the effective batch. Checked on construction.

    Sizes are in examples (`_samples`), times in optimizer updates (`_updates`). The seed's timing
    and bounds are the defaults: checks every 50 updates, >= 200 updates between changes, x1.5 up,
    x0.5 down. The seed's direction rule (mean cosine > 0.8 grows, < 0.3 shrinks) is OFF by
    default (None): between consecutive small-batch updates the cosine sits near 0-0.3 because
    noise dominates, so the rule shrinks the batch, which lowers the cosine further, down to
    min_effective_batch_samples (every seed-rules run in BENCHMARKS.md section 7 ends at batch 1).
    Noise-scale theory says the opposite (low agreement: below the noise scale: grow), which the
    noise trigger already does. `AdaptConfig.seed_rules()` turns the seed's rules back on to
    reproduce it.

    `policy="goodput"` replaces the noise-scale growth rule with the batch of highest predicted
    goodput (throughput x statistical efficiency, adapt/goodput.py) on the device's measured curve,
    `throughput` (e.g. `StepCurve.from_profile(profile)`, or "measured": learned from fit's own step
    times, goodput.MeasuredSteps); drift, plateau and schedule still fire first, and a change stays
    within the growth and shrink bounds.
    """

    min_effective_batch_samples: int = 1
    max_effective_batch_samples: int = 65536
    check_every_updates: int = 50
    cooldown_updates: int = 200
    max_grow_factor: float = 1.5
    max_shrink_factor: float = 0.5
    grow_above_cosine: float | None = None  # None: agreement never triggers growth (the seed: 0.8)
    shrink_below_cosine: float | None = None  # None: disagreement never shrinks (the seed: 0.3)
    noise_cap_factor: float | None = 1.0  # None: no cap from the noise scale
    grow_below_noise_fraction: float | None = 0.5  # None: the noise scale never triggers growth
    schedule_decay_ratio: float | None = 2.0 / 3.0  # None: the schedule never triggers growth
    lr_rule: str = "sqrt"
    # How the signals are measured (controller.py; the pure `decide` ignores these).
    noise_ema_decay: float = 0.99  # weight kept of the past in the noise-scale EMAs
    cosine_window_updates: int = 10  # consecutive-update cosines averaged
    plateau_checks: int = 5  # the seed's "over 5 checks"
    plateau_relative_tolerance: float = 1e-3  # the seed's |dL|/L < 0.001
    drift_quantile: float = 0.9  # "hard" = above this quantile of earlier losses
    drift_rise: float = 0.1  # drift when the hard share exceeds (1 - quantile) + rise
    drift_recent_examples: int = 256  # the recent window of per-example losses (signals.DriftState)
    drift_reference_examples: int = 1024  # the window before it, whose quantile defines "hard"
    min_pieces_per_update: int = 2  # split every update at least this often: the two-batch pair
    policy: str = "noise_scale"  # POLICIES
    # samples/s by micro-batch: what policy="goodput" predicts with; "measured": from fit's step times
    throughput: StepCurve | str | None = None

    @classmethod
    def seed_rules(cls, **overrides) -> "AdaptConfig":
        """The seed's policy: the direction rule on (mean cosine > 0.8 grows, < 0.3 shrinks) and its
        inverse LR rule (LR x sqrt(B_old / B_new)); other settings as given or the defaults."""
        settings = {"grow_above_cosine": 0.8, "shrink_below_cosine": 0.3, "lr_rule": "inverse_sqrt"}
        settings.update(overrides)
        return cls(**settings)

    def __post_init__(self) -> None:
        _integer(self, "min_effective_batch_samples", 1)
        _integer(self, "max_effective_batch_samples", 1)
        if self.max_effective_batch_samples < self.min_effective_batch_samples:
            raise AdaptConfigError(
                f"max_effective_batch_samples {self.max_effective_batch_samples} < "
                f"min_effective_batch_samples {self.min_effective_batch_samples}"
            )
        _integer(self, "check_every_updates", 1)
        _integer(self, "cooldown_updates", 0)
        _real(self, "max_grow_factor", 1.0, math.inf)
        _real(self, "max_shrink_factor", 0.0, 1.0)
        _real(self, "shrink_below_cosine", -1.0, 1.0, optional=True)
        low = -1.0 if self.shrink_below_cosine is None else self.shrink_below_cosine
        _real(self, "grow_above_cosine", low, 1.0, optional=True)
        _real(self, "noise_cap_factor", 0.0, math.inf, optional=True)
        _real(self, "grow_below_noise_fraction", 0.0, math.inf, optional=True)
        _real(self, "schedule_decay_ratio", 0.0, 1.0, optional=True)
        if self.lr_rule not in LR_RULES:
            raise AdaptConfigError(f"lr_rule must be one of {LR_RULES}, got {self.lr_rule!r}")
        _real(self, "noise_ema_decay", 0.0, 1.0)
        _integer(self, "cosine_window_updates", 1)
        _integer(self, "plateau_checks", 1)
        _real(self, "plateau_relative_tolerance", 0.0, math.inf)
        _real(self, "drift_quantile", 0.0, 1.0)
        _real(self, "drift_rise", 0.0, 1.0)
        _integer(self, "drift_recent_examples", 1)
        _integer(self, "drift_reference_examples", 1)
        _integer(self, "min_pieces_per_update", 1)
        if self.policy not in POLICIES:
            raise AdaptConfigError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.throughput is not None and not (isinstance(self.throughput, StepCurve) or self.throughput == MEASURED):
            raise AdaptConfigError(f"throughput must be an edgebatch.adapt.goodput.StepCurve or {MEASURED!r}, "
                                   f"got {self.throughput!r}")
        if self.policy == "goodput" and self.throughput is None:
            raise AdaptConfigError(
                "policy='goodput' needs a throughput source: throughput=StepCurve.from_profile(profile) "
                f"(a probe's samples/s by batch), StepCurve.from_points([(batch, samples_per_second), ...]) or "
                f"{MEASURED!r} (the run's own step times)"
            )


@dataclass(frozen=True)
class AdaptStats:
    """What the signals say at this update; None / False: not measured or not firing."""

    noise_scale_samples: float | None = None  # B_simple (signals.noise_scale_samples)
    mean_cosine: float | None = None  # signals.mean_agreement over the window
    plateau: bool = False  # signals.is_plateau
    schedule_lr_ratio: float | None = None  # schedule rate now / at the last change
    drift: bool = False  # signals.drift_detected
    goodput_batch_samples: int | None = None  # policy="goodput": the batch goodput.best_batch chose
    goodput_note: str = ""  # and what it predicts there (GoodputChoice.describe)


@dataclass(frozen=True)
class AdaptState:
    """What the policy remembers between updates."""

    effective_batch_samples: int
    base_effective_batch_samples: int  # the batch the learning rate was tuned for
    updates: int = 0
    updates_since_check: int = 0
    cooldown_left_updates: int = 0
    changes: int = 0
    last_reason: str = ""


@dataclass(frozen=True)
class AdaptDecision:
    """What to run next: `micro_batch_samples` x `accumulation_steps` covers `effective_batch_samples`
    (the last micro-batch may be partial); `reason` says why it changed ("" when it did not);
    `blocked` why a trigger that fired changed nothing (at a bound or cap)."""

    effective_batch_samples: int
    micro_batch_samples: int
    accumulation_steps: int
    lr_scale: float
    changed: bool
    reason: str = ""
    blocked: str = ""


def initial_state(config: AdaptConfig, effective_batch_samples: int) -> AdaptState:
    """Start at `effective_batch_samples` (clamped into the config's range); the LR base is that size."""
    if isinstance(effective_batch_samples, bool) or not isinstance(effective_batch_samples, numbers.Integral) \
            or effective_batch_samples < 1:
        raise AdaptConfigError(f"effective_batch_samples must be a positive integer, got {effective_batch_samples!r}")
    start = min(max(int(effective_batch_samples), config.min_effective_batch_samples),
                config.max_effective_batch_samples)
    return AdaptState(effective_batch_samples=start, base_effective_batch_samples=start)


def micro_plan(effective_batch_samples: int, memory_micro_batch_samples: int) -> tuple[int, int]:
    """(micro, accumulation_steps): micro = min(memory's micro, effective), steps = ceil(effective / micro)."""
    if memory_micro_batch_samples < 1:
        raise AdaptConfigError(f"memory_micro_batch_samples must be >= 1, got {memory_micro_batch_samples!r}")
    micro = min(int(memory_micro_batch_samples), effective_batch_samples)
    return micro, math.ceil(effective_batch_samples / micro)


def is_check(config: AdaptConfig, state: AdaptState) -> bool:
    """Whether the next `decide` call from `state` evaluates the triggers.

    `updates` advances and the cooldown counts down on every call; a check is the first update with
    no cooldown left once at least `check_every_updates` updates have passed since the previous
    check (or the start), this update included. Between checks, and on a check that changes
    nothing, the effective batch is unchanged (the micro-batch and accumulation still follow a new
    memory ceiling at once).
    """
    return state.cooldown_left_updates <= 0 and state.updates_since_check + 1 >= config.check_every_updates


def decide(
    config: AdaptConfig, state: AdaptState, stats: AdaptStats, memory_micro_batch_samples: int
) -> tuple[AdaptState, AdaptDecision]:
    """Account one optimizer update; on a check, apply the triggers (`_trigger`).

    Bounds on a change: growth to at most floor(current x max_grow_factor) (at least +1), shrinking
    to at least ceil(current x max_shrink_factor) (at least -1); growth is also capped at
    noise_cap_factor x B_simple when the noise scale is known (a growth the cap forbids is no
    change, its reason kept in Decision.blocked), and everything stays in
    [min_effective_batch_samples, max_effective_batch_samples]. A change starts the cooldown
    (`cooldown_updates`, the seed's at least 200) and resets the check count.
    """
    cooldown_left = max(0, state.cooldown_left_updates - 1)
    since_check = state.updates_since_check + 1
    new_state = replace(state, updates=state.updates + 1, cooldown_left_updates=cooldown_left,
                        updates_since_check=since_check)
    current = state.effective_batch_samples
    if not is_check(config, state):
        return new_state, _decision(config, new_state, memory_micro_batch_samples, changed=False)
    new_state = replace(new_state, updates_since_check=0)
    direction, why, wanted_factor = _trigger(config, stats, current)
    if direction == 0:
        return new_state, _decision(config, new_state, memory_micro_batch_samples, changed=False)
    if direction < 0:
        bound = min(math.ceil(current * config.max_shrink_factor), current - 1)
        target = max(bound, config.min_effective_batch_samples, math.ceil(current * wanted_factor - 1e-9))
    else:
        target = _grow_target(config, current, wanted_factor, stats.noise_scale_samples)
    if target == current:
        limit = _limit_note(config, current, direction, stats.noise_scale_samples)
        return new_state, _decision(config, new_state, memory_micro_batch_samples, changed=False,
                                    blocked=f"{why}: {limit}")
    reason = f"{why}: {current} -> {target}"
    new_state = replace(new_state, effective_batch_samples=target, cooldown_left_updates=config.cooldown_updates,
                        changes=state.changes + 1, last_reason=reason)
    return new_state, _decision(config, new_state, memory_micro_batch_samples, changed=True, reason=reason)


def _trigger(config: AdaptConfig, stats: AdaptStats, current: int) -> tuple[int, str, float]:
    """(-1 shrink / 0 nothing / +1 grow, why, wanted growth factor before the bound).

    The first trigger that fires decides; shrinking wins over growing, the safe side when the
    statistics disagree:
    1. drift (stats.drift True): shrink;
    2. direction disagreement: stats.mean_cosine < shrink_below_cosine: shrink;
    3. direction agreement: stats.mean_cosine > grow_above_cosine: grow;
    4. loss plateau (stats.plateau True): grow;
    5. schedule decay (Smith et al. 2018, "Don't Decay the Learning Rate, Increase the Batch Size"):
       stats.schedule_lr_ratio (the schedule's current rate over its rate at the last change)
       <= schedule_decay_ratio: grow by 1 / ratio instead (still within the growth bound);
    6. below the noise scale: effective < grow_below_noise_fraction x stats.noise_scale_samples:
       grow (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training": batches well
       below the noise scale B_simple waste steps; well above it, waste examples). With
       policy="goodput" instead: toward stats.goodput_batch_samples, up or down.
    A statistic that is None (not measured yet) fires nothing.
    """
    if stats.drift:
        return -1, "drift: hard examples rising", 0.0
    cosine = stats.mean_cosine
    if cosine is not None and config.shrink_below_cosine is not None and cosine < config.shrink_below_cosine:
        return -1, f"mean cosine {cosine:.2f} < {config.shrink_below_cosine:.2f}", 0.0
    if cosine is not None and config.grow_above_cosine is not None and cosine > config.grow_above_cosine:
        return 1, f"mean cosine {cosine:.2f} > {config.grow_above_cosine:.2f}", math.inf
    if stats.plateau:
        return 1, "loss plateau", math.inf
    ratio = stats.schedule_lr_ratio
    if config.schedule_decay_ratio is not None and ratio is not None and 0.0 < ratio <= config.schedule_decay_ratio:
        return 1, f"schedule decayed the rate to {ratio:.2f}x: grow the batch instead", 1.0 / ratio
    if config.policy == "goodput":
        return _goodput_trigger(stats, current)
    noise = stats.noise_scale_samples
    fraction = config.grow_below_noise_fraction
    if fraction is not None and noise is not None and current < fraction * noise:
        return 1, f"batch {current} < {fraction:g} x noise scale {noise:.0f}", math.inf
    return 0, "", 0.0


def _goodput_trigger(stats: AdaptStats, current: int) -> tuple[int, str, float]:
    """Toward the goodput batch, when known and not the current one (the wanted factor bounds the move)."""
    target = stats.goodput_batch_samples
    if target is None or target == current:
        return 0, "", 0.0
    return (1 if target > current else -1), f"goodput: {stats.goodput_note}", target / current


def _grow_target(config: AdaptConfig, current: int, wanted_factor: float, noise: float | None) -> int:
    """floor(current x min(max_grow_factor, wanted)), at least current + 1, at most the max and the
    noise-scale cap (not under policy="goodput", whose efficiency term already counts the noise);
    `current` when the max or the cap leave no room."""
    limit = config.max_effective_batch_samples
    if config.noise_cap_factor is not None and noise is not None and config.policy != "goodput":
        limit = min(limit, math.floor(config.noise_cap_factor * noise))
    if limit <= current:
        return current
    bound = math.floor(current * min(config.max_grow_factor, wanted_factor) + 1e-9)  # 1e-9: float rounding
    return min(max(bound, current + 1), limit)


def _limit_note(config: AdaptConfig, current: int, direction: int, noise: float | None) -> str:
    if direction < 0:
        return f"at min_effective_batch_samples {config.min_effective_batch_samples}"
    if current >= config.max_effective_batch_samples:
        return f"at max_effective_batch_samples {config.max_effective_batch_samples}"
    return f"at the noise-scale cap {config.noise_cap_factor:g} x {noise:.0f}"


def _decision(
    config: AdaptConfig, state: AdaptState, memory_micro_batch_samples: int, changed: bool,
    reason: str = "", blocked: str = "",
) -> AdaptDecision:
    """The decision for `state`. lr_scale = lr_coupling.lr_scale(config.lr_rule,
    state.base_effective_batch_samples, effective): the multiplier on the rate (or schedule, via
    scaled_schedule.ScaledSchedule) tuned for the starting effective batch. Path independent:
    scales never compound."""
    effective = state.effective_batch_samples
    micro, steps = micro_plan(effective, memory_micro_batch_samples)
    return AdaptDecision(
        effective_batch_samples=effective,
        micro_batch_samples=micro,
        accumulation_steps=steps,
        lr_scale=lr_scale(config.lr_rule, state.base_effective_batch_samples, effective),
        changed=changed,
        reason=reason,
        blocked=blocked,
    )
