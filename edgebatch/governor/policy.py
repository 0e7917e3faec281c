"""The governor's pure decision core: `step(config, state, observation) -> (state, decision)`.

Plain values in, plain values out (optax's init/update shape): no TensorFlow, psutil or pynvml, so
every rule is tested one transition at a time and a recorded trace can be replayed.

Sizes. A micro-batch is always *legal*: in [config.lower_batch, config.upper_batch] where
upper = min(ceiling_batch, effective_batch) and, once >= `multiple`, a multiple of it (sizes.py).
Every change moves at least one legal step, even when the factor bounds would round to no change
(x1.5 from 1 goes to 2; with multiple=8, x1.5 from 8 goes to 16).

Observations. One per optimizer update (it advances `updates` and counts down the cooldown;
_step_update says how it is judged), except `oom=True`, which may come after any micro-batch, is
not an update, and acts at once (_step_oom). The memory model's part: model_fit_batch and _load;
the effective batch and LR scale: _decision.
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
    "footprint_bytes",
    "initial_state",
    "model_fit_batch",
    "split_micro_batches",
    "step",
]

# The median of fewer samples is one outlier away from meaningless (a retrace step: _step_update).
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


def model_fit_batch(
    config: GovernorConfig, limit_bytes: int | None, used_bytes: int | None, measure: str | None = None
) -> int | None:
    """Largest micro-batch the memory model fits under target_pressure x limit; None without a model.

    The largest b with fixed_bytes + extra_bytes + per_sample_bytes x b <= target_pressure x
    limit_bytes - used_bytes, i.e. floor((target_pressure x limit - used - fixed - extra) /
    per_sample_bytes). An OOM with a fit <= 0 goes to lower_batch; a pressure shrink below the hard
    limit stops at its factor bound. None too when `measure` (the reading's) differs from config.model_measure: a line fitted to
    process RSS says nothing about allocator bytes. May be <= 0 when even the fixed part does not fit.
    """
    if not _model_applies(config, measure) or limit_bytes is None or used_bytes is None:
        return None
    room_bytes = config.target_pressure * limit_bytes - used_bytes - config.fixed_bytes - config.extra_bytes
    return math.floor(room_bytes / config.per_sample_bytes)


def footprint_bytes(config: GovernorConfig, micro_batch: int) -> float | None:
    """The memory model's prediction for one micro-batch (fixed + extra + per-sample x b); None without one."""
    if not config.has_memory_model:
        return None
    return config.fixed_bytes + config.extra_bytes + config.per_sample_bytes * micro_batch


def step(config: GovernorConfig, state: GovernorState, observation: Observation) -> tuple[GovernorState, Decision]:
    """Apply one observation; return the new state and the decision for the next micro-batches."""
    if observation.oom:
        return _step_oom(config, state, observation)
    return _step_update(config, state, observation)


def _model_applies(config: GovernorConfig, measure: str | None) -> bool:
    if not config.has_memory_model:
        return False
    return config.model_measure is None or measure is None or measure == config.model_measure


def _step_oom(config: GovernorConfig, state: GovernorState, obs: Observation) -> tuple[GovernorState, Decision]:
    """An OOM (ignores patience and cooldown).

    The size that was running: max(obs.running_micro_batch, micro_batch) when the caller says;
    otherwise max(micro_batch, current size) (micro_batch None means the current size). target =
    floor(running x oom_shrink_factor), lowered further to the model's fit when there is one (the
    only way below the factor); new = min(current, largest legal size <= target), at least
    lower_batch. If that is smaller than the current size it is taken; if not and running <=
    current, the smallest size has failed too: the decision is unchanged with `exhausted=True`
    (the training loop should give up); if running > current the report is stale (already smaller,
    e.g. a process resumed from an older checkpoint): only counted. In every case oom_count += 1,
    the calm streak resets, the cooldown restarts as an *OOM cooldown* (the calm streak does not
    count in it), and the OOM threshold (TCP's ssthresh) becomes min(threshold, running), its calm
    count reset to 0 (_grow_target, _raised_threshold).
    """
    current = state.micro_batch
    piece = obs.micro_batch if obs.micro_batch is not None else current
    if obs.running_micro_batch is not None:
        running = max(obs.running_micro_batch, piece)
    else:
        # The loop splits every update at the current size, so a smaller failed piece is the
        # update's remainder (32, 32, 32, 4): shrinking from it would collapse the micro-batch.
        running = max(piece, current)
    target = math.floor(running * config.oom_shrink_factor)
    fit = model_fit_batch(config, obs.limit_bytes, obs.used_bytes, obs.measure)
    if fit is not None:
        target = min(target, fit)
    new = min(current, _clamp(config, legal_at_most(max(target, 0), config.multiple)))
    exhausted = False
    if new < current:
        where = f" (a piece of {piece})" if piece < running else ""
        reason = f"oom{where}: {current} -> {new}" + _model_note(fit)
    elif running <= current:
        reason = f"oom at the smallest micro-batch {current}: cannot shrink"
        exhausted = True
    else:
        reason = ""  # a stale report from a size larger than the current one: nothing to do
    threshold = running if state.threshold_batch is None else min(state.threshold_batch, running)
    new_state = replace(
        state,
        micro_batch=new,
        calm_streak=0,
        cooldown_left=config.cooldown_updates,
        oom_count=state.oom_count + 1,
        last_reason=reason or state.last_reason,
        threshold_batch=threshold,
        threshold_calm_updates=0,
        oom_cooldown=config.cooldown_updates > 0,
    )
    decision = _decision(config, new, reason, changed=new != current)
    return new_state, replace(decision, exhausted=exhausted)


def _step_update(config: GovernorConfig, state: GovernorState, obs: Observation) -> tuple[GovernorState, Decision]:
    """One update's observation, judged on its load (_load), in this order.

    1. Slow step: with step_seconds, the micro-batch it ran at and >= MIN_SLOW_STEP_SAMPLES earlier
       samples at that size among the last `slow_step_window`, the last `slow_step_patience` steps
       all slower than slow_step_factor x the median of the samples before them are pressure (a new
       size's first step retraces a tf.function; the median shrugs that outlier off:
       docs/tensorflow-memory.md#tffunction-retracing). The sample then joins the history.
    2. High pressure: load > shrink_above_pressure, or the hard limit, or psi_some_avg10 >=
       psi_some_avg10_threshold, or a slow step. Calm: not high and load < grow_below_pressure; for
       a predicted load, not high and the model's fit > the current size (target_pressure plays
       grow_below_pressure's part: a prediction has no cached memory to see through). A reading that is not
       calm resets the calm streak, as does a calm one in an OOM cooldown; an observation with no
       reading leaves it alone, so with a rate-limited reader patience counts readings.
    3. Cooldown: while cooldown_left > 0 nothing changes, except that the hard limit still shrinks
       (the prediction follows the size at once, unlike a reading).
    4. High pressure shrinks (_shrink_target); 5. else a calm streak >= grow_patience grows
       (_grow_target). Any change resets the calm streak and starts the cooldown. Every calm update
       outside an OOM cooldown counts towards the OOM threshold's expiry (_raised_threshold).
    """
    current = state.micro_batch
    recent, slow_ratio = _record_step(config, state.recent_step_seconds, obs, current)
    load, hard, predicted = _load(config, obs, current)
    high_reason = _high_pressure_reason(config, obs, load, hard, predicted, slow_ratio)
    fit = model_fit_batch(config, obs.limit_bytes, obs.used_bytes, obs.measure)
    if predicted:
        calm = high_reason is None and fit > current
    else:
        calm = high_reason is None and load is not None and load < config.grow_below_pressure
    in_cooldown = state.cooldown_left > 0
    counts = calm and not (in_cooldown and state.oom_cooldown)  # an OOM's cooldown is no calm
    if counts:
        streak = state.calm_streak + 1
    elif high_reason is not None or load is not None:
        streak = 0
    else:
        streak = state.calm_streak  # no reading: patience counts readings, not updates
    threshold, threshold_calm = state.threshold_batch, state.threshold_calm_updates
    if threshold is not None and counts:
        threshold_calm += 1
        if threshold_calm >= config.threshold_expiry_updates:
            threshold, threshold_calm = _raised_threshold(config, threshold), 0
    new_state = replace(
        state,
        updates=state.updates + 1,
        recent_step_seconds=recent,
        calm_streak=streak,
        cooldown_left=max(0, state.cooldown_left - 1),
        oom_cooldown=state.oom_cooldown and state.cooldown_left > 1,
        threshold_batch=threshold,
        threshold_calm_updates=threshold_calm,
    )
    if in_cooldown and not hard:
        return new_state, _decision(config, current, "", changed=False)

    new = current
    if high_reason is not None:
        new = _shrink_target(config, current, fit, hard)
        reason = f"{high_reason}: {current} -> {new}" + _model_note(fit)
    elif streak >= config.grow_patience:
        new = _grow_target(config, current, fit, threshold)
        below = "under the model's fit" if predicted else f"< {config.grow_below_pressure:.2f}"
        reason = f"calm {streak} updates {below}: {current} -> {new}" + _model_note(fit)
        if threshold is not None:
            reason += f" (oom threshold {threshold})"
    if new == current:
        return new_state, _decision(config, current, "", changed=False)
    new_state = replace(
        new_state, micro_batch=new, calm_streak=0, cooldown_left=config.cooldown_updates, oom_cooldown=False,
        last_reason=reason,
    )
    return new_state, _decision(config, new, reason, changed=True)


def _load(config: GovernorConfig, obs: Observation, current: int) -> tuple[float | None, bool, bool]:
    """(the fraction compared with the thresholds, None without a reading; hard limit hit; by the model).

    A room reading (limit_bytes with used_bytes, the bytes *others* use under that limit): with a
    memory model that applies to it the load is *predicted*, (used + footprint(current)) / limit,
    the share in use if this job held exactly what the next micro-batch needs, and a predicted load
    > hard_limit_fraction is the *hard limit*. Without one, load = used / limit: TensorFlow's
    allocators and the heap keep what they freed, so this job's own bytes say nothing about the
    next micro-batch. No room reading: observation.pressure (the whole device), None when not read.
    """
    room = obs.room_bytes
    if room is None:
        return obs.pressure, False, False
    if _model_applies(config, obs.measure):
        load = (obs.used_bytes + footprint_bytes(config, current)) / obs.limit_bytes
        return load, load > config.hard_limit_fraction, True
    return obs.used_bytes / obs.limit_bytes, False, False


def _raised_threshold(config: GovernorConfig, threshold: int) -> int | None:
    """An expired threshold, raised so that it becomes the safe point; None once above upper_batch.

    It expires after threshold_expiry_updates calm updates outside an OOM cooldown and is raised to
    max(ceil(threshold / threshold_safe_fraction), threshold + 1), so a device freed meanwhile is
    reclaimed, slowly; the next OOM sets it again. Forgetting it at once would regrow by the factor past the old edge (at 40 under 64: 64, 48
    and 41 fail in turn); raised, the old threshold is probed once, then growth goes on additively.
    """
    raised = max(math.ceil(threshold / config.threshold_safe_fraction), threshold + 1)
    return None if raised > config.upper_batch else raised


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


def _high_pressure_reason(
    config: GovernorConfig, obs: Observation, load: float | None, hard: bool, predicted: bool,
    slow_ratio: float | None,
) -> str | None:
    """Why this observation counts as pressure above the shrink threshold; None when it does not."""
    if load is not None and (hard or load > config.shrink_above_pressure):
        if predicted:
            if hard:
                return f"predicted {load:.2f} > {config.hard_limit_fraction:.2f} (hard limit)"
            return f"predicted {load:.2f} > {config.shrink_above_pressure:.2f}"
        if obs.room_bytes is not None:
            return f"others use {load:.2f} > {config.shrink_above_pressure:.2f}"
        return f"pressure {load:.2f} > {config.shrink_above_pressure:.2f}"
    if obs.psi_some_avg10 is not None and obs.psi_some_avg10 >= config.psi_some_avg10_threshold:
        return f"psi some_avg10 {obs.psi_some_avg10:.1f}% >= {config.psi_some_avg10_threshold:.1f}%"
    if slow_ratio is not None and slow_ratio > config.slow_step_factor:
        return f"slow step {slow_ratio:.1f}x median"
    return None


def _shrink_target(config: GovernorConfig, current: int, fit: int | None, hard: bool) -> int:
    """To ceil(current x max_shrink_factor) (the factor bound); with a model whose fit is below the
    current size, to the fit but no lower than the factor bound, or to the fit itself at the hard
    limit. A high reading the model does not explain (PSI, a slow step) shrinks by the factor.
    Rounded down to a legal size unless that breaks the factor bound (then up); at least one legal
    step, at least lower_batch."""
    bound = math.ceil(current * config.max_shrink_factor)  # a pressure shrink goes no lower...
    if fit is None or fit >= current:
        wanted = bound  # no model, or a reason the model does not see (PSI, a slow step)
    elif hard:
        wanted = fit  # ...unless the model says the current size does not fit at all
    else:
        wanted = max(bound, fit)
    new = legal_at_most(max(wanted, 0), config.multiple)
    if new < bound and not hard:
        new = legal_at_least(bound, config.multiple)
    if new >= current:
        new = legal_below(current, config.multiple)
    return max(new, config.lower_batch) if new < current else current


def _grow_target(config: GovernorConfig, current: int, fit: int | None, threshold: int | None) -> int:
    """To floor(current x max_grow_factor), no higher than upper_batch nor (with a model) its fit,
    rounded down to a legal size. With an OOM threshold set, multiplicative only up to the safe
    point floor(threshold x threshold_safe_fraction), then one legal step per growth, never to the
    threshold. If nothing higher is allowed there is no growth (the streak keeps counting)."""
    cap = min(math.floor(current * config.max_grow_factor), config.upper_batch)
    if fit is not None:
        cap = min(cap, fit)
    step_up = legal_above(current, config.multiple)
    if threshold is not None:
        # TCP after a loss: multiplicative up to the safe point, then one legal step at a time,
        # never back to the size that failed.
        safe = math.floor(threshold * config.threshold_safe_fraction)
        cap = min(cap, safe if current < safe else step_up, threshold - 1)
    new = legal_at_most(cap, config.multiple)
    if new <= current:
        # The factor rounds to no change (x1.5 from 1): take one legal step if it is allowed.
        allowed = (
            step_up <= config.upper_batch
            and (fit is None or step_up <= fit)
            and (threshold is None or step_up < threshold)
        )
        new = step_up if allowed else current
    return new


def _clamp(config: GovernorConfig, size: int) -> int:
    return min(max(size, config.lower_batch), config.upper_batch)


def _model_note(fit: int | None) -> str:
    return "" if fit is None else f" (model fits {fit})"


def _decision(config: GovernorConfig, micro_batch: int, reason: str, changed: bool) -> Decision:
    """Fixed mode: effective = config.effective_batch E, accumulation = ceil(E / micro). Elastic mode
    (floor F = elastic_floor_batch, or none): effective = micro while micro >= F; below F accumulate
    ceil(F / micro) micro-batches over exactly F examples. lr_scale = effective / E for "linear",
    sqrt(effective / E) for "sqrt", else 1: the base LR is the one tuned for E (linear for SGD,
    sqrt for Adam: docs/tensorflow-memory.md#formulas)."""
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
