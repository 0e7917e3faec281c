"""TensorFlow's inter-op threads: the setting a profile's ceilings were measured with.

With its own inter-op pool (one thread per core), TensorFlow runs a step's independent ops side by
side in an order that changes from step to step, and a process's resident peak follows the worst
overlap it has met so far: it climbs in jumps for up to 30 steps and differs between processes by
several percent at one batch. With one inter-op thread the ops run one after another and the peak
is the same in every step and process; lower for some models, higher for others
(docs/probe-evidence.md, "Bumps", measured by tests/support/op_schedule_check.py). `edgebatch probe`
runs its trials with one inter-op thread unless told otherwise (`--inter-op-threads`) and records
the setting in the profile (`search.inter_op_threads`); its ceilings hold for training run with
the same setting: call `edgebatch.set_inter_op_threads(1)` before building the model or running
any TensorFlow op (or start the process with TF_NUM_INTEROP_THREADS=1). TensorFlow fixes its
thread pools when it starts, so a later call cannot change them: it raises a one-line UsageError.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from edgebatch.errors import UsageError

INTER_OP_ENV = "TF_NUM_INTEROP_THREADS"
# What a profile that does not record the setting was measured with: written before it existed,
# by workers running TensorFlow's own pool.
UNRECORDED_INTER_OP_THREADS = 0


def recorded_inter_op_threads(search: Mapping[str, Any] | None) -> int:
    """The inter-op threads a profile's `search` settings say it was probed with (0: TensorFlow's own pool)."""
    return (search or {}).get("inter_op_threads", UNRECORDED_INTER_OP_THREADS)


def checked_inter_op_threads(threads: object, name: str = "inter-op threads") -> int:
    """`threads` when it is a whole number >= 0, else a one-line UsageError naming `name`."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise UsageError(f"{name} must be a whole number >= 0 (0: TensorFlow's own pool), got {threads!r}")
    return threads


def set_inter_op_threads(threads: int = 1) -> None:
    """Run TensorFlow's independent ops on `threads` inter-op threads (0: TensorFlow's own pool).

    Call it before TensorFlow runs anything in this process, so training runs as the probe's
    workers measured (their default is one thread).

    Args:
        threads: inter-op threads, >= 0 (0: TensorFlow's own pool, one per core).

    Raises:
        UsageError: a bad `threads`, or TensorFlow already started with another setting.
    """
    threads = checked_inter_op_threads(threads)
    import tensorflow as tf

    if inter_op_threads_in_effect() == threads:
        return
    try:
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        raise UsageError(
            f"TensorFlow has already started with {_describe(inter_op_threads_in_effect())}: call "
            f"edgebatch.set_inter_op_threads({threads}) before building a model or running any TensorFlow op, "
            f"or start the process with {INTER_OP_ENV}={threads}"
        ) from None


def inter_op_threads_in_effect() -> int:
    """The inter-op threads this process's TensorFlow runs (or will run) with; 0: TensorFlow's own pool.

    tf.config's setting when one was made, else the TF_NUM_INTEROP_THREADS variable TensorFlow reads
    when it starts.
    """
    import tensorflow as tf

    configured = tf.config.threading.get_inter_op_parallelism_threads()
    if configured:
        return configured
    try:
        return max(0, int(os.environ.get(INTER_OP_ENV, "0")))
    except ValueError:
        return 0


def mismatch(profile_threads: int, running_threads: int) -> str | None:
    """One line when ceilings measured with `profile_threads` are applied in a process running with
    `running_threads`; None when they agree. Pure."""
    if profile_threads == running_threads:
        return None
    return (
        f"the profile's ceilings were measured with {_describe(profile_threads)} and this process runs "
        f"{_describe(running_threads)}: call edgebatch.set_inter_op_threads({profile_threads}) before building "
        f"the model, or the peaks may differ from the profile's (docs/probe-evidence.md, \"Bumps\")"
    )


def _describe(threads: int) -> str:
    return "TensorFlow's own inter-op pool" if threads == 0 else f"{threads} inter-op thread{'s' if threads > 1 else ''}"


def warn_on_mismatch(profile: Any, stacklevel: int = 3) -> str | None:
    """Warn (one line, returned too) when this process's TensorFlow runs another inter-op setting
    than `profile` (duck-typed DeviceProfile) was measured with. Only once TensorFlow is imported:
    before that, nothing has fixed the setting yet."""
    search = getattr(profile, "search", None)
    if not isinstance(search, Mapping) or "tensorflow" not in sys.modules:
        return None
    line = mismatch(recorded_inter_op_threads(search), inter_op_threads_in_effect())
    if line is not None:
        warnings.warn(line, stacklevel=stacklevel)
    return line
