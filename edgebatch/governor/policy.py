"""The governor's pure decision core: `step(config, state, observation) -> (state, decision)`.

Plain values in, plain values out (optax's init/update shape): no TensorFlow, psutil or pynvml, so
every rule below is tested one transition at a time and a recorded trace can be replayed.

Sizes. A micro-batch is always *legal*: in [config.lower_batch, config.upper_batch] where
upper = min(ceiling_batch, effective_batch) and, once >= `multiple`, a multiple of it (sizes.py).
Every change moves at least one legal step, even when the factor bounds below would round to no
change (x1.5 from 1 goes to 2; with multiple=8, x1.5 from 8 goes to 16).

Observations. One per optimizer update (it advances `updates` and counts down the cooldown),
except `oom=True`, which may come after any micro-batch, is not an update, and acts at once.

OOM (oom=True; ignores patience and cooldown). failed = observation.micro_batch (else the current
size); target = floor(failed x oom_shrink_factor), lowered further to the model's fit when there is
one (the only way below the factor); new = min(current, largest legal size <= target), at least
lower_batch. If that is smaller than the current size it is taken; if not and failed <= current, the
smallest size has failed too: the decision is unchanged with `exhausted=True` (the training loop
should give up); if failed > current the report is stale (already smaller): only counted. In every
case oom_count += 1, the calm streak resets and the cooldown restarts.

Update observations, in this order:
1. Slow step: with step_seconds, the micro-batch it ran at (observation.micro_batch, else the
   current size) and >= 3 earlier samples at that size among the last `slow_step_window`, the
   last `slow_step_patience` steps (this one included) all slower than slow_step_factor x the
   median of the samples before them are pressure. (FACTS.md: a new size's first step
   retraces a tf.function, seconds long; the median of >= 3 samples shrugs that outlier off.)
   The sample then joins the bounded history.
2. High pressure: pressure > shrink_above_pressure, or psi_some_avg10 >= psi_some_avg10_threshold,
   or a slow step. Calm: not high and pressure < grow_below_pressure. A reading in between resets
   the calm streak; an observation with no reading (pressure None, not high) leaves it alone, so
   with a rate-limited reader patience counts readings, not updates.
3. Cooldown: when cooldown_left > 0 nothing changes this update and cooldown_left -= 1 (the
   streak still counts), so after a change the next `cooldown_updates` updates keep the size.
4. High pressure shrinks. Without a model: to ceil(current x max_shrink_factor). With one: to the
   model's fit, but no lower than ceil(current x max_shrink_factor); when the fit is at or above
   the current size there is no shrink: what the other users hold leaves room for this size, so
   the reading is this training's own cached memory (TensorFlow's allocators and the process heap
   keep freed memory, FACTS.md), which shrinking would not give back and halving blindly would
   chase down to min_batch. Rounded down to a legal size unless that breaks the factor bound
   (then up).
5. Else a calm streak >= grow_patience grows: to floor(current x max_grow_factor), no higher than
   upper_batch nor (with a model) its fit, rounded down to a legal size. If the model's fit is at
   or below the current size there is no growth and the streak keeps counting.
Any change resets the calm streak and starts the cooldown (`cooldown_updates`).

Model-predictive sizing. With config.fixed_bytes/per_sample_bytes and an observation carrying both
limit_bytes and used_bytes (bytes in use under that limit by everything except this training's
modelled memory), the model's fit is the largest b with
    fixed_bytes + per_sample_bytes x b <= target_pressure x limit_bytes - used_bytes
i.e. floor((target_pressure x limit_bytes - used_bytes - fixed_bytes) / per_sample_bytes), which may
be <= 0 (an OOM then goes to lower_batch; a pressure shrink still stops at its factor bound).

Effective batch. Fixed mode: effective = config.effective_batch, accumulation = ceil(E / micro),
lr_scale = 1. Elastic mode (floor F = elastic_floor_batch, or none): effective = micro (no
accumulation) while micro >= F; below F accumulate ceil(F / micro) micro-batches over exactly F
examples (`split_micro_batches`). lr_scale = (effective / E) for "linear", sqrt(effective / E) for
"sqrt": the base LR is the one tuned for the target E (FACTS.md: linear for SGD, sqrt for Adam).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import replace
from statistics import median

from edgebatch.governor.records import (
    Decision,
    GovernorConfig,
    GovernorConfigError,
    GovernorState,
    Observation,
)
from edgebatch.governor.sizes import (
    accumulation_steps_for,
    legal_above,
    legal_at_least,
    legal_at_most,
    legal_below,
    split_micro_batches,
)

__all__ = [
    "Decision",
    "GovernorConfig",
    "GovernorConfigError",
    "GovernorState",
    "Observation",
    "decision_for",
    "initial_state",
    "model_fit_batch",
    "split_micro_batches",
    "step",
]

# The median of fewer samples is one outlier away from meaningless (the retrace step above).
MIN_SLOW_STEP_SAMPLES = 3


def initial_state(config: GovernorConfig, start_micro_batch: int | None = None) -> GovernorState:
    """The state before the first observation: at `start_micro_batch` (default upper_batch).

    A start between upper_batch and the ceiling is lowered to upper_batch; a start that is not a
    legal size is rounded down to one. A start outside [min_batch, ceiling_batch] is an error.
    """
    start = config.upper_batch
    if start_micro_batch is not None:
        if isinstance(start_micro_batch, bool) or not isinstance(start_micro_batch, numbers.Integral):
            raise GovernorConfigError(f"start_micro_batch must be an integer, got {start_micro_batch!r}")
        if not config.min_batch <= start_micro_batch <= config.ceiling_batch:
            raise GovernorConfigError(
                f"start_micro_batch must be in [{config.min_batch}, {config.ceiling_batch}], "
                f"got {start_micro_batch!r}"
            )
        start = _clamp(config, legal_at_most(int(start_micro_batch), config.multiple))
    return GovernorState(
        micro_batch=start,
        calm_streak=0,
        cooldown_left=0,
        updates=0,
        recent_step_seconds=(),
        oom_count=0,
        last_reason="",
    )


def decision_for(config: GovernorConfig, state: GovernorState) -> Decision:
    """The decision implied by `state` as it is (unchanged, empty reason)."""
    return _decision(config, state.micro_batch, "", changed=False)


def model_fit_batch(config: GovernorConfig, limit_bytes: int | None, used_bytes: int | None) -> int | None:
    """Largest micro-batch the memory model fits under target_pressure x limit; None without a model.

    May be <= 0 when even the fixed part does not fit.
    """
    if not config.has_memory_model or limit_bytes is None or used_bytes is None:
        return None
    room_bytes = config.target_pressure * limit_bytes - used_bytes - config.fixed_bytes
    return math.floor(room_bytes / config.per_sample_bytes)


def step(config: GovernorConfig, state: GovernorState, observation: Observation) -> tuple[GovernorState, Decision]:
    """Apply one observation; return the new state and the decision for the next micro-batches."""
    if observation.oom:
        return _step_oom(config, state, observation)
    return _step_update(config, state, observation)


def _step_oom(config: GovernorConfig, state: GovernorState, obs: Observation) -> tuple[GovernorState, Decision]:
    current = state.micro_batch
    failed = obs.micro_batch if obs.micro_batch is not None else current
    target = math.floor(failed * config.oom_shrink_factor)
    fit = model_fit_batch(config, obs.limit_bytes, obs.used_bytes)
    if fit is not None:
        target = min(target, fit)
    new = min(current, _clamp(config, legal_at_most(max(target, 0), config.multiple)))
    exhausted = False
    if new < current:
        reason = f"oom: {current} -> {new}" + _model_note(fit)
    elif failed <= current:
        reason = f"oom at the smallest micro-batch {current}: cannot shrink"
        exhausted = True
    else:
        reason = ""  # a stale report from a size larger than the current one: nothing to do
    new_state = replace(
        state,
        micro_batch=new,
        calm_streak=0,
        cooldown_left=config.cooldown_updates,
        oom_count=state.oom_count + 1,
        last_reason=reason or state.last_reason,
    )
    decision = _decision(config, new, reason, changed=new != current)
    return new_state, replace(decision, exhausted=exhausted)


def _step_update(config: GovernorConfig, state: GovernorState, obs: Observation) -> tuple[GovernorState, Decision]:
    current = state.micro_batch
    recent, slow_ratio = _record_step(config, state.recent_step_seconds, obs, current)
    high_reason = _high_pressure_reason(config, obs, slow_ratio)
    calm = high_reason is None and obs.pressure is not None and obs.pressure < config.grow_below_pressure
    if calm:
        streak = state.calm_streak + 1
    elif high_reason is not None or obs.pressure is not None:
        streak = 0
    else:
        streak = state.calm_streak
    new_state = replace(
        state,
        updates=state.updates + 1,
        recent_step_seconds=recent,
        calm_streak=streak,
        cooldown_left=max(0, state.cooldown_left - 1),
    )
    if state.cooldown_left > 0:
        return new_state, _decision(config, current, "", changed=False)

    fit = model_fit_batch(config, obs.limit_bytes, obs.used_bytes)
    new = current
    if high_reason is not None:
        new = _shrink_target(config, current, fit)
        reason = f"{high_reason}: {current} -> {new}" + _model_note(fit)
    elif streak >= config.grow_patience:
        new = _grow_target(config, current, fit)
        reason = f"calm {streak} updates < {config.grow_below_pressure:.2f}: {current} -> {new}" + _model_note(fit)
    if new == current:
        return new_state, _decision(config, current, "", changed=False)
    new_state = replace(
        new_state, micro_batch=new, calm_streak=0, cooldown_left=config.cooldown_updates, last_reason=reason
    )
    return new_state, _decision(config, new, reason, changed=True)


def _record_step(
    config: GovernorConfig, recent: tuple[tuple[int, float], ...], obs: Observation, current: int
) -> tuple[tuple[tuple[int, float], ...], float | None]:
    """(history with this step appended, this step / median of earlier ones at its size or None)."""
    if obs.step_seconds is None:
        return recent, None
    batch = obs.micro_batch if obs.micro_batch is not None else current
    samples = [seconds for size, seconds in recent if size == batch] + [obs.step_seconds]
    patience = config.slow_step_patience
    ratio = None
    if len(samples) - patience >= MIN_SLOW_STEP_SAMPLES:
        # The last `patience` steps must all be slow against the median of the ones before them:
        # on a shared machine one step in a while is slow for reasons of its own (seen in
        # tests/test_governor_real.py: a lone 3.3x step at pressure 0.10 halved the batch).
        typical = median(samples[:-patience])
        if typical > 0:
            ratio = min(seconds / typical for seconds in samples[-patience:])
    return (recent + ((batch, obs.step_seconds),))[-config.slow_step_window :], ratio


def _high_pressure_reason(config: GovernorConfig, obs: Observation, slow_ratio: float | None) -> str | None:
    """Why this observation counts as pressure above the shrink threshold; None when it does not."""
    if obs.pressure is not None and obs.pressure > config.shrink_above_pressure:
        return f"pressure {obs.pressure:.2f} > {config.shrink_above_pressure:.2f}"
    if obs.psi_some_avg10 is not None and obs.psi_some_avg10 >= config.psi_some_avg10_threshold:
        return f"psi some_avg10 {obs.psi_some_avg10:.1f}% >= {config.psi_some_avg10_threshold:.1f}%"
    if slow_ratio is not None and slow_ratio > config.slow_step_factor:
        return f"slow step {slow_ratio:.1f}x median"
    return None


def _shrink_target(config: GovernorConfig, current: int, fit: int | None) -> int:
    bound = math.ceil(current * config.max_shrink_factor)  # a pressure shrink goes no lower
    if fit is not None and fit >= current:
        # Others leave room for this size: the reading is our own cached memory (allocators keep
        # what they freed, FACTS.md), which a smaller batch would not give back.
        return current
    wanted = bound if fit is None else max(bound, fit)
    new = legal_at_most(wanted, config.multiple)
    if new < bound:
        new = legal_at_least(bound, config.multiple)
    if new >= current:
        new = legal_below(current, config.multiple)
    return max(new, config.lower_batch) if new < current else current


def _grow_target(config: GovernorConfig, current: int, fit: int | None) -> int:
    cap = min(math.floor(current * config.max_grow_factor), config.upper_batch)
    if fit is not None:
        cap = min(cap, fit)
    new = legal_at_most(cap, config.multiple)
    if new <= current:
        # The factor rounds to no change (x1.5 from 1): take one legal step if it is allowed.
        step_up = legal_above(current, config.multiple)
        new = step_up if step_up <= config.upper_batch and (fit is None or step_up <= fit) else current
    return new


def _clamp(config: GovernorConfig, size: int) -> int:
    return min(max(size, config.lower_batch), config.upper_batch)


def _model_note(fit: int | None) -> str:
    return "" if fit is None else f" (model fits {fit})"


def _decision(config: GovernorConfig, micro_batch: int, reason: str, changed: bool) -> Decision:
    if config.mode == "fixed":
        effective = config.effective_batch
    else:
        floor_batch = config.elastic_floor_batch or 0
        effective = micro_batch if micro_batch >= floor_batch else floor_batch
    lr_scale = 1.0
    if config.lr_scaling == "linear":
        lr_scale = effective / config.effective_batch
    elif config.lr_scaling == "sqrt":
        lr_scale = math.sqrt(effective / config.effective_batch)
    return Decision(
        micro_batch=micro_batch,
        accumulation_steps=accumulation_steps_for(effective, micro_batch),
        effective_batch=effective,
        lr_scale=lr_scale,
        reason=reason,
        changed=changed,
    )
