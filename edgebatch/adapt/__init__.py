"""Statistical batch adaptation: how large the effective batch *should* be (issue 13).

The memory governor (edgebatch.governor) bounds how large a micro-batch *can* be; this package
chooses the effective batch (examples per optimizer update) from training statistics and reaches
it by gradient accumulation above the memory ceiling, so the two halves compose.

Map: `signals` (numpy-only estimators: the gradient noise scale, direction agreement, loss
plateau, drift), `policy` (the pure decision core `decide`), `controller` (`AdaptController`,
signals + policy for one run, its state a JSON-able dict), `lr_coupling` (learning-rate rules for
a changed effective batch) and `scaled_schedule` (a Keras LearningRateSchedule x a mutable factor:
the only module that imports TensorFlow; not imported here).

Importing this package imports numpy, never TensorFlow. `edgebatch.fit(..., adapt=AdaptConfig(...))`
drives it (edgebatch/training/adaptive.py); docs/adaptive-batch.md is the user's guide. The package
exports what a user calls (the config, and the controller with its input and outputs for a loop of
one's own); the estimators and the policy's parts are imported from their modules.
"""

import warnings
from typing import Any

from edgebatch.adapt.controller import AdaptController, AdaptReading, UpdateMeasurement
from edgebatch.adapt.policy import AdaptConfig, AdaptConfigError, AdaptDecision

__all__ = [
    "AdaptConfig",
    "AdaptConfigError",
    "AdaptController",
    "AdaptDecision",
    "AdaptReading",
    "UpdateMeasurement",
]

# Names this package exported before it kept to what a user calls: each is still importable from
# its module, and from here with a DeprecationWarning (once per name and process).
_MOVED = {
    **dict.fromkeys(("LR_RULES", "change_factor", "default_rule", "lr_scale"), "lr_coupling"),
    **dict.fromkeys(("AdaptState", "AdaptStats", "decide", "initial_state", "micro_plan"), "policy"),
    **dict.fromkeys((
        "AgreementState", "DriftState", "NoiseScaleState", "PlateauState", "TwoBatchEstimate", "cosine_similarity",
        "drift_detected", "hard_share", "is_plateau", "mean_agreement", "micro_batch_pair", "noise_scale_samples",
        "push_agreement", "push_loss", "squared_norm", "two_batch_estimate", "update_drift", "update_noise_scale",
    ), "signals"),
}
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'edgebatch.adapt' has no attribute {name!r}")
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"edgebatch.adapt.{name} is deprecated: import it from edgebatch.adapt.{module}",
                      DeprecationWarning, stacklevel=2)
    import importlib

    return getattr(importlib.import_module(f"edgebatch.adapt.{module}"), name)
