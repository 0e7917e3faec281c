"""The probe: find the largest safe training batch of a model on a device.

search.py (pure strategy), memory_fit.py and summary.py (pure numbers), trial.py (TensorFlow
steps), worker.py (trials in worker processes), budget.py (device and budget), api.py (the recipe).
Importing this package does not import TensorFlow.
"""

from edgebatch.probe.api import ProbeRequest, probe, run_probe

__all__ = ["ProbeRequest", "probe", "run_probe"]
