"""The micro-batch governor: keeps training's micro-batch under the device's ceiling and live memory.

`policy` is the pure decision core (step(config, state, observation) -> (state, decision));
`Governor` wraps it for a training loop; `PressureReader` turns memory sensors into observations.
Importing this package imports no TensorFlow, psutil or pynvml.
"""

from edgebatch.governor.governor import Governor
from edgebatch.governor.policy import (
    Decision,
    GovernorConfig,
    GovernorConfigError,
    GovernorState,
    Observation,
    decision_for,
    initial_state,
    model_fit_batch,
    split_micro_batches,
    step,
)
from edgebatch.governor.pressure import PressureReader, SourceReading, parse_device
from edgebatch.governor.sizes import accumulation_steps_for

__all__ = [
    "Decision",
    "Governor",
    "GovernorConfig",
    "GovernorConfigError",
    "GovernorState",
    "Observation",
    "PressureReader",
    "SourceReading",
    "accumulation_steps_for",
    "decision_for",
    "initial_state",
    "model_fit_batch",
    "parse_device",
    "split_micro_batches",
    "step",
]
