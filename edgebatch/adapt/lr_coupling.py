"""How the learning rate follows the effective batch when the adaptive policy changes it. Pure math.

The rules (`LR_RULES`, each a multiplier on the rate tuned for `base_batch_samples`): `lr_scale`.

Every rule is a power law, so the scale from the base to the current batch is the product of the
per-change factors whatever the path: callers apply `lr_scale(rule, base, current)` to the base rate
(or schedule) and scales never compound through rounding. `change_factor` gives the per-change
multiplier B_old -> B_new for logs.
"""

from __future__ import annotations

import math

__all__ = ["LR_RULES", "change_factor", "default_rule", "lr_scale"]

LR_RULES = ("none", "linear", "sqrt", "inverse_sqrt")
_EXPONENTS = {"none": 0.0, "linear": 1.0, "sqrt": 0.5, "inverse_sqrt": -0.5}


def _check(rule: str, *batches: float) -> None:
    if rule not in _EXPONENTS:
        raise ValueError(f"lr rule must be one of {LR_RULES}, got {rule!r}")
    for batch in batches:
        if isinstance(batch, bool) or not batch > 0 or not math.isfinite(batch):
            raise ValueError(f"batch sizes must be positive and finite, got {batch!r}")


def lr_scale(rule: str, base_batch_samples: float, batch_samples: float) -> float:
    """The multiplier on the rate tuned for `base_batch_samples` when training at `batch_samples`.

    Rules (`LR_RULES`):
    - "none":    1 (the rate is left alone; Smith et al. 2018 "Don't Decay the Learning Rate, Increase
                 the Batch Size" grow the batch *instead of* decaying, at a constant rate);
    - "linear":  B_new / B_base (Goyal et al. 2017, "Accurate, Large Minibatch SGD": for SGD);
    - "sqrt":    sqrt(B_new / B_base) (Krizhevsky 2014, "One weird trick"; Malladi et al. 2022, "On the
                 SDEs and Scaling Rules for Adaptive Gradient Algorithms": the default for Adam-like
                 optimizers);
    - "inverse_sqrt": sqrt(B_base / B_new), the rule of the seed this feature reproduces
                 (LR x sqrt(B_old / B_new) at each change: a larger batch gets a *smaller* rate). It is
                 offered to reproduce the seed, not recommended.
    """
    _check(rule, base_batch_samples, batch_samples)
    return (batch_samples / base_batch_samples) ** _EXPONENTS[rule]


def change_factor(rule: str, old_batch_samples: float, new_batch_samples: float) -> float:
    """The multiplier one change B_old -> B_new applies to the current rate (same power law)."""
    return lr_scale(rule, old_batch_samples, new_batch_samples)


def default_rule(adaptive_optimizer: bool) -> str:
    """"sqrt" for adaptive optimizers (Adam, RMSprop, Adagrad...), "linear" for SGD and momentum."""
    return "sqrt" if adaptive_optimizer else "linear"
