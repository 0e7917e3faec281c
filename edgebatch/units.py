"""Byte sizes as people write them, and back."""

from __future__ import annotations

import re

from edgebatch.errors import UsageError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size_bytes(text: str | int) -> int:
    """Parse `1.5GiB`, `512MiB`, `2GB`, `2G` or a plain byte count into bytes.

    Decimal units (kB, MB, GB) are powers of 1000; binary units (KiB, MiB, GiB) powers of 1024.
    """
    if isinstance(text, bool):
        raise UsageError(f"memory size must be a string like '1.5GiB' or a byte count, got {text!r}")
    if isinstance(text, int):
        if text <= 0:
            raise UsageError(f"memory size must be positive, got {text!r}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise UsageError(f"cannot read memory size {text!r}: write it like 1.5GiB, 512MiB, 2GB or 1073741824")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise UsageError(
            f"unknown unit {unit!r} in memory size {text!r}: use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB"
        )
    size_bytes = int(float(number) * factor)
    if size_bytes <= 0:
        raise UsageError(f"memory size must be positive, got {text!r}")
    return size_bytes


def format_bytes(size_bytes: int | float | None) -> str:
    """Format bytes in binary units for people: 1610612736 -> '1.50 GiB'."""
    if size_bytes is None:
        return "-"
    value = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
