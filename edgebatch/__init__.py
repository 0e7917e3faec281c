"""edgebatch: make TensorFlow training fit the device it runs on.

    probe(...)          find a device's safe batch ceiling for a model; cached as a DeviceProfile
    load_profile(...)   read a cached profile
    cached_profile(...) the profile cached for a model on this device, or None
    Governor            keep micro-batches under that ceiling and live memory pressure
    fit(...)            governed training with gradient accumulation and OOM recovery
    Checkpointing, Sequences, Logs   fit's records for checkpoints, variable-length data and logs
    supervise(argv)     run training in a child process; restart it from its checkpoint when killed
    set_inter_op_threads(n)  run TensorFlow with the inter-op threads a profile was measured with (1 by default)

Importing edgebatch imports neither TensorFlow nor tensorflow-model-optimization; the pieces that
need TensorFlow import it when called.
"""

from edgebatch.errors import EdgebatchError, ProbeError, ProfileError, TrainingError, UsageError
from edgebatch.governor import Decision, Governor, GovernorConfig, Observation, PressureReader
from edgebatch.probing import cached_profile, probe
from edgebatch.profiles import DeviceProfile, MemoryModel, Trial, load_profile, save_profile
from edgebatch.settings.threads import set_inter_op_threads
from edgebatch.training import Checkpointing, FitReport, Logs, Sequences, fit, inject_oom, supervise

__version__ = "0.1.0"

__all__ = [
    "Checkpointing",
    "Decision",
    "DeviceProfile",
    "FitReport",
    "Governor",
    "GovernorConfig",
    "Logs",
    "Observation",
    "PressureReader",
    "Sequences",
    "fit",
    "inject_oom",
    "EdgebatchError",
    "MemoryModel",
    "ProbeError",
    "ProfileError",
    "TrainingError",
    "Trial",
    "cached_profile",
    "UsageError",
    "load_profile",
    "probe",
    "save_profile",
    "set_inter_op_threads",
    "supervise",
]
