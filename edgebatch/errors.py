"""The library's own errors.

Every error a user can cause or meet is one of these, so the CLI can turn them into a one-line
message with the right exit code (2 for usage, 1 for runtime) and never a traceback.
"""


class EdgebatchError(Exception):
    """Base of every edgebatch error. `exit_code` is what the CLI exits with."""

    exit_code = 1


class UsageError(EdgebatchError):
    """The caller asked for something malformed (a size, a model spec, a flag combination)."""

    exit_code = 2


class ProfileError(EdgebatchError):
    """A device profile on disk is corrupt, of an unknown schema version, or missing."""


class ProbeError(EdgebatchError):
    """A probe could not finish: the model failed for a reason other than memory, or no batch fits."""


class TrainingError(EdgebatchError):
    """Governed training could not continue (for example, a micro-batch of 1 still runs out of memory)."""
