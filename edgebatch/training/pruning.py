"""TFMOT pruning in fit's custom loop: one pruning step per optimizer update, not per micro-batch.

A `prune_low_magnitude` model (tf_keras) advances a `pruning_step` variable in every
PruneLowMagnitude wrapper's training forward pass, so under accumulation every micro-step would
advance the schedule. `PruningSteps` keeps the plain loop's count: it sets the step back to the
update's starting value before every micro-step, so each sees the step the plain loop's single
step sees and the update equals the plain loop's step with UpdatePruningStep. It also does that
callback's jobs, so fit needs no callback for pruning (docs/training-design.md, "pruning").

Wrappers are found by class name, so this module never imports TFMOT (importing it changes what
`tf.keras` means for the whole process).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PruningSteps", "pruning_layers"]


def pruning_layers(model: Any) -> list:
    """The model's TFMOT pruning wrappers (nested models included)."""
    from edgebatch.training.model_checks import all_layers

    return [
        layer for layer in all_layers(model)
        if type(layer).__name__ == "PruneLowMagnitude" and hasattr(layer, "pruning_step")
    ]


class PruningSteps:
    """Keeps a pruned model's pruning steps at one per optimizer update (module docstring)."""

    def __init__(self, model: Any) -> None:
        self.layers = pruning_layers(model)
        self.update_start_step: int | None = None

    def __bool__(self) -> bool:
        return bool(self.layers)

    def begin_training(self) -> None:
        """UpdatePruningStep.on_train_begin: a fresh model's step goes from -1 to 0."""
        for layer in self.layers:
            if int(layer.pruning_step.numpy()) == -1:
                layer.pruning_step.assign(0)

    def begin_update(self) -> None:
        self.update_start_step = int(self.layers[0].pruning_step.numpy())

    def before_micro_step(self) -> None:
        for layer in self.layers:
            layer.pruning_step.assign(self.update_start_step)

    def remask(self) -> None:
        """UpdatePruningStep.on_epoch_end: weights = weights x mask (the last update moved them)."""
        for layer in self.layers:
            layer.pruning_obj.weight_mask_op()

    @property
    def step(self) -> int | None:
        """The pruning step now (the first wrapper's; all move together)."""
        return int(self.layers[0].pruning_step.numpy()) if self.layers else None
