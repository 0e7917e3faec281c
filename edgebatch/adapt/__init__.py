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
drives it (edgebatch/training/adaptive.py); docs/adaptive-batch.md is the user's guide.
"""

from edgebatch.adapt.controller import AdaptController, AdaptReading, UpdateMeasurement
from edgebatch.adapt.lr_coupling import LR_RULES, change_factor, default_rule, lr_scale
from edgebatch.adapt.policy import (
    AdaptConfig,
    AdaptConfigError,
    AdaptDecision,
    AdaptState,
    AdaptStats,
    decide,
    initial_state,
    micro_plan,
)
from edgebatch.adapt.signals import (
    AgreementState,
    DriftState,
    NoiseScaleState,
    PlateauState,
    TwoBatchEstimate,
    cosine_similarity,
    drift_detected,
    hard_share,
    is_plateau,
    mean_agreement,
    micro_batch_pair,
    noise_scale_samples,
    push_agreement,
    push_loss,
    squared_norm,
    two_batch_estimate,
    update_drift,
    update_noise_scale,
)

__all__ = [
    "LR_RULES",
    "AdaptConfig",
    "AdaptController",
    "AdaptReading",
    "AdaptConfigError",
    "AdaptDecision",
    "AdaptState",
    "AdaptStats",
    "AgreementState",
    "DriftState",
    "NoiseScaleState",
    "PlateauState",
    "TwoBatchEstimate",
    "UpdateMeasurement",
    "change_factor",
    "cosine_similarity",
    "decide",
    "default_rule",
    "drift_detected",
    "hard_share",
    "initial_state",
    "is_plateau",
    "lr_scale",
    "mean_agreement",
    "micro_batch_pair",
    "micro_plan",
    "noise_scale_samples",
    "push_agreement",
    "push_loss",
    "squared_norm",
    "two_batch_estimate",
    "update_drift",
    "update_noise_scale",
]
