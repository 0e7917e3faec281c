"""The probe: find the largest safe training batch of a model on a device.

outcomes.py (shared records), search.py (pure strategy; baselines.py, the peers' finders, for
benchmarks), memory_fit.py and summary.py (pure numbers), margins.py (how far under the budget a
peak must stay), reuse.py (when a cached profile answers), trial.py (TensorFlow steps), worker.py
(trials in worker processes), reaping.py (killing them), forkserver.py and fresh_workers.py (fresh
workers), run_search.py (the search run in workers), budget.py (device and Budget), per_length.py
and token_fit.py (a probe per sequence length), api.py (the recipe, over probe_run.ProbeRun),
build_profile.py (its profile), lookup.py (a model's cached profile, for training code).
Importing this package does not import TensorFlow.

The package is `edgebatch.probing` so that `edgebatch.probe`, the function, does not shadow it
(`import edgebatch.probe.search` used to fail once `edgebatch` had bound the name to the function).
"""

from edgebatch.probing.api import ProbeRequest, probe, run_probe
from edgebatch.probing.lookup import cached_profile

__all__ = ["ProbeRequest", "cached_profile", "probe", "run_probe"]
