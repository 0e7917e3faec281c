"""How a training process that was killed tells its successor which micro-batch was running.

A SIGKILL from the OOM killer or a SIGABRT from oneDNN leaves no chance to report anything, so
`fit` records the micro-batch size before it runs it: whenever the size changes, it rewrites a tiny
file in its `checkpoint_dir` (`RunningMarker`). The supervisor (supervisor.py) deletes that file
before it starts a child, reads it after the child died by a signal, and starts the next child with
`EDGEBATCH_HARD_FAILURE_MICRO_BATCH=<size>`; `fit` in that child takes the value once
(`take_hard_failure_micro_batch`) and reports it to the governor as an out-of-memory failure
(`Governor.on_oom`), so the governor shrinks and remembers the size that killed the process.

The recorded size is the largest piece of the current split (the governor's size, or the whole
update when it is smaller), not a short remainder piece: the size that sets the memory peak.
The file is replaced atomically (files.write_atomically), so a reader never sees half of it; it is not
fsynced, since it has to survive the death of the process, not of the machine. No TensorFlow here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from edgebatch.errors import EdgebatchError, TrainingError, UsageError
from edgebatch.files import write_atomically

__all__ = [
    "ENV_HARD_FAILURE_MICRO_BATCH",
    "MARKER_FILE",
    "RunningMarker",
    "clear_running_marker",
    "read_running_micro_batch",
    "take_hard_failure_micro_batch",
]

ENV_HARD_FAILURE_MICRO_BATCH = "EDGEBATCH_HARD_FAILURE_MICRO_BATCH"
MARKER_FILE = "edgebatch_running_micro_batch.json"


class RunningMarker:
    """Records in `directory` the micro-batch size about to run; writes only when it changes."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = Path(directory) / MARKER_FILE
        self._written: int | None = None

    def note(self, micro_batch: int) -> None:
        """Record `micro_batch` as the size running from now on (one small file write per change)."""
        if micro_batch == self._written:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps({"micro_batch": int(micro_batch), "pid": os.getpid()}), fsync=False)
        except (OSError, EdgebatchError) as exc:
            raise TrainingError(f"cannot write the running micro-batch marker {str(self.path)!r}: {exc}") from exc
        self._written = micro_batch


def read_running_micro_batch(directory: str | os.PathLike) -> int | None:
    """The micro-batch size recorded in `directory`, or None when there is no readable record."""
    path = Path(directory) / MARKER_FILE
    try:
        value = json.loads(path.read_text()).get("micro_batch")
    except (OSError, ValueError, AttributeError):
        # Missing (the child died before fit ran a micro-batch) or not ours: nothing to tell.
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def clear_running_marker(directory: str | os.PathLike) -> None:
    """Delete the record, so a later read cannot return a size from an earlier process."""
    try:
        (Path(directory) / MARKER_FILE).unlink()
    except FileNotFoundError:
        pass


def take_hard_failure_micro_batch() -> int | None:
    """The size in `EDGEBATCH_HARD_FAILURE_MICRO_BATCH`, removed from the environment so a process
    reports it to its governor once (a second `fit` call in the same process sees None).

    Raises UsageError quoting the value when it is not an integer >= 1.
    """
    text = os.environ.pop(ENV_HARD_FAILURE_MICRO_BATCH, None)
    if text is None or not text.strip():
        return None
    stripped = text.strip()
    if not (stripped.isascii() and stripped.isdigit()) or int(stripped) < 1:
        raise UsageError(f"{ENV_HARD_FAILURE_MICRO_BATCH} must be a micro-batch size (an integer >= 1), got {text!r}")
    return int(stripped)
