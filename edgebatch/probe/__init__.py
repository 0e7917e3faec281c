"""The probe: find the largest safe training batch of a model on a device.

search.py (pure strategy), memory_fit.py and summary.py (pure numbers), trial.py (TensorFlow
steps), worker.py (trials in worker processes), budget.py (device and budget), api.py (the recipe),
lookup.py (a model's cached profile, for training code).
Importing this package does not import TensorFlow.
"""

from edgebatch.probe.api import ProbeRequest, probe, run_probe
from edgebatch.probe.lookup import cached_profile

__all__ = ["ProbeRequest", "cached_profile", "probe", "run_probe"]
