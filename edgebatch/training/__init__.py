"""Governed training: micro-batches sized by a Governor, exact gradient accumulation, OOM recovery.

- `fit(model, dataset, loss=..., optimizer=..., effective_batch=...)`: a custom loop (loop.py builds it, governed_loop.py runs it) with
  OOM retry in place, checkpoint/resume, TensorBoard and JSONL logs; returns a `FitReport`. Its
  rarer settings are records (options.py): `Checkpointing`, `Sequences`, `Logs`.
  `LengthCeilings` (length_ceilings.py): micro-batch ceilings by sequence length, for
  `Sequences(length_ceilings=...)` (from a probe per length's profile, whose step times give the
  `PieceCost` that says where to cut an update, piece_cost.py); `length_window_examples`
  cuts updates from length-sorted windows of the stream (length_window.py).
- `inject_oom([2, 5])` / env `EDGEBATCH_INJECT_OOM=2,5`: make chosen micro-batches fail (tests).
- `supervise(["python", "train.py"], checkpoint_dir=...)` (supervisor.py): run training in a child and
  restart it from its last checkpoint when it is killed (SIGKILL, SIGABRT); `edgebatch supervise`.
- `enable_micro_batching(model, governor)` and `GovernorCallback`/`TfKerasGovernorCallback`
  (keras_integration.py): the same governor for `model.fit` users. That module imports Keras, so
  it is loaded only when one of its names is asked for.

Importing this package does not import TensorFlow.
"""

from typing import Any

from edgebatch.training.injection import ENV_INJECT_OOM, inject_oom, parse_oom_indices
from edgebatch.training.length_ceilings import LengthCeilings
from edgebatch.training.loop import fit
from edgebatch.training.options import Checkpointing, Logs, Sequences
from edgebatch.training.piece_cost import PieceCost
from edgebatch.training.records import FitReport, OomEvent, Progress, UpdateRecord
from edgebatch.training.restart_policy import SupervisorReport
from edgebatch.training.supervisor import supervise

__all__ = [
    "Checkpointing",
    "ENV_INJECT_OOM",
    "FitReport",
    "GovernorCallback",
    "LengthCeilings",
    "Logs",
    "MicroBatchController",
    "OomEvent",
    "PieceCost",
    "Progress",
    "Sequences",
    "TfKerasGovernorCallback",
    "UpdateRecord",
    "enable_micro_batching",
    "fit",
    "inject_oom",
    "parse_oom_indices",
    "SupervisorReport",
    "supervise",
]

_KERAS_NAMES = ("GovernorCallback", "MicroBatchController", "TfKerasGovernorCallback", "enable_micro_batching")


def __getattr__(name: str) -> Any:
    if name in _KERAS_NAMES:
        from edgebatch.training import keras_integration

        return getattr(keras_integration, name)
    raise AttributeError(f"module 'edgebatch.training' has no attribute {name!r}")
