"""Apply the governor's lr_scale to an optimizer's learning rate: a plain number or a Keras schedule.

In elastic mode the effective batch moves, and the governor says how to scale the learning rate
tuned for the target batch (linear for SGD, sqrt for Adam; docs/tensorflow-memory.md, "Formulas").
The base rate is read once and every scale is applied to it (never to the current, already scaled,
value), so scales do not compound; a checkpoint stores the base because the optimizer's variable
holds the scaled value. `restore()` puts the base back when fit returns, so a second fit call (or
the user's own loop) starts from the tuned rate, not from the last scaled one.

A LearningRateSchedule (Keras 3 or tf_keras) is scaled, not replaced: the scaler installs
edgebatch.adapt.scaled_schedule's wrapper (schedule(step) x a factor variable) as the optimizer's
rate and `apply` sets the factor, so warm-up and decay keep their shape. It must be constructed
before the training step is traced, as fit does. A schedule has no single base rate:
`base_learning_rate` stays None (the checkpoint stores NaN) and `restore()` puts it back.
"""

from __future__ import annotations

from typing import Any

from edgebatch.errors import UsageError

__all__ = ["LearningRateScaler"]


def _learning_rate_variable(optimizer: Any) -> Any:
    # Keras 3 and tf_keras optimizers keep the rate in `_learning_rate`: a variable for a constant
    # rate, a LearningRateSchedule object otherwise. Legacy tf_keras optimizers keep `_hyper`.
    variable = getattr(optimizer, "_learning_rate", None)
    if variable is None:
        variable = getattr(optimizer, "_hyper", {}).get("learning_rate")
    return variable if hasattr(variable, "assign") else None


class LearningRateScaler:
    """Sets optimizer lr = base x scale (a schedule: schedule(step) x scale). Inactive (touches
    nothing) when `enabled` is False."""

    def __init__(self, optimizer: Any, enabled: bool, base_learning_rate: float | None = None) -> None:
        self.enabled = enabled
        self.base_learning_rate: float | None = None
        self._variable = None
        self._optimizer = optimizer
        self._schedule: Any = None  # the optimizer's own schedule, when it has one
        self._scaled: Any = None  # its wrapper, installed while enabled
        self._scale: float | None = None  # unknown until first applied (a restored rate may be scaled)
        if not enabled:
            return
        self._variable = _learning_rate_variable(optimizer)
        if self._variable is None:
            rate = getattr(optimizer, "_learning_rate", None)
            if rate is None:
                rate = getattr(optimizer, "_hyper", {}).get("learning_rate")  # legacy tf_keras
            from edgebatch.adapt.scaled_schedule import is_schedule, wrap_schedule

            if not is_schedule(rate):
                raise UsageError(
                    "lr_scaling needs an optimizer whose learning rate is a float or a Keras "
                    f"LearningRateSchedule, got {type(optimizer).__name__} with learning rate {rate!r}; "
                    "use lr_scaling='none'"
                )
            self._schedule = rate
            self._scaled = wrap_schedule(rate)
            optimizer.learning_rate = self._scaled
            return
        self.base_learning_rate = (
            float(base_learning_rate) if base_learning_rate is not None else float(self._variable.numpy())
        )

    @property
    def schedule(self) -> Any:
        """The optimizer's own LearningRateSchedule while this scaler wraps it, else None."""
        return self._schedule

    def apply(self, scale: float) -> None:
        """Set the optimizer's rate to base x `scale` (a no-op when the scale did not change)."""
        if not self.enabled or scale == self._scale:
            return
        if self._scaled is not None:
            self._scaled.set_factor(scale)
        else:
            self._variable.assign(self.base_learning_rate * scale)
        self._scale = scale

    def restore(self) -> None:
        """Set the optimizer's rate back to the base (the end of fit, however it ends)."""
        if not self.enabled:
            return
        if self._scaled is not None:
            self._optimizer.learning_rate = self._schedule
            self._scale = None
            return
        # Also when no update ran: a restored checkpoint put the scaled rate into the variable.
        self._variable.assign(self.base_learning_rate)
        self._scale = None
