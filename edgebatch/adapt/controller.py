"""The adaptive-batch controller: one update's measurements in, the next effective batch out. Pure.

`AdaptController` is what `edgebatch.fit(adapt=AdaptConfig(...))` drives once per optimizer
update. It keeps the signal states of signals.py and the policy state of policy.py, and turns an
`UpdateMeasurement` (plain numbers a training loop already has) into the statistics
(`AdaptReading`, logged) and the policy's decision for the next update (`AdaptDecision`). No
TensorFlow: tests drive it with constructed numbers, and its whole state is a JSON-able dict
(`state_dict` / `load_state_dict`) so a checkpoint resumes it exactly. What one update
contributes to each signal: `AdaptController.observe`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgebatch.adapt.goodput import MEASURED, GoodputChoice, MeasuredSteps, StepCurve, best_batch
from edgebatch.adapt.policy import (
    AdaptConfig,
    AdaptDecision,
    AdaptState,
    AdaptStats,
    decide,
    initial_state,
    is_check,
)
from edgebatch.adapt.signals import (
    AgreementState,
    DriftState,
    NoiseScaleState,
    PlateauState,
    drift_detected,
    hard_share,
    is_plateau,
    mean_agreement,
    noise_scale_samples,
    pair_from_norms,
    push_agreement,
    push_loss,
    two_batch_estimate,
    update_drift,
    update_noise_scale,
)

__all__ = ["AdaptController", "AdaptReading", "UpdateMeasurement"]


@dataclass(frozen=True)
class UpdateMeasurement:
    """What one optimizer update measured (gradients are the *mean* gradients of their examples)."""

    micro_batch_samples: tuple[int, ...]  # sizes of the micro-batches that ran
    micro_sq_norms: tuple[float, ...]  # |mean gradient of each micro-batch|^2
    update_sq_norm: float  # |mean gradient of the whole update|^2
    cosine_previous: float | None  # cos(this update's gradient, the previous update's)
    loss: float  # mean per-example loss of the update
    per_example_losses: Any = None  # array of the update's per-example losses (drift); None: skip
    schedule_rate: float | None = None  # the optimizer schedule's own rate now (None: no schedule)
    piece_seconds: tuple[float, ...] | None = None  # each micro-batch's seconds (throughput="measured")
    update_seconds: float | None = None  # the whole update's; None: not timed (an OOM spent time failing)


@dataclass(frozen=True)
class AdaptReading:
    """The statistics behind this update's decision (what the logs carry); None: not measured yet."""

    noise_scale_samples: float | None
    cosine: float | None
    mean_cosine: float | None
    loss_change: float | None  # relative change of the check-mean loss at this check, else None
    plateau: bool
    hard_share: float | None  # share of the recent examples above the reference quantile
    drift: bool
    schedule_lr_ratio: float | None
    checked: bool  # the policy evaluated its triggers on this update

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class AdaptController:
    """Signals + policy for one run (module docstring). Start with `AdaptController(config, start)`."""

    def __init__(self, config: AdaptConfig, effective_batch_samples: int) -> None:
        if not isinstance(config, AdaptConfig):
            raise TypeError(f"config must be an edgebatch.adapt.AdaptConfig, got {config!r}")
        self.config = config
        self.state = initial_state(config, effective_batch_samples)
        self.noise = NoiseScaleState()
        self.agreement = AgreementState()
        self.plateau = PlateauState()
        self.drift = DriftState()
        self.check_loss_sum = 0.0  # loss x updates since the previous check (mean of update losses)
        self.check_updates = 0
        self.rate_at_change: float | None = None
        self.last_noise_scale_samples: float | None = None
        # throughput="measured": the curve learned from the run's step times (not checkpointed: a
        # resumed run measures its device again).
        self.measured_steps = MeasuredSteps() if config.throughput == MEASURED else None

    @property
    def effective_batch_samples(self) -> int:
        """The effective batch the next update should take."""
        return self.state.effective_batch_samples

    def _schedule_ratio(self, rate: float | None) -> float | None:
        """The schedule's rate now over its rate at the last change (the first rate seen counts as one)."""
        if rate is not None and self.rate_at_change is None:
            self.rate_at_change = float(rate)
        if rate is not None and self.rate_at_change is not None and self.rate_at_change > 0:
            return float(rate) / self.rate_at_change
        return None

    def _goodput(self, noise: float | None, memory_micro_batch_samples: int) -> GoodputChoice | None:
        """policy="goodput": the batch of highest goodput on the config's curve, within its bounds and
        micro-batches of the memory governor's size; None under another policy or before a noise scale."""
        cfg = self.config
        if cfg.policy != "goodput" or noise is None or not math.isfinite(noise) or noise < 0:
            return None
        ceiling = max(1, int(memory_micro_batch_samples))
        curve = cfg.throughput if isinstance(cfg.throughput, StepCurve) else self.measured_steps.curve(ceiling)
        if curve is None:
            return None
        bounds = (cfg.min_effective_batch_samples, cfg.max_effective_batch_samples)
        return best_batch(curve, noise, self.state.base_effective_batch_samples, ceiling, bounds)

    def split_micro_batch(self, memory_micro_batch_samples: int) -> int:
        """The micro-batch to split the next update with: the memory governor's, and small enough
        that the update runs in at least config.min_pieces_per_update pieces (when it has that many
        examples), so the noise scale gets its two batch sizes."""
        return max(1, min(int(memory_micro_batch_samples), self.pieces_bound_samples()))

    def pieces_bound_samples(self) -> int:
        """The largest piece (examples) that still leaves config.min_pieces_per_update pieces in the
        next update (the whole update when it is smaller)."""
        effective = self.state.effective_batch_samples
        return max(1, min(effective, math.ceil(effective / self.config.min_pieces_per_update)))

    def _fold_pieces(self, measurement: UpdateMeasurement) -> None:
        """The micro-batches' part of `observe`: the noise-scale pair, and their times for throughput="measured"."""
        sizes = tuple(int(size) for size in measurement.micro_batch_samples)
        if len(sizes) >= 2:
            small_sq, small_b, big_sq, big_b = pair_from_norms(measurement.micro_sq_norms, sizes,
                                                               measurement.update_sq_norm)
            estimate = two_batch_estimate(small_sq, small_b, big_sq, big_b)
            if math.isfinite(estimate.gradient_sq_norm) and math.isfinite(estimate.trace_covariance):
                self.noise = update_noise_scale(self.noise, estimate, self.config.noise_ema_decay)
        if self.measured_steps is not None and measurement.piece_seconds and measurement.update_seconds is not None:
            self.measured_steps.add(sizes, measurement.piece_seconds, measurement.update_seconds)

    def observe(self, measurement: UpdateMeasurement, memory_micro_batch_samples: int) -> tuple[AdaptDecision, AdaptReading]:
        """Fold one update in and decide the next effective batch.

        What one update contributes:
        - noise scale: with >= 2 micro-batches, `pair_from_norms` on the micro-batches' and the update's
          squared mean-gradient norms gives one two-batch estimate, folded into the EMAs
          (config.noise_ema_decay); one micro-batch gives none;
        - direction agreement: the cosine between this update's mean gradient and the previous one's
          (None for the first update, or a zero gradient), into a window of config.cosine_window_updates;
        - drift: the update's per-example losses (signals.update_drift);
        - plateau: the update's loss joins the running mean since the previous check; on a check that
          mean is pushed and the plateau test (config.plateau_checks, plateau_relative_tolerance) runs;
        - schedule phase: the optimizer's scheduled rate (unscaled), compared with the rate at the last
          change (the start counts as one): its ratio feeds the schedule trigger.
        Then `decide` runs with these statistics and the memory governor's micro-batch.
        """
        cfg = self.config
        self._fold_pieces(measurement)
        self.agreement = push_agreement(self.agreement, measurement.cosine_previous, cfg.cosine_window_updates)
        if measurement.per_example_losses is not None:
            self.drift = update_drift(self.drift, np.asarray(measurement.per_example_losses),
                                      cfg.drift_recent_examples, cfg.drift_reference_examples)
        windows = (cfg.drift_recent_examples, cfg.drift_reference_examples)
        drift_share = hard_share(self.drift, cfg.drift_quantile, *windows)
        drift = drift_detected(self.drift, cfg.drift_quantile, cfg.drift_rise, *windows)
        if math.isfinite(measurement.loss):
            self.check_loss_sum += measurement.loss
            self.check_updates += 1
        checked = is_check(cfg, self.state)
        loss_change = None
        plateau = False
        if checked:
            mean_loss = self.check_loss_sum / self.check_updates if self.check_updates else math.nan
            previous = self.plateau.losses[-1] if self.plateau.losses else None
            self.plateau = push_loss(self.plateau, mean_loss, cfg.plateau_checks)
            if previous is not None and previous != 0.0 and math.isfinite(mean_loss):
                loss_change = abs(mean_loss - previous) / abs(previous)
            plateau = is_plateau(self.plateau, cfg.plateau_checks, cfg.plateau_relative_tolerance)
            self.check_loss_sum, self.check_updates = 0.0, 0
        ratio = self._schedule_ratio(measurement.schedule_rate)
        noise = noise_scale_samples(self.noise)
        if noise is not None and math.isfinite(noise):
            self.last_noise_scale_samples = noise
        # Goodput decides from the noise scale last measured: on small noisy problems the estimate
        # is undefined (a negative |G|^2) on many single updates.
        goodput = self._goodput(self.last_noise_scale_samples, memory_micro_batch_samples) if checked else None
        stats = AdaptStats(
            noise_scale_samples=noise,
            mean_cosine=mean_agreement(self.agreement, cfg.cosine_window_updates),
            plateau=plateau,
            schedule_lr_ratio=ratio,
            drift=drift,
            goodput_batch_samples=None if goodput is None else goodput.effective_batch_samples,
            goodput_note="" if goodput is None else goodput.describe(),
        )
        self.state, decision = decide(cfg, self.state, stats, memory_micro_batch_samples)
        if decision.changed:
            # The schedule trigger compares with the rate at the last change; a changed batch also
            # starts a new plateau history (losses at another batch size are not comparable).
            rate = measurement.schedule_rate
            self.rate_at_change = None if rate is None else float(rate)
            self.plateau = PlateauState()
        reading = AdaptReading(
            noise_scale_samples=stats.noise_scale_samples,
            cosine=measurement.cosine_previous,
            mean_cosine=stats.mean_cosine,
            loss_change=loss_change,
            plateau=plateau,
            hard_share=drift_share,
            drift=drift,
            schedule_lr_ratio=ratio,
            checked=checked,
        )
        return decision, reading

    def lr_scale(self) -> float:
        """The learning-rate multiplier for the current effective batch (config.lr_rule)."""
        from edgebatch.adapt.lr_coupling import lr_scale

        return lr_scale(self.config.lr_rule, self.state.base_effective_batch_samples,
                        self.state.effective_batch_samples)

    def state_dict(self) -> dict[str, Any]:
        """Everything the controller remembers, as JSON-able plain values."""
        return {
            "state": dataclasses.asdict(self.state),
            "noise": dataclasses.asdict(self.noise),
            "agreement": list(self.agreement.cosines),
            "plateau": list(self.plateau.losses),
            "drift": {"reference": list(self.drift.reference), "recent": list(self.drift.recent)},
            "check_loss_sum": self.check_loss_sum,
            "check_updates": self.check_updates,
            "rate_at_change": self.rate_at_change,
            "last_noise_scale_samples": self.last_noise_scale_samples,
        }

    def load_state_dict(self, data: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (a checkpoint's copy)."""
        self.state = AdaptState(**data["state"])
        self.noise = NoiseScaleState(**data["noise"])
        self.agreement = AgreementState(cosines=tuple(float(c) for c in data["agreement"]))
        self.plateau = PlateauState(losses=tuple(float(v) for v in data["plateau"]))
        self.drift = DriftState(reference=tuple(float(v) for v in data["drift"]["reference"]),
                                recent=tuple(float(v) for v in data["drift"]["recent"]))
        self.check_loss_sum = float(data["check_loss_sum"])
        self.check_updates = int(data["check_updates"])
        rate = data["rate_at_change"]
        self.rate_at_change = None if rate is None else float(rate)
        noise = data.get("last_noise_scale_samples")  # absent from checkpoints written before goodput
        self.last_noise_scale_samples = None if noise is None else float(noise)
