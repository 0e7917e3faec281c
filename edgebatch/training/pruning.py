"""TFMOT pruning in fit's custom loop: one pruning step per optimizer update, not per micro-batch.

A `tfmot.sparsity.keras.prune_low_magnitude` model (tf_keras) keeps a `pruning_step` variable in
every PruneLowMagnitude wrapper. In tensorflow-model-optimization 0.8 the wrapper's forward pass in
training adds 1 to it and then, when the schedule says so for the new step, recomputes the mask
from the current weights; the forward pass also multiplies the weights by the mask. Its Keras
callback UpdatePruningStep only sets a fresh model's step from -1 to 0 (on_train_begin; the
forward pass asserts a step of at least 1 after its increment, so a step left at -1 fails with
"Prune() wrapper requires the UpdatePruningStep callback") and re-masks the weights at each
epoch's end.

Run as is under accumulation, every micro-step would advance the schedule: an update of 4
micro-batches would count 4 pruning steps. `PruningSteps` keeps the plain loop's count: it reads
the step at the start of each update and sets it back to that value before every micro-step
(attempts that ran out of memory included), so each micro-step's forward pass sees the step the
plain loop's single step sees (start + 1) and the update ends at start + 1. Within an update the
weights do not move (the optimizer applies once, at the end), so every micro-step computes the
same mask: the update equals the plain loop's step with UpdatePruningStep. It also does
UpdatePruningStep's two jobs (step 0 at the start, a re-mask at each epoch's end and when fit
returns), so fit needs no callback for pruning; passing UpdatePruningStep as well is harmless.

Wrappers are found by class name, so this module never imports TFMOT (importing it changes what
`tf.keras` means for the whole process).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PruningSteps", "pruning_layers"]


def pruning_layers(model: Any) -> list:
    """The model's TFMOT pruning wrappers (nested models included)."""
    from edgebatch.training.steps import all_layers

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
