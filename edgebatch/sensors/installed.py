"""Installed memory: the RAM the kernel manages in hot-plug blocks, not what it has left after its own reservations.

/proc/meminfo's MemTotal is the installed size minus the kernel's reservations, and those move by
tens of MiB between boots and kernel versions. The online memory blocks under
/sys/devices/system/memory add up to the installed size itself (24.0 GiB on this machine kind,
where MemTotal reads 23.54 GiB): a figure that stays put, so a device fingerprint built on it
does too. Containers and some kernels do not expose the blocks: callers fall back to MemTotal.
"""

from __future__ import annotations

from pathlib import Path


def installed_memory_bytes(sys_root: str | Path = "/sys") -> int | None:
    """Bytes in online memory blocks, or None when the kernel does not expose them (or they read wrong)."""
    memory = Path(sys_root) / "devices" / "system" / "memory"
    try:
        block_bytes = int((memory / "block_size_bytes").read_text().strip(), 16)
        blocks = [entry for entry in memory.iterdir() if entry.name.startswith("memory") and entry.name[6:].isdigit()]
        online = sum(1 for block in blocks if _is_online(block))
    except (OSError, ValueError):
        return None
    if block_bytes <= 0 or online == 0:
        return None
    return online * block_bytes


def _is_online(block: Path) -> bool:
    try:
        return (block / "online").read_text().strip() == "1"
    except OSError:
        # Some kernels leave out `online` for blocks that cannot go offline: they are online.
        return True
