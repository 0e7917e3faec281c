"""The probe: find the largest safe training batch of a model on a device.

Pure: outcomes.py (shared records), search.py (the search; the peers' finders are benchmark
baselines, tools/bench/finders.py), strategy_option.py (the deprecated option), memory_fit.py,
summary.py, margins.py, eta.py (time left), budget_answer.py (a profile's answer at a smaller
budget), reuse.py (when a cached profile answers). Side effects:
trial.py (TensorFlow steps), worker.py and worker_child.py (both sides of a worker process),
reaping.py, forkserver.py, fresh_workers.py and spares.py (fresh workers), squeeze.py (room
taken from outside), run_search.py and readings.py (the search run in workers), budget.py,
per_length.py and token_fit.py (per sequence length), api.py (the recipe over probe_run.ProbeRun),
build_profile.py, lookup.py (a model's cached profile). Importing it does not import TensorFlow.

The package is `edgebatch.probing` so that `edgebatch.probe`, the function, does not shadow it.
"""

from edgebatch.probing.api import ProbeRequest, probe, run_probe
from edgebatch.probing.lookup import cached_profile

__all__ = ["ProbeRequest", "cached_profile", "probe", "run_probe"]
