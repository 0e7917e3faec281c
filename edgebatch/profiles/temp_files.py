"""Temporary profile files: their names, and sweeping those a killed writer left behind.

A writer names its temporary file `.<target>.<writer>.<pid>.<random>.tmp`, so a later writer that
sees the same process ids (writer_label) can tell one stranded by a killed process from one being
written (store.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import socket
import uuid
from pathlib import Path

TEMP_NAME_RE = re.compile(r"^\.(?P<target>.+)\.(?P<writer>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")


@functools.cache
def writer_label() -> str:
    """`<hostname>-<8 hex>`: the hex digests this kernel's boot id and this process's pid namespace.

    Two writers with the same label see the same process ids, so one can tell whether the other's
    pid still runs. Edge devices often share a hostname (every `raspberrypi`), and containers on one
    host share a kernel but not pids; the boot id and namespace keep those apart. Where neither can
    be read (not Linux), the label is the hostname alone.
    """
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"
    identity = []
    with contextlib.suppress(OSError):
        identity.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        identity.append(str(os.stat("/proc/self/ns/pid").st_ino))
    if not identity:
        return host
    return f"{host}-{hashlib.sha256('/'.join(identity).encode()).hexdigest()[:8]}"


def temp_name(target_name: str) -> str:
    return f".{target_name}.{writer_label()}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"


def is_stranded_temp_file(name: str) -> bool:
    """True for a temporary profile file written by a process that no longer exists.

    Only files with this process's writer label count (same kernel boot, same pid namespace): of
    any other the pid says nothing here, and it may still be being written.
    """
    match = TEMP_NAME_RE.match(name)
    if match is None or match["writer"] != writer_label():
        return False
    return not process_exists(int(match["pid"]))


def process_exists(pid: int) -> bool:
    """Whether `pid` runs on this host; when that cannot be told (not POSIX), assume it does."""
    if pid == os.getpid() or os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, as another user
        return True
    return True


def remove_stranded_local_temp_files(directory: Path) -> None:
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if is_stranded_temp_file(name):
            try:
                os.unlink(directory / name)
            except OSError:
                pass
