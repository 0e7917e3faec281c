"""Host memory: RAM, this process's RSS, the cgroup limit and memory pressure (PSI).

Everything except `read_host_memory` parses plain files under `proc_root` / `cgroup_root` (both
parameters, so tests feed fake trees); psutil is imported only inside `read_host_memory`.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from edgebatch.sensors.cgroup import (
    CgroupMemory,
    parse_limit_v1,
    parse_limit_v2,
    parse_memory_stat,
    parse_proc_cgroup,
    read_cgroup_memory,
)

__all__ = [
    "CgroupMemory",
    "HostMemory",
    "Psi",
    "parse_limit_v1",
    "parse_limit_v2",
    "parse_memory_stat",
    "parse_proc_cgroup",
    "parse_proc_status",
    "parse_psi",
    "process_peak_rss_bytes",
    "process_rss_bytes",
    "process_swap_bytes",
    "process_virtual_bytes",
    "read_cgroup_memory",
    "read_host_memory",
    "read_psi",
    "reset_process_peak_rss",
]

_REAL_PROC = Path("/proc")


@dataclass(frozen=True)
class Psi:
    """Memory pressure stall information, in percent of wall time over the last 10 s / 60 s.

    `some`: at least one task stalled on memory; `full`: all non-idle tasks stalled at once (None
    when the kernel does not report a `full` line).
    """

    some_avg10: float
    some_avg60: float
    full_avg10: float | None
    full_avg60: float | None


def parse_psi(text: str) -> Psi:
    """Parse `/proc/pressure/memory`; raise ValueError quoting the text when it is not PSI."""
    averages: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        kind = fields[0]
        if kind not in ("some", "full"):
            raise ValueError(f"cannot read PSI text {_quote(text)}: unexpected line {line!r}")
        values: dict[str, float] = {}
        for field in fields[1:]:
            key, sep, number = field.partition("=")
            if not sep:
                raise ValueError(f"cannot read PSI text {_quote(text)}: field {field!r} is not key=value")
            try:
                values[key] = float(number)
            except ValueError:
                raise ValueError(f"cannot read PSI text {_quote(text)}: {field!r} is not a number") from None
        if "avg10" not in values or "avg60" not in values:
            raise ValueError(f"cannot read PSI text {_quote(text)}: line {line!r} lacks avg10/avg60")
        averages[kind] = values
    if "some" not in averages:
        raise ValueError(f"cannot read PSI text {_quote(text)}: no 'some' line")
    full = averages.get("full")
    return Psi(
        some_avg10=averages["some"]["avg10"],
        some_avg60=averages["some"]["avg60"],
        full_avg10=None if full is None else full["avg10"],
        full_avg60=None if full is None else full["avg60"],
    )


def read_psi(proc_root: str | Path = "/proc") -> Psi | None:
    """Memory PSI of this machine (or container); None where the kernel has none or it is disabled."""
    path = Path(proc_root) / "pressure" / "memory"
    try:
        text = path.read_text()
    except OSError:
        # Missing on kernels before 4.20; EOPNOTSUPP when booted with psi=0.
        return None
    try:
        return parse_psi(text)
    except ValueError as exc:
        warnings.warn(f"edgebatch: ignoring {path}: {exc}", RuntimeWarning, stacklevel=2)
        return None


@dataclass(frozen=True)
class HostMemory:
    """One reading of host memory, as the process that took it sees it."""

    total_bytes: int
    available_bytes: int
    process_rss_bytes: int
    cgroup: CgroupMemory | None
    psi: Psi | None

    def __post_init__(self) -> None:
        for name in ("total_bytes", "available_bytes", "process_rss_bytes"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")

    @property
    def _cgroup_limit_bytes(self) -> int | None:
        return None if self.cgroup is None else self.cgroup.limit_bytes

    @property
    def _cgroup_used_bytes(self) -> int:
        # Working set (usage less reclaimable page cache) when the cgroup reported usage; else this
        # process's RSS, a lower bound on what the cgroup holds.
        working_set = None if self.cgroup is None else self.cgroup.working_set_bytes
        return self.process_rss_bytes if working_set is None else working_set

    @property
    def limit_bytes(self) -> int:
        """The smaller of total RAM and the cgroup limit."""
        cgroup_limit = self._cgroup_limit_bytes
        return self.total_bytes if cgroup_limit is None else min(self.total_bytes, cgroup_limit)

    @property
    def available_to_process_bytes(self) -> int:
        """min(available RAM, cgroup limit - cgroup usage), never below 0."""
        cgroup_limit = self._cgroup_limit_bytes
        if cgroup_limit is None:
            return self.available_bytes
        return max(0, min(self.available_bytes, cgroup_limit - self._cgroup_used_bytes))

    @property
    def used_fraction(self) -> float:
        """The worse of RAM in use / total RAM and cgroup usage / cgroup limit (0.0 to 1.0+)."""
        fractions = [0.0]
        if self.total_bytes > 0:
            fractions.append((self.total_bytes - self.available_bytes) / self.total_bytes)
        cgroup_limit = self._cgroup_limit_bytes
        if cgroup_limit:
            fractions.append(self._cgroup_used_bytes / cgroup_limit)
        return max(fractions)


def read_host_memory(proc_root: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup") -> HostMemory:
    """Read RAM and this process's RSS (psutil), the cgroup limit and PSI (files) now."""
    import psutil

    virtual = psutil.virtual_memory()
    return HostMemory(
        total_bytes=int(virtual.total),
        available_bytes=int(virtual.available),
        process_rss_bytes=int(psutil.Process().memory_info().rss),
        cgroup=read_cgroup_memory(proc_root, cgroup_root),
        psi=read_psi(proc_root),
    )


