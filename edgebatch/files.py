"""Whole-file writes a reader never sees half of, and that leave nothing behind when cut short. No TensorFlow here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edgebatch.errors import EdgebatchError


def write_atomically(path: Path, text: str, *, fsync: bool = True, temp_prefix: str | None = None) -> Path:
    """Write `text` to `path` through a temporary file in the same directory and one rename.

    On any failure (including Ctrl-C, or SIGTERM under cli.errors.sigterm_raises) the temporary file
    is removed and an existing `path` is left as it was. An existing file keeps its mode; a new one
    is 0644 (mkstemp would leave it 0600). `fsync` flushes the file and then the rename to disk;
    False is for a file that must outlive its process, not the machine. `temp_prefix` names the
    temporary file (default `.<name>.`; the profile store puts its host and pid there, so that a
    stranded one can be swept). Raises EdgebatchError with the OS's reason, the OSError as its
    cause, when the directory is missing or not writable.
    """
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        mode = 0o644
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix or f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise EdgebatchError(f"cannot write {path}: {error.strerror or error}") from error
    replaced = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
        replaced = True
        if fsync:
            fsync_directory(path.parent)
    except OSError as error:
        raise EdgebatchError(f"cannot write {path}: {error.strerror or error}") from error
    finally:
        if not replaced:
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass
    return path


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable; some platforms and filesystems cannot, which is not an error."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
