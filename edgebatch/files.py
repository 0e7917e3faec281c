"""Whole-file writes a reader never sees half of, and that leave nothing behind when cut short. No TensorFlow here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edgebatch.errors import EdgebatchError


def write_atomically(path: Path, text: str, *, fsync: bool = True) -> Path:
    """Write `text` to `path` through a temporary file in the same directory and one rename.

    On any failure (including Ctrl-C, or SIGTERM under cli_errors.sigterm_raises) the temporary file
    is removed and an existing `path` is left as it was. `fsync=False` skips the flush to disk, for a
    file that must outlive its process, not the machine. Raises EdgebatchError with the OS's reason
    when the directory is missing or not writable.
    """
    path = Path(path).expanduser()
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise EdgebatchError(f"cannot write {path}: {error.strerror or error}") from error
    replaced = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
        replaced = True
    except OSError as error:
        raise EdgebatchError(f"cannot write {path}: {error.strerror or error}") from error
    finally:
        if not replaced:
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass
    return path