def parse_proc_status(text: str) -> dict[str, int]:
    """The `Vm*`/`Rss*` lines of `/proc/<pid>/status` as bytes: {'VmHWM': 2065408, ...}."""
    sizes: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) == 2 and fields[1] == "kB" and fields[0].isdigit():
            sizes[key.strip()] = int(fields[0]) * 1024
    return sizes


def process_peak_rss_bytes(proc_root: str | Path = "/proc") -> int:
    """This process's peak resident set (VmHWM); resettable with `reset_process_peak_rss`."""
    return _status_bytes(proc_root, "VmHWM")


def process_rss_bytes(proc_root: str | Path = "/proc") -> int:
    """This process's resident set now (VmRSS)."""
    return _status_bytes(proc_root, "VmRSS")


def process_virtual_bytes(proc_root: str | Path = "/proc") -> int:
    """This process's address space now (VmSize): what RLIMIT_AS caps."""
    return _status_bytes(proc_root, "VmSize")


def process_swap_bytes(proc_root: str | Path = "/proc", pid: int | str = "self") -> int | None:
    """How much of process `pid` is swapped out now (VmSwap); None where that cannot be read.

    VmHWM and VmRSS count resident pages only: a process whose pages went to swap reads smaller
    than it is. None on kernels without the VmSwap line, without /proc, or when `pid` is gone.
    """
    try:
        text = (Path(proc_root) / str(pid) / "status").read_text()
    except OSError:
        return None
    return parse_proc_status(text).get("VmSwap")


def reset_process_peak_rss(proc_root: str | Path = "/proc") -> bool:
    """Reset VmHWM to the current RSS (writes 5 to clear_refs); False where that is not permitted.

    ru_maxrss never resets within a process; clear_refs is the only way
    (docs/tensorflow-memory.md#resident-memory-never-shrinks).
    """
    path = Path(proc_root) / "self" / "clear_refs"
    try:
        # No O_CREAT: on a fake root without the file, report failure instead of creating one.
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, b"5")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _status_bytes(proc_root: str | Path, key: str) -> int:
    path = Path(proc_root) / "self" / "status"
    try:
        text = path.read_text()
    except OSError:
        if Path(proc_root) == _REAL_PROC:
            return _fallback_bytes(key)
        raise
    sizes = parse_proc_status(text)
    if key not in sizes:
        if Path(proc_root) == _REAL_PROC:
            return _fallback_bytes(key)
        raise ValueError(f"{path} has no {key} line; it holds {sorted(sizes)!r}")
    return sizes[key]


def _fallback_bytes(key: str) -> int:
    """Where /proc has no status file (macOS, some sandboxes): ask the OS another way."""
    if key == "VmHWM":
        import resource

        max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is in KiB on Linux and in bytes on macOS.
        return int(max_rss) if sys.platform == "darwin" else int(max_rss) * 1024
    import psutil

    info = psutil.Process().memory_info()
    return int(info.rss if key == "VmRSS" else info.vms)


def _quote(text: str, limit_chars: int = 200) -> str:
    return repr(text if len(text) <= limit_chars else text[:limit_chars] + "...")
